// Loader threads (data.workers, data.prefetch): the same batches as the trainer's thread, for any number of
// threads, across epochs, resumes, early stops, signals and errors.
#include "core/error.h"
#include "data/batch_stager.h"
#include "data/dataset.h"
#include "helpers.h"
#include "ops/gather.h"

#include <fmt/format.h>
#include <signal.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;
namespace fs = std::filesystem;

namespace {

// Every batch of `epochs` epochs as bytes (x then y), as `take` hands them over; the epoch starts where `start` says.
using Batches = std::vector<std::string>;
template <class Take>
Batches epochs_of(Loader& loader, int64_t epochs, const Dataset& ds, Take take) {
  Tensor x = Tensor::empty(ds.input_shape().batched(loader.batch_size()), DType::f32);
  Tensor y = Tensor::empty(ds.target_shape().batched(loader.batch_size()), ds.target_dtype());
  Batches out;
  for (int64_t e = 0; e < epochs; ++e) {
    loader.start_epoch(e);
    for (int64_t n; (n = take(loader, x, y)) > 0;) out.push_back(batch_bytes(x, y, n));
  }
  return out;
}

const AugmentConfig kAugment{.crop_padding = 2, .hflip = true};

// A small augmented image run: 23 micro-batches of 8 per epoch (the last one of 4 samples), two epochs.
const char* const kAugmented = R"(name: workers
seed: 7
device: cpu
data:
  format: synthetic
  samples: 180
  test_samples: 40
  input_shape: [1, 6, 6]
  targets: {classes: 3}
  batch_size: 8
  augment: {random_crop: {padding: 1}, hflip: true}
model:
  layers:
    - {type: conv2d, out_channels: 3, kernel_size: 3, padding: 1}
    - relu
    - flatten
    - {type: linear, out_features: 3}
optimizer: {type: adam, lr: 0.01}
train: {epochs: 2, log_every: 1, eval_every: 10}
)";

// kAugmented without its augmentation: what data.device_resident may hold on a device.
std::string plain_config() {
  std::string c = kAugmented;
  const std::string augment = "  augment: {random_crop: {padding: 1}, hflip: true}\n";
  c.erase(c.find(augment), augment.size());
  return c;
}

// The epoch's order as the i32 tensor a device-resident stager uploads.
Tensor order_tensor(const std::vector<int64_t>& order) {
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(order.size())}, DType::i32);
  for (size_t i = 0; i < order.size(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(order[i]);
  return t;
}

}  // namespace

TEST_CASE("loader threads hand over the trainer thread's batches, for any number of threads and slots", "[data][cpu]") {
  const Dataset ds = synthetic_images(23);  // batches of 5: the last of each epoch holds 3
  Loader ref(ds, 5, /*shuffle=*/true, 9, kAugment);
  const Batches want = epochs_of(ref, 3, ds, [](Loader& l, Tensor& x, Tensor& y) { return l.next(x, y); });
  REQUIRE(want.size() == 15);
  CHECK(want[0] != want[5]);  // epochs differ (order and augmentation), so a batch handed over twice would show
  for (int workers : {1, 3})
    for (int prefetch : {1, 2, 4}) {
      DYNAMIC_SECTION(workers << " threads, " << prefetch << " slots") {
        Loader loader(ds, 5, true, 9, kAugment);
        BatchStager stager(ds, 5, Device::cpu(), {.workers = workers, .prefetch = prefetch});
        const Batches got =
            epochs_of(loader, 3, ds, [&](Loader& l, Tensor& x, Tensor& y) { return stager.next(l, x, y); });
        CHECK(got == want);
      }
    }
}

TEST_CASE("loader threads restart where the loader is: a resume mid-epoch, a repeated epoch", "[data][cpu]") {
  const Dataset ds = synthetic_images(23);
  Loader ref(ds, 5, true, 9, kAugment);
  const Batches want = epochs_of(ref, 3, ds, [](Loader& l, Tensor& x, Tensor& y) { return l.next(x, y); });
  Loader loader(ds, 5, true, 9, kAugment);
  BatchStager stager(ds, 5, Device::cpu(), {.workers = 2, .prefetch = 3});
  Tensor x = Tensor::empty(ds.input_shape().batched(5), DType::f32);
  Tensor y = Tensor::empty(ds.target_shape().batched(5), ds.target_dtype());
  auto next = [&] {
    const int64_t n = stager.next(loader, x, y);
    std::string b(static_cast<const char*>(x.raw()), x.narrow0(n).bytes());
    return b.append(static_cast<const char*>(y.raw()), y.narrow0(n).bytes());
  };
  loader.start_epoch(1, 10);  // resumed at the third batch of epoch 1
  CHECK(next() == want[7]);
  CHECK(next() == want[8]);
  loader.start_epoch(0);  // back to an epoch the threads had not prepared (a rollback)
  CHECK(next() == want[0]);
  loader.start_epoch(2, 20);  // the last, partial batch
  CHECK(next() == want[14]);
  CHECK(stager.next(loader, x, y) == 0);
  CHECK(stager.next(loader, x, y) == 0);  // the end stays the end
}

