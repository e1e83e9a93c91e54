// The input pipeline on a GPU: pinned batches copied on the copy stream, the device-resident training set gathered by
// a kernel, and auto's fallback to staging; each compared with the CPU loader's batches. Without a usable device
// each case prints why and exits with ctest's skip code (cuda_helpers.h).
#include "core/error.h"
#include "cuda_helpers.h"
#include "data/batch_stager.h"
#include "data/dataset.h"
#include "helpers.h"
#include "ops/gather.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <regex>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

using Batches = std::vector<std::string>;

// Every batch of `epochs` epochs as the CPU loader makes them.
Batches cpu_batches(const Dataset& ds, int64_t batch, int64_t epochs, AugmentConfig augment = {}) {
  Loader loader(ds, batch, /*shuffle=*/true, 9, augment);
  Tensor x = Tensor::empty(ds.input_shape().batched(batch), DType::f32);
  Tensor y = Tensor::empty(ds.target_shape().batched(batch), ds.target_dtype());
  Batches out;
  for (int64_t e = 0; e < epochs; ++e) {
    loader.start_epoch(e);
    for (int64_t n; (n = loader.next(x, y)) > 0;) out.push_back(batch_bytes(x, y, n));
  }
  return out;
}

// Every batch the stager puts into the step's device tensors. After each one the compute stream copies x and y away
// (device to device, no host wait), as a step's kernels read them, so the stager runs ahead of the device the whole
// epoch: a copy that overtook the kernels before it, or a slot refilled too early, shows as a wrong batch. The
// copies come back to the host at the end.
Batches gpu_batches(const Dataset& ds, int64_t batch, int64_t epochs, StagingConfig config,
                    AugmentConfig augment = {}) {
  const Device gpu = Device::cuda(0);
  Loader loader(ds, batch, true, 9, augment);
  BatchStager stager(ds, batch, gpu, config);
  Tensor x = Tensor::empty(ds.input_shape().batched(batch), DType::f32, gpu);
  Tensor y = Tensor::empty(ds.target_shape().batched(batch), ds.target_dtype(), gpu);
  std::vector<std::pair<Tensor, Tensor>> kept;
  for (int64_t e = 0; e < epochs; ++e) {
    loader.start_epoch(e);
    for (int64_t n; (n = stager.next(loader, x, y)) > 0;) {
      Tensor kx = Tensor::empty(x.narrow0(n).shape(), DType::f32, gpu);
      Tensor ky = Tensor::empty(y.narrow0(n).shape(), y.dtype(), gpu);
      kx.copy_from_async(x.narrow0(n));
      ky.copy_from_async(y.narrow0(n));
      kept.emplace_back(kx, ky);
    }
  }
  Batches out;
  for (const auto& [kx, ky] : kept) {
    Tensor hx = Tensor::empty(kx.shape(), DType::f32), hy = Tensor::empty(ky.shape(), ky.dtype());
    hx.copy_from(kx);
    hy.copy_from(ky);
    out.push_back(batch_bytes(hx, hy, hx.dim(0)));
  }
  return out;
}

const char* const kMlp = R"(name: resident
seed: 7
data:
  format: synthetic
  samples: 2000
  test_samples: 200
  input_shape: [20]
  targets: {classes: 4}
  batch_size: 48
model:
  layers:
    - {type: linear, out_features: 32}
    - relu
    - {type: linear, out_features: 4}
optimizer: {type: adam, lr: 0.003}
train: {epochs: 2, log_every: 5}
)";

}  // namespace

TEST_CASE("pinned batches copied on the copy stream are the CPU loader's, with 0 and 2 loader threads", "[cuda]") {
  require_gpu();
  const Dataset ds = synthetic_images(203);  // batches of 8: the last of each epoch holds 3
  const AugmentConfig augment{.crop_padding = 1, .hflip = true};
  const Batches want = cpu_batches(ds, 8, 2, augment);
  REQUIRE(want.size() == 52);
  for (int workers : {0, 2})
    for (bool pinned : {true, false}) {
      DYNAMIC_SECTION(workers << " threads, pinned " << pinned) {
        CHECK(gpu_batches(ds, 8, 2, {.workers = workers, .pinned = pinned}, augment) == want);
      }
    }
}