TEST_CASE("data.workers 0, 1 and 3 train to bit-identical losses and weights", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", kAugmented);
  for (int workers : {0, 1, 3}) {
    const auto r = run_gputrain(fmt::format("train {} --quiet --threads 2 --set data.workers={} --out {}/w{}",
                                            dir / "c.yaml", workers, dir.path(), workers));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  CHECK(lines_of(read_text(dir / "w0/metrics.jsonl")).size() > 40);
  for (const char* run : {"w1", "w3"}) {
    INFO(run);
    CHECK(read_text(dir / run + "/model.safetensors") == read_text(dir / "w0/model.safetensors"));
    CHECK(metrics_without_timing(dir / run) == metrics_without_timing(dir / "w0"));
  }
  CHECK_THAT(read_text(dir / "w3/config.resolved.yaml"),
             Catch::Contains("workers: 3") && Catch::Contains("prefetch: 2"));
}

TEST_CASE("with data.workers a run resumed mid-epoch ends bit-identical to an uninterrupted one", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", std::string(kAugmented) + "checkpoint: {every_steps: 7, keep: 100}\n");
  const std::string common = "train " + (dir / "c.yaml") + " --threads 2 --set data.workers=2 ";
  const auto full = run_gputrain(common + "--quiet --out " + (dir / "full"));
  INFO(full.output);
  REQUIRE(full.exit_code == 0);
  // Step 14 of 23 per epoch: mid-epoch, with batches of the epoch (and none of the next) prepared ahead.
  for (int64_t cut : {14, 28}) {
    DYNAMIC_SECTION("resumed from step " << cut) {
      const std::string run = dir / fmt::format("cut{}", cut);
      fs::copy(dir / "full", run, fs::copy_options::recursive);
      for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
        if (const std::string n = e.path().filename().string();
            n.rfind("step-", 0) == 0 && std::stoll(n.substr(5)) > cut)
          fs::remove_all(e.path());
      fs::remove(run + "/model.safetensors");
      fs::remove(run + "/summary.json");  // cut short there: no summary (a finished run is not resumed)
      const auto r = run_gputrain(common + "--resume auto --out " + run);
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      CHECK_THAT(r.output, Catch::Contains(fmt::format("step-{}: step {}", cut, cut)));
      CHECK(read_text(run + "/model.safetensors") == read_text(dir / "full/model.safetensors"));
      CHECK(metrics_without_timing(run) == metrics_without_timing(dir / "full"));
    }
  }
}

TEST_CASE("a run with loader threads stops at once at a --max-steps below data.prefetch and on SIGTERM", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", kAugmented);
  // The threads fill 8 slots and block on a full ring; the run ends after one step and must join them.
  const auto r =
      run_gputrain("train " + (dir / "c.yaml") +
                   " --quiet --set data.workers=3 --set data.prefetch=8 --max-steps 1 --out " + (dir / "one"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(json_number(read_text(dir / "one/summary.json"), "steps") == 1);

  // SIGTERM: the step under way finishes, a checkpoint is written, exit 75, and the resumed run matches.
  write_text(dir / "long.yaml", std::string(kAugmented) + "checkpoint: {every_steps: 5}\n");
  const std::string common =
      "train " + (dir / "long.yaml") + " --threads 1 --set data.workers=2 --set train.epochs=40 ";
  REQUIRE(run_gputrain(common + "--quiet --out " + (dir / "full")).exit_code == 0);
  const Background b = start_gputrain(common + "--out " + (dir / "run"), dir / "log");
  REQUIRE(wait_for_file(dir / "run/checkpoints/latest", 60));
  kill(b.pid, SIGTERM);
  const int code = wait_exit(b);
  INFO(read_text(dir / "log"));
  REQUIRE(code == 75);
  const auto resumed = run_gputrain(common + "--quiet --resume auto --out " + (dir / "run"));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(read_text(dir / "run/model.safetensors") == read_text(dir / "full/model.safetensors"));
  CHECK(metrics_without_timing(dir / "run") == metrics_without_timing(dir / "full"));
}

TEST_CASE("data.workers, data.prefetch and data.pin_memory out of range are config errors naming the key", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", kAugmented);
  for (const auto& [set, message] : {std::pair{"data.workers=65", "data.workers"},
                                     {"data.workers=-1", "data.workers"},
                                     {"data.prefetch=0", "data.prefetch"},
                                     {"data.pin_memory=maybe", "data.pin_memory"}}) {
    const auto r = run_gputrain("check " + (dir / "c.yaml") + " --set " + set);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(message));
  }
  // On the CPU pin_memory changes nothing; the key is read and written back.
  const auto ok = run_gputrain("train " + (dir / "c.yaml") +
                               " --quiet --max-steps 2 --set data.pin_memory=false --out " + (dir / "run"));
  INFO(ok.output);
  REQUIRE(ok.exit_code == 0);
  CHECK_THAT(read_text(dir / "run/config.resolved.yaml"), Catch::Contains("pin_memory: false"));
}

TEST_CASE("npy inputs are mapped: float32 viewed without a copy, uint8 converted per batch as a read file is",
          "[data][cpu]") {
  TempDir dir;
  std::vector<float> xf(7 * 12);
  std::vector<uint8_t> xu(7 * 12);
  for (size_t i = 0; i < xf.size(); ++i) {
    xf[i] = static_cast<float>(i) * 0.25f - 3.0f;
    xu[i] = static_cast<uint8_t>(i * 37 % 256);
  }
  const std::vector<int64_t> y{0, 1, 2, 0, 1, 2, 0};
  write_npy(dir / "xf.npy", "<f4", "(7, 3, 4)", xf.data(), xf.size() * 4);
  write_npy(dir / "xu.npy", "|u1", "(7, 3, 4)", xu.data(), xu.size());
  write_npy(dir / "y.npy", "<i8", "(7,)", y.data(), y.size() * 8);

  const Dataset f = read_npy_pair(dir / "xf.npy", dir / "y.npy", 1.0f);
  REQUIRE(f.mapped);
  REQUIRE(f.inputs.defined());
  // The tensor's values are the file's bytes in the mapping, not a copy.
  CHECK(static_cast<const uint8_t*>(f.inputs.raw()) == f.mapped->data);
  CHECK(std::memcmp(f.inputs.raw(), xf.data(), xf.size() * 4) == 0);
  CHECK(f.input_shape() == Shape{3, 4});

  const float scale = 1.0f / 255;
  const Dataset u = read_npy_pair(dir / "xu.npy", dir / "y.npy", scale);
  REQUIRE(u.mapped);
  CHECK(!u.inputs.defined());
  CHECK(u.size() == 7);
  Loader loader(u, 4, /*shuffle=*/true, 2);
  loader.start_epoch(0);
  Tensor x = Tensor::empty(Shape{4, 3, 4}, DType::f32), yb = Tensor::empty(Shape{4}, DType::i32);
  REQUIRE(loader.next(x, yb) == 4);
  const std::vector<int64_t>& order = *loader.order();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t k = 0; k < 12; ++k)
      CHECK(x.data<float>()[i * 12 + k] == static_cast<float>(xu[static_cast<size_t>(order[i] * 12 + k)]) * scale);
}

TEST_CASE("an error in a loader thread is rethrown by the take of its batch, after the batches before it",
          "[data][cpu]") {
  // Mapped inputs over memory the test holds, with a NaN the load-time check never saw (a file changed under the
  // run, say): the loader's per-batch check throws it in a thread.
  std::vector<float> xs(40 * 4, 1.0f);
  xs[13 * 4 + 2] = std::numeric_limits<float>::quiet_NaN();  // sample 13, element 2
  auto m = std::make_shared<MappedInputs>();
  m->map = std::make_shared<Storage>();
  m->data = reinterpret_cast<const uint8_t*>(xs.data());
  m->shape = Shape{40, 4};
  m->path = "x.npy";
  Dataset ds;
  ds.mapped = m;
  ds.targets = Tensor::zeros(Shape{40}, DType::i32);
  Loader loader(ds, 4, /*shuffle=*/false, 1);
  BatchStager stager(ds, 4, Device::cpu(), {.workers = 3, .prefetch = 4});
  Tensor x = Tensor::empty(Shape{4, 4}, DType::f32), y = Tensor::empty(Shape{4}, DType::i32);
  loader.start_epoch(0);
  for (int b = 0; b < 3; ++b) CHECK(stager.next(loader, x, y) == 4);  // samples 0-11
  CHECK_THROWS_AS(stager.next(loader, x, y), DataError);
  CHECK_THROWS_WITH(stager.next(loader, x, y), Catch::Contains("x.npy: value nan at sample 13 (element 2 of it)"));
}  // the destructor joins threads blocked on a full ring

namespace {

// Runs gputrain under an address-space limit of `mib` MiB (ulimit -v); its exit code. Far below its footprint
// glibc's malloc can spin retrying arena mappings (deaf to SIGTERM meanwhile): 10 s is a failure (killed) — a run
// of 3 steps that fits takes well under a second, and each probe that spins costs the whole wait. One malloc arena:
// glibc reserves 64 MiB of address space for each arena it makes when threads contend, a number that varies from run
// to run — on one CI machine the footprint so measured moved by more than the margins below.
int run_limited(int64_t mib, const std::string& args) {
  return run_shell(fmt::format("ulimit -v {} && MALLOC_ARENA_MAX=1 timeout -s KILL 10 {} {} > /dev/null 2>&1",
                               mib * 1024, gputrain_binary(), args))
      .exit_code;
}

}  // namespace

TEST_CASE("a run trains through a mapped uint8 NPY file under an address-space limit its f32 copy would not fit",
          "[e2e]") {
  TempDir dir;
  // Samples [1, 64, 64] of uint8 × 1/255: the file is n × 4 KiB, its f32 values four times that.
  auto write_set = [&](const std::string& name, int64_t n) {
    std::vector<uint8_t> x(static_cast<size_t>(n * 4096));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>((i * 2654435761u) >> 24);
    std::vector<int64_t> y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) y[static_cast<size_t>(i)] = i % 2;
    write_npy(dir / (name + "_x.npy"), "|u1", fmt::format("({}, 1, 64, 64)", n), x.data(), x.size());
    write_npy(dir / (name + "_y.npy"), "<i8", fmt::format("({},)", n), y.data(), y.size() * 8);
    write_text(dir / (name + ".yaml"), fmt::format(R"(name: {1}
data:
  format: npy
  train: {{inputs: {0}/{1}_x.npy, targets: {0}/{1}_y.npy}}
  scale: 0.00392156862745098
  batch_size: 64
model: {{layers: [flatten, {{type: linear, out_features: 2}}]}}
optimizer: {{type: sgd, lr: 0.1}}
logging: {{tensorboard: false, report: false}}
)",
                                                   dir.path(), name));
  };
  const int64_t big = 65536;  // 256 MiB of file, 1 GiB as f32: margins of 128 MiB and more either way
  write_set("tiny", 64);
  write_set("big", big);
  const std::string args = " --threads 1 --max-steps 3 --quiet --out ";
  // The process's own footprint: the smallest limit (to 16 MiB) under which the same run on 64 samples succeeds
  // (about 330 MiB on a 2-core AVX2 machine, 1257 MiB on one CI machine: OpenMP's and OpenBLAS's thread stacks and
  // buffers, the libraries).
  int64_t lo = 64, hi = 2048;
  auto probe = [&](int64_t mib) {
    return run_limited(mib, "train " + (dir / "tiny.yaml") + args + (dir / fmt::format("probe{}", mib))) == 0;
  };
  REQUIRE(probe(hi));
  while (hi - lo > 16) {
    const int64_t mid = (lo + hi) / 2;
    (probe(mid) ? hi : lo) = mid;
  }
  const int64_t base = hi, file = big * 4096 >> 20;
  INFO("footprint " << base << " MiB, file " << file << " MiB");
  // base + file + 64 MiB: the mapping fits, the f32 values (4 × file, beside the file's bytes when read) do not.
  const int64_t limit = base + file + 64;
  REQUIRE(limit < base + 4 * file);
  CHECK(run_limited(limit, "train " + (dir / "big.yaml") + args + (dir / "big")) == 0);
  CHECK(json_number(read_text(dir / "big/summary.json"), "steps") == 3);
  // The limit is tight: with half the file's size less (128 MiB), the mapping itself does not fit and the run fails.
  CHECK(run_limited(base + file / 2, "train " + (dir / "big.yaml") + args + (dir / "small")) != 0);
}

TEST_CASE("gather_rows by the loader's order gives the loader's batches, epoch after epoch", "[data][cpu]") {
  const Dataset ds = synthetic_images(23);
  Loader ref(ds, 5, /*shuffle=*/true, 9);
  const Batches want = epochs_of(ref, 3, ds, [](Loader& l, Tensor& x, Tensor& y) { return l.next(x, y); });
  REQUIRE(want.size() == 15);
  Loader loader(ds, 5, true, 9);
  const Batches got = epochs_of(loader, 3, ds, [&](Loader& l, Tensor& x, Tensor& y) {
    const auto [first, n] = l.span(l.position());
    if (n == 0) return int64_t{0};
    const Tensor order = order_tensor(*l.order());
    Tensor xb = x.narrow0(n), yb = y.narrow0(n);
    ops::gather_rows(ds.inputs, order, first, xb);
    ops::gather_rows(ds.targets, order, first, yb);
    l.advance(n);
    return n;
  });
  CHECK(got == want);
  // An index outside the data set is an error naming it, not a read past the rows.
  Tensor bad = order_tensor({0, 23});
  Tensor x = Tensor::empty(ds.input_shape().batched(2), DType::f32);
  CHECK_THROWS_WITH(ops::gather_rows(ds.inputs, bad, 0, x), Catch::Contains("index 23"));
}