TEST_CASE("gather_rows on CUDA matches the CPU's and zeroes the row of an index outside the rows", "[cuda]") {
  require_gpu();
  const Device gpu = Device::cuda(0);
  const Dataset ds = synthetic_images(40);
  Tensor order = Tensor::empty(Shape{7}, DType::i32);
  const int32_t idx[7] = {39, 0, 5, 5, 17, 40, -1};
  for (int i = 0; i < 7; ++i) order.data<int32_t>()[i] = idx[i];
  Tensor want = Tensor::empty(ds.input_shape().batched(4), DType::f32);
  ops::gather_rows(ds.inputs, order, 1, want);  // rows 0, 5, 5, 17
  Tensor src = Tensor::empty(ds.inputs.shape(), DType::f32, gpu),
         dorder = Tensor::empty(order.shape(), DType::i32, gpu);
  src.copy_from(ds.inputs);
  dorder.copy_from(order);
  Guarded out(ds.input_shape().batched(4));
  ops::gather_rows(src, dorder, 1, out.inner);
  const Tensor got = out.host_checked();
  CHECK(std::memcmp(got.raw(), want.raw(), want.bytes()) == 0);
  Guarded bad(ds.input_shape().batched(2));
  ops::gather_rows(src, dorder, 5, bad.inner);  // indices 40 and -1
  const Tensor zero = bad.host_checked();
  for (int64_t i = 0; i < zero.numel(); ++i) REQUIRE(zero.data<float>()[i] == 0.0f);
}

TEST_CASE("a device-resident training set gathers the staged batches, across epochs and a resume", "[cuda]") {
  require_gpu();
  const Dataset ds = synthetic_images(203);
  const Batches want = cpu_batches(ds, 8, 3);
  for (Residency r : {Residency::on, Residency::automatic}) {
    const StagingConfig config{.workers = 2, .resident = r};
    {
      BatchStager probe(ds, 8, Device::cuda(0), config);
      REQUIRE(probe.device_resident());  // 203 small samples: far below the fraction
    }
    CHECK(gpu_batches(ds, 8, 3, config) == want);
  }
  // A resume mid-epoch and a step back to an earlier epoch upload that epoch's order.
  const Device gpu = Device::cuda(0);
  Loader loader(ds, 8, true, 9);
  BatchStager stager(ds, 8, gpu, {.resident = Residency::on});
  Tensor x = Tensor::empty(ds.input_shape().batched(8), DType::f32, gpu);
  Tensor y = Tensor::empty(ds.target_shape().batched(8), ds.target_dtype(), gpu);
  Tensor hx = Tensor::empty(x.shape(), DType::f32), hy = Tensor::empty(y.shape(), y.dtype());
  auto next = [&] {
    const int64_t n = stager.next(loader, x, y);
    hx.copy_from(x);
    hy.copy_from(y);
    return batch_bytes(hx, hy, n);
  };
  loader.start_epoch(1, 16);
  CHECK(next() == want[26 + 2]);
  loader.start_epoch(0);
  CHECK(next() == want[0]);
  loader.start_epoch(2, 200);
  CHECK(next() == want[3 * 26 - 1]);
  CHECK(stager.next(loader, x, y) == 0);
}

TEST_CASE("data.device_resident auto stages a data set over its fraction of free memory, and true refuses host work",
          "[cuda]") {
  require_gpu();
  const Dataset ds = synthetic_images(203);
  const Batches want = cpu_batches(ds, 8, 2);
  const StagingConfig over{.resident = Residency::automatic, .resident_fraction = 1e-12};
  {
    BatchStager probe(ds, 8, Device::cuda(0), over);
    CHECK_FALSE(probe.device_resident());
  }
  CHECK(gpu_batches(ds, 8, 2, over) == want);
  BatchStager forced(ds, 8, Device::cuda(0), {.resident = Residency::on, .resident_fraction = 1e-12});
  CHECK(forced.device_resident());  // true holds it whatever the fraction
  CHECK_THROWS_AS(BatchStager(ds, 8, Device::cuda(0), {.resident = Residency::on, .augmented = true}), ConfigError);
  BatchStager augmented(ds, 8, Device::cuda(0), {.resident = Residency::automatic, .augmented = true});
  CHECK_FALSE(augmented.device_resident());
}

TEST_CASE("a device-resident run trains to the staged run's losses and weights, bit for bit, on CUDA", "[cuda]") {
  require_gpu();
  TempDir dir;
  write_text(dir / "c.yaml", kMlp);
  for (const char* value : {"false", "true"}) {
    const CommandResult r = run_gputrain(
        "train " + dir / "c.yaml" + " --device cuda --set data.device_resident=" + value + " --out " + dir / value);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    if (std::string(value) == "true") CHECK_THAT(r.output, Catch::Contains("is held on cuda:0"));
  }
  CHECK(lines_of(read_text(dir / "false/metrics.jsonl")).size() > 10);
  CHECK(metrics_without_timing(dir / "true") == metrics_without_timing(dir / "false"));
  CHECK(read_text(dir / "true/model.safetensors") == read_text(dir / "false/model.safetensors"));
}