TEST_CASE("data.device_resident on the CPU: the step's thread gathers the same batches, and true refuses host work",
          "[data][cpu]") {
  const Dataset ds = synthetic_images(23);
  CHECK(BatchStager::resident_obstacle(ds, false).empty());
  CHECK_THAT(BatchStager::resident_obstacle(ds, true), Catch::Contains("data.augment"));
  Loader ref(ds, 5, true, 9);
  const Batches want = epochs_of(ref, 2, ds, [](Loader& l, Tensor& x, Tensor& y) { return l.next(x, y); });
  for (Residency r : {Residency::on, Residency::automatic}) {
    Loader loader(ds, 5, true, 9);
    BatchStager stager(ds, 5, Device::cpu(), {.workers = 2, .resident = r});
    CHECK_FALSE(stager.device_resident());  // no device copy on the CPU
    CHECK(epochs_of(loader, 2, ds, [&](Loader& l, Tensor& x, Tensor& y) { return stager.next(l, x, y); }) == want);
  }
  CHECK_THROWS_AS(BatchStager(ds, 5, Device::cpu(), {.resident = Residency::on, .augmented = true}), ConfigError);
  CHECK_NOTHROW(BatchStager(ds, 5, Device::cpu(), {.resident = Residency::automatic, .augmented = true}));
}

TEST_CASE("data.device_resident true, false and auto train to bit-identical losses and weights on the CPU", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", plain_config());
  const auto base = run_gputrain(fmt::format("train {} --quiet --threads 2 --out {}/base", dir / "c.yaml", dir.path()));
  INFO(base.output);
  REQUIRE(base.exit_code == 0);
  for (const char* value : {"true", "false", "auto"})
    for (int workers : {0, 2}) {
      const std::string run = fmt::format("{}{}", value, workers);
      const auto r =
          run_gputrain(fmt::format("train {} --quiet --threads 2 --set data.device_resident={} --set "
                                   "data.workers={} --out {}/{}",
                                   dir / "c.yaml", value, workers, dir.path(), run));
      INFO(run << "\n" << r.output);
      REQUIRE(r.exit_code == 0);
      CHECK(read_text(dir / run + "/model.safetensors") == read_text(dir / "base/model.safetensors"));
      CHECK(metrics_without_timing(dir / run) == metrics_without_timing(dir / "base"));
      CHECK_THAT(read_text(dir / run + "/config.resolved.yaml"),
                 Catch::Contains(fmt::format("device_resident: {}", value)));
    }
  CHECK(lines_of(read_text(dir / "base/metrics.jsonl")).size() > 40);
}

TEST_CASE("data.device_resident: true with per-sample host work is a config error naming the key and line", "[e2e]") {
  TempDir dir;
  std::string c = kAugmented;
  c.insert(c.find("model:"), "  device_resident: true\n");
  write_text(dir / "c.yaml", c);
  const auto r = run_gputrain("check " + (dir / "c.yaml"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("data.device_resident") && Catch::Contains("data.augment") &&
                           Catch::Contains("c.yaml:12"));
  const auto bad = run_gputrain("check " + (dir / "c.yaml") + " --set data.device_resident=maybe");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("data.device_resident"));
}
