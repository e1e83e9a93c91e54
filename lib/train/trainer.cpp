// The training loop: seeded batches → forward → loss → backward → SGD, with logging and per-epoch evaluation.
#include "train/trainer.h"

#include "core/backend.h"
#include "core/parallel.h"
#include "dist/comm.h"
#include "dist/grad_sync.h"
#include "graph/model.h"
#include "io/safetensors.h"
#include "log/gpu_monitor.h"
#include "log/logging.h"
#include "log/metrics.h"
#include "log/progress.h"
#include "log/report.h"
#include "ops/devices.h"
#include "ops/optim.h"
#include "ops/stream.h"
#include "optim/optimizer.h"
#include "profile/profiler.h"
#include "train/checkpoint.h"
#include "train/loss.h"
#include "train/signals.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <mutex>
#include <cstdlib>
#include <limits>
#include <chrono>
#include <cstring>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

namespace gt {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double mib(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

std::string hms(double s) {
  const auto t = static_cast<int64_t>(s + 0.5);
  return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
}

std::string make_run_dir(const Experiment& exp, const std::string& requested) {
  fs::path dir;
  if (!requested.empty()) {
    dir = requested;
  } else {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    dir = fs::path("runs") / exp.name / stamp;
    for (int i = 1; fs::exists(dir); ++i) dir = fs::path("runs") / exp.name / fmt::format("{}-{}", stamp, i);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the run directory: {}", dir.string(), ec.message()));
  // Check writability now, not after an hour of training.
  const fs::path probe = dir / ".write-test";
  {
    std::ofstream f(probe);
    if (!(f << "ok") || !f.flush())
      throw Error(fmt::format("{}: the run directory is not writable", dir.string()));
  }
  fs::remove(probe, ec);
  return dir.string();
}

// Batches reach a GPU through two pinned host slots: the loader fills one while the copy queued from the other may
// still be running, and the step's kernels queue behind the copy on the device's stream, so loading the next batch
// overlaps the device's work on this one. On the CPU the loader writes straight into the step's tensors.
class BatchStager {
 public:
  BatchStager(const Dataset& data, int64_t batch, Device device) : m_device(device) {
    if (device.is_cpu()) return;
    for (Slot& s : m_slots) {
      s.x = Tensor::empty_pinned(data.input_shape().batched(batch), DType::f32);
      s.y = Tensor::empty_pinned(data.target_shape().batched(batch), data.targets.dtype());
    }
  }

  /// The loader's next batch in x and y (on the device); returns its size, 0 at the end of the epoch. The profiler
  /// (when given) times the loading ("data load") and the host-to-device copy ("data h2d").
  int64_t next(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler = nullptr) {
    static const std::string kData = "data", kTrainer = "trainer";
    if (m_device.is_cpu()) {
      ProfileScope scope(profiler, kData, kTrainer, "load");
      return loader.next(x, y);
    }
    Slot& s = m_slots[m_turn];
    m_turn ^= 1;
    int64_t n = 0;
    {
      // Host work, overlapping the device's: timed on the host, in a lane of its own when the others are device time.
      const auto t0 = Profiler::Clock::now();
      s.copied.wait();  // the copy queued from this slot two batches ago has been done
      n = loader.next(s.x, s.y);
      if (profiler && profiler->enabled())
        profiler->record(kData, kTrainer, "load", t0, Profiler::Clock::now(), 0,
                         profiler->timed_on_device() ? Profiler::kHost : Profiler::kMain);
    }
    if (n > 0) {
      ProfileScope scope(profiler, kData, kTrainer, "h2d");
      x.narrow0(n).copy_from_async(s.x.narrow0(n));
      y.narrow0(n).copy_from_async(s.y.narrow0(n));
      s.copied.record(m_device);
    }
    return n;
  }

 private:
  struct Slot {
    Tensor x, y;
    StreamEvent copied;
  };
  Device m_device;
  Slot m_slots[2];
  int m_turn = 0;
};

struct EvalResult {
  double loss = 0;
  std::optional<double> accuracy;
};

// Test-set metrics; with several ranks each evaluates every world-th batch and the sums are reduced, so every
// sample counts once.
EvalResult evaluate(Model& model, const Experiment& exp, const Dataset& test, Tensor& x, Tensor& y, Tensor& stats,
                    Communicator& comm) {
  Loader loader(test, x.dim(0), false, exp.seed);
  loader.start_epoch(0);
  stats.zero_();
  const LayerContext ctx{false, false, 0};
  Tensor none;
  BatchStager stager(test, x.dim(0), x.device());
  for (int64_t k = 0; k * x.dim(0) < test.size(); ++k) {
    if (k % comm.size() != comm.rank()) {  // another rank's batch
      loader.skip();
      continue;
    }
    const int64_t n = stager.next(loader, x, y);
    const Tensor& out = model.forward(x.narrow0(n), ctx);
    compute_loss(exp.loss, out, y.narrow0(n), 1.0, none, stats);
  }
  Tensor host = Tensor::empty(Shape{2}, DType::f64);
  host.copy_from(stats.narrow0(2));  // the one wait of the evaluation
  double* s = host.data<double>();
  comm.allreduce_sum(s, 2, "the evaluation sums");
  EvalResult r;
  r.loss = s[0] / static_cast<double>(test.size());
  if (test.num_classes > 0) r.accuracy = s[1] / static_cast<double>(test.size());
  return r;
}

}  // namespace

namespace {

// The oldest GPUs this build has kernels for: SASS for 8.0/8.6/8.9 and 9.0 with PTX for newer ones (CMakeLists.txt).
constexpr int kMinComputeCapability = 80;

std::string describe(const CudaDeviceInfo& d) {
  return fmt::format("{}, compute capability {}.{}, {:.0f} GiB", d.name, d.cc_major, d.cc_minor,
                     static_cast<double>(d.memory_total) / (1 << 30));
}

std::string visible_note() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", v) : std::string();
}

}  // namespace

Device resolve_device(const std::string& requested, std::string& reason) {
  if (requested == "cpu") {
    reason = "requested";
    return Device::cpu();
  }
  GT_CHECK(requested == "auto" || requested.rfind("cuda", 0) == 0, "device \"{}\" (a list is one device per worker)",
           requested);
  const CudaInfo cuda = query_cuda();
  if (requested == "auto") {
    if (cuda.devices.empty()) {
      reason = "auto: " + cuda.problem;
      return Device::cpu();
    }
    const CudaDeviceInfo& d = cuda.devices.front();
    if (d.cc_major * 10 + d.cc_minor < kMinComputeCapability) {
      reason = fmt::format("auto: cuda:0 ({}) is older than this build's kernels (8.0)", describe(d));
      return Device::cpu();
    }
    reason = fmt::format("auto: {} CUDA device(s){}, using cuda:0 ({})", cuda.devices.size(), visible_note(),
                         describe(d));
    return Device::cuda(0);
  }
  int index = 0;  // "cuda" or "cuda:N" (the config checked the form)
  if (requested.size() > 5) {
    const auto [end, ec] = std::from_chars(requested.data() + 5, requested.data() + requested.size(), index);
    if (ec != std::errc()) index = std::numeric_limits<int>::max();
  }
  if (cuda.devices.empty()) throw Error(fmt::format("device {}: no usable GPU: {}", requested, cuda.problem));
  if (index >= static_cast<int>(cuda.devices.size()))
    throw Error(fmt::format("device {}: only {} CUDA device(s) visible{}", requested, cuda.devices.size(),
                            visible_note()));
  const CudaDeviceInfo& d = cuda.devices[static_cast<size_t>(index)];
  if (d.cc_major * 10 + d.cc_minor < kMinComputeCapability)
    throw Error(fmt::format("device {}: {} is too old: this build has kernels for compute capability 8.0 and newer",
                            requested, describe(d)));
  reason = fmt::format("requested{}; {}", visible_note(), describe(d));
  return Device::cuda(index);
}

LoadedData load_data(const Experiment& exp) {
  LoadedData d;
  if (exp.data.format == "idx") {
    d.train = read_idx(exp.data.train_images, exp.data.train_labels, static_cast<float>(exp.data.scale));
    if (!exp.data.test_images.empty())
      d.test = read_idx(exp.data.test_images, exp.data.test_labels, static_cast<float>(exp.data.scale));
  } else if (exp.data.format == "csv") {
    d.train = read_csv(exp.data.train_csv, exp.data.csv);
    if (!exp.data.test_csv.empty()) d.test = read_csv(exp.data.test_csv, exp.data.csv);
  } else if (exp.data.format == "npy") {
    d.train = read_npy_pair(exp.data.train_images, exp.data.train_labels, static_cast<float>(exp.data.scale));
    if (!exp.data.test_images.empty())
      d.test = read_npy_pair(exp.data.test_images, exp.data.test_labels, static_cast<float>(exp.data.scale));
  } else {
    d.train = make_synthetic(exp.data.synthetic, exp.seed, 0);
    if (exp.data.synthetic.test_samples > 0) d.test = make_synthetic(exp.data.synthetic, exp.seed, 1);
  }
  if (d.test.size() > 0) {
    if (d.test.input_shape() != d.train.input_shape() || d.test.target_shape() != d.train.target_shape() ||
        (d.test.num_classes > 0) != (d.train.num_classes > 0))
      throw DataError(fmt::format("{}: test samples are {} → {} but training samples are {} → {}", d.test.source,
                                  d.test.input_shape().str(), d.test.target_shape().str(), d.train.input_shape().str(),
                                  d.train.target_shape().str()));
    d.test.num_classes = d.train.num_classes = std::max(d.train.num_classes, d.test.num_classes);
  }
  return d;
}

void load_weights(Model& model, const std::string& path) { load_named_tensors(model.state_tensors(), path); }

namespace {
std::optional<CheckpointInfo> newest_good_of_run(const std::string& run_dir, const CheckpointConfig& cfg,
                                                 bool required);
}  // namespace

EvalSummary evaluate_weights(const Experiment& exp, const std::string& weights_path, int threads) {
  set_num_threads(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
  std::string reason;
  const Device device = resolve_device(exp.devices.empty() ? exp.device : exp.devices[0], reason);
  const LoadedData data = load_data(exp);
  if (data.test.size() == 0) exp.root["data"].fail("eval needs a test set (data.test, or test_samples for synthetic)");
  Model model = Model::build(exp.root["model"], data.train.input_shape(), DType::f32, device, exp.seed);
  check_loss_fits(exp.loss, model.output_shape(), data.train, exp.root.has("loss") ? exp.root["loss"] : exp.root);
  // A weights file, a checkpoint folder, or a run directory (its final weights, else its newest good checkpoint).
  std::string weights = weights_path;
  if (fs::is_directory(weights_path)) {
    if (fs::exists(fs::path(weights_path) / "model.safetensors")) {
      weights = (fs::path(weights_path) / "model.safetensors").string();
    } else if (fs::is_directory(fs::path(weights_path) / "checkpoints")) {
      const auto found = newest_good_of_run(weights_path, exp.checkpoint, true);
      weights = (fs::path(found->dir) / "model.safetensors").string();
    } else {
      throw ConfigError(fmt::format("--checkpoint {}: a folder without model.safetensors or checkpoints/",
                                    weights_path));
    }
  }
  load_weights(model, weights);
  const int64_t batch = exp.data.batch_size;
  model.allocate(batch);
  Tensor x = Tensor::empty(data.test.input_shape().batched(batch), DType::f32, device);
  Tensor y = Tensor::empty(data.test.target_shape().batched(batch), data.test.targets.dtype(), device);
  Tensor stats = Tensor::zeros(Shape{2}, DType::f64, device);
  const auto local = make_local_comm();
  const EvalResult r = evaluate(model, exp, data.test, x, y, stats, *local);
  return {data.test.size(), r.loss, r.accuracy};
}

namespace {

// summary.json: what a sweep reads. `sum` gets the final numbers from `p`.
void write_summary(const fs::path& dir, const Experiment& exp, RunSummary& sum, const TrainProgress& p, int threads,
                   int world, double wall_seconds) {
  sum.epochs = p.epochs_done;
  sum.steps = p.step;
  sum.samples_per_sec = static_cast<double>(p.train_samples) / std::max(p.train_seconds, 1e-9);
  sum.final_train_loss = p.final_train_loss;
  sum.test_loss = p.test_loss;
  sum.test_accuracy = p.test_accuracy;
  sum.wall_seconds = wall_seconds;
  write_file_durable((dir / "summary.json").string(), JsonObject()
                                                          .add("name", exp.name)
                                                          .add("device", sum.device)
                                                          .add("world_size", world)
                                                          .add("epochs", sum.epochs)
                                                          .add("steps", sum.steps)
                                                          .add("samples_per_sec", sum.samples_per_sec)
                                                          .add("final_train_loss", sum.final_train_loss)
                                                          .add("test_loss", sum.test_loss)
                                                          .add("test_accuracy", sum.test_accuracy)
                                                          .add("wall_seconds", sum.wall_seconds)
                                                          .add("exit_reason", sum.exit_reason)
                                                          .add("threads", threads)
                                                          .str() +
                                                          "\n");
}

// Which checkpoint a run continues from, and in which run directory (`--resume auto | PATH`).
struct ResumePlan {
  std::string run_dir;  ///< "" → a new run directory
  std::optional<CheckpointInfo> from;
};

// The newest runs/<name>/* folder that holds checkpoints, or "".
std::string newest_run_with_checkpoints(const Experiment& exp) {
  std::error_code ec;
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(fs::path("runs") / exp.name, ec))
    if (e.is_directory() && fs::exists(e.path() / "checkpoints")) runs.push_back(e.path().string());
  std::sort(runs.begin(), runs.end());  // names are time stamps
  return runs.empty() ? std::string() : runs.back();
}

std::optional<CheckpointInfo> newest_good_of_run(const std::string& run_dir, const CheckpointConfig& cfg,
                                                 bool required) {
  const CheckpointStore store(run_dir, cfg);
  const auto candidates = store.list();
  auto found = store.newest_good();  // warns about each broken one it skips
  if (found && found->dir != candidates.front())
    spdlog::warn("falling back to checkpoint {}: the newer ones do not verify", found->dir);
  if (!found && !candidates.empty())
    throw DataError(fmt::format("{}: none of its {} checkpoint(s) verifies (see the warnings above)", store.root(),
                                candidates.size()));
  if (!found && required) throw DataError(fmt::format("{}: no checkpoint to resume from", store.root()));
  return found;
}

ResumePlan plan_resume(const Experiment& exp, const RunOptions& opts) {
  ResumePlan plan;
  plan.run_dir = opts.out_dir;
  if (opts.resume.empty()) {
    if (!plan.run_dir.empty() && !CheckpointStore(plan.run_dir, exp.checkpoint).list().empty())
      throw ConfigError(fmt::format("--out {}: this folder already holds a run's checkpoints; continue it with "
                                    "--resume auto, or choose another --out",
                                    plan.run_dir));
    return plan;
  }
  if (opts.resume == "auto") {
    if (plan.run_dir.empty()) plan.run_dir = newest_run_with_checkpoints(exp);
    if (!plan.run_dir.empty()) plan.from = newest_good_of_run(plan.run_dir, exp.checkpoint, false);
    if (!plan.from)
      spdlog::info("--resume auto: no checkpoint{}; starting from step 0",
                   plan.run_dir.empty() ? fmt::format(" under runs/{}", exp.name) : " in " + plan.run_dir);
    return plan;
  }
  const fs::path p = opts.resume;
  if (fs::exists(p / "state.json")) {
    plan.from = read_checkpoint(p.string());  // an explicit checkpoint that does not verify is refused
    if (plan.run_dir.empty()) plan.run_dir = fs::absolute(p).lexically_normal().parent_path().parent_path().string();
  } else if (fs::is_directory(p / "checkpoints")) {
    if (plan.run_dir.empty()) plan.run_dir = p.string();
    plan.from = newest_good_of_run(p.string(), exp.checkpoint, true);
  } else {
    throw ConfigError(fmt::format("--resume {}: neither a checkpoint (no state.json) nor a run directory (no "
                                  "checkpoints/ folder)",
                                  opts.resume));
  }
  return plan;
}

// Names the top-level sections in which two resolved configs differ.
std::string config_differences(const std::string& a, const std::string& b) {
  std::string out;
  try {
    const YAML::Node x = YAML::Load(a), y = YAML::Load(b);
    std::set<std::string> keys;
    for (const auto& n : {x, y})
      if (n.IsMap())
        for (const auto& kv : n) keys.insert(kv.first.as<std::string>());
    for (const auto& k : keys)
      if (YAML::Dump(x[k]) != YAML::Dump(y[k])) out += (out.empty() ? "" : ", ") + k;
  } catch (const YAML::Exception&) {
    out = "(unreadable)";
  }
  return out;
}

}  // namespace

namespace {

// The other ranks' sampler readings in rank 0's train rows (a collective: every rank calls it at the same log
// step): rank{r}_host_rss_mib, rank{r}_host_cpu_pct, rank{r}_host_threads and, for a rank on a GPU,
// rank{r}_gpu{i}_util, _mem_used_mib, _temp_c, _power_w, _sm_clock_mhz. Rank 0's own are the unprefixed fields.
void add_rank_fields(JsonObject& row, Communicator& comm, const MonitorSample& s, Device device) {
  constexpr size_t kPerRank = 9;
  const auto world = static_cast<size_t>(comm.size()), me = static_cast<size_t>(comm.rank());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> all(world * kPerRank, 0.0);
  double* mine = all.data() + me * kPerRank;
  const GpuSample* g = nullptr;
  for (const GpuSample& x : s.gpus)
    if (device.is_cuda() && x.ordinal == device.index) g = &x;
  auto v = [&](const std::optional<double>& o) { return o ? *o : nan; };  // NaN: not known (null in the row)
  const double fields[kPerRank] = {s.seq > 0 ? s.host.rss_mib : nan, v(s.host.cpu_pct),
                                   s.seq > 0 ? static_cast<double>(s.host.threads) : nan,
                                   device.is_cuda() ? static_cast<double>(device.index) : -1.0,
                                   g ? v(g->util_pct) : nan, g ? v(g->mem_used_mib) : nan, g ? v(g->temp_c) : nan,
                                   g ? v(g->power_w) : nan, g ? v(g->sm_clock_mhz) : nan};
  std::copy(std::begin(fields), std::end(fields), mine);
  comm.allreduce_sum(all.data(), all.size(), "the ranks' GPU and host metrics");
  if (comm.rank() != 0) return;
  for (size_t r = 1; r < world; ++r) {
    const double* f = all.data() + r * kPerRank;
    const std::string pre = fmt::format("rank{}_", r);
    row.add(pre + "host_rss_mib", f[0]).add(pre + "host_cpu_pct", f[1]).add(pre + "host_threads", f[2]);
    if (f[3] < 0) continue;
    const std::string gp = fmt::format("{}gpu{}_", pre, static_cast<int>(f[3]));
    row.add(gp + "util", f[4]).add(gp + "mem_used_mib", f[5]).add(gp + "temp_c", f[6]).add(gp + "power_w", f[7])
        .add(gp + "sm_clock_mhz", f[8]);
  }
}

// How one worker is placed: its device, and what the workers of one process share.
struct WorkerSetup {
  std::string device;                  ///< as resolve_device takes it
  const LoadedData* data = nullptr;    ///< loaded once for all workers of a process; nullptr: load it here
  std::vector<int> process_gpus;       ///< every GPU this process drives (the sampler's targets)
  bool threaded = false;               ///< one of several worker threads (the harness owns the signal handlers)
};

RunSummary train_worker(const Experiment& exp, const RunOptions& opts, const WorkerSetup& setup) {
  const auto wall_start = Clock::now();
  const int threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency());
  set_num_threads(threads);

  std::string device_reason;
  const Device device = resolve_device(setup.device, device_reason);

  // Everything that can be wrong with the config is found before the run directory exists.
  std::optional<LoadedData> own_data;
  if (!setup.data) own_data = load_data(exp);
  const LoadedData& data = setup.data ? *setup.data : *own_data;
  Model model = Model::build(exp.root["model"], data.train.input_shape(), DType::f32, device, exp.seed);
  const ConfigNode loss_where = exp.root.has("loss") ? exp.root["loss"] : exp.root["model"]["layers"];
  check_loss_fits(exp.loss, model.output_shape(), data.train, loss_where);
  if (exp.data.augment.any() && data.train.input_shape().rank() != 3)
    exp.root["data"]["augment"].fail(fmt::format("augmentation works on [channels, height, width] images; the "
                                                 "samples are {}", data.train.input_shape().str()));
  std::string resolved_text;
  {
    YAML::Emitter em;
    em << resolved_config(exp, model.resolved_layers());
    resolved_text = std::string(em.c_str()) + "\n";
  }
  const std::unique_ptr<Communicator> local_comm = make_local_comm();
  Communicator& comm = opts.comm ? *opts.comm : *local_comm;
  const bool lead = comm.rank() == 0;  // rank 0 alone writes the run directory
  const int world = comm.size();
  if (exp.dist.sync_batchnorm && world > 1)  // batch norm over the global batch
    model.set_sync([&comm](double* data, size_t n) { comm.allreduce_sum(data, n, "batch norm's sums"); });
  // Rank 0 picks the checkpoint and the run directory; the others load the same one (a shared file system).
  ResumePlan plan;
  if (lead) plan = plan_resume(exp, opts);
  auto share = [&](std::string& text, const char* what) {
    uint64_t n = text.size();
    comm.broadcast(&n, sizeof n, 0, what);
    text.resize(n);
    comm.broadcast(text.data(), n, 0, what);
  };
  if (world > 1) {
    std::string from = plan.from ? plan.from->dir : std::string();
    share(from, "the checkpoint to resume from");
    if (!lead && !from.empty()) plan.from = read_checkpoint(from);
  }
  model.allocate(exp.data.batch_size);
  const std::vector<Param*> params = model.params();
  auto optimizer = make_optimizer(exp.optimizer, params);
  TrainProgress p;
  if (plan.from) {  // loaded (and refused when it does not fit) before the run directory is touched
    if (plan.from->optimizer_type != exp.optimizer.type)
      throw DataError(fmt::format("{}: written by optimizer {}, but the config asks for {}", plan.from->dir,
                                  plan.from->optimizer_type, exp.optimizer.type));
    load_checkpoint(*plan.from, model, *optimizer);
    p = plan.from->progress;
    // The position counts global batches of the writer's world size: keep the sample position.
    if (plan.from->world_size != world) p.micro_done = p.micro_done * plan.from->world_size / world;
  }

  RunSummary sum;
  if (lead) sum.run_dir = make_run_dir(exp, plan.run_dir);
  if (world > 1) share(sum.run_dir, "the run directory");
  sum.device = device.str();
  const fs::path dir = sum.run_dir;
  struct DetachLog {
    bool attached = false;
    ~DetachLog() {
      if (attached) remove_log_file();
    }
  } detach_log;
  if (lead) {
    add_log_file((dir / "train.log").string());
    detach_log.attached = true;
    write_file_durable((dir / "config.resolved.yaml").string(), resolved_text);
  }
  MetricsSink metrics(lead ? dir.string() : std::string(), exp.logging.jsonl, exp.logging.tensorboard);
  // GPU and host metrics from a background sampler (never on the step's path): in log lines and train rows.
  std::optional<GpuMonitor> monitor;
  if (exp.logging.gpu_metrics && (lead || !setup.threaded)) {  // one sampler per process
    std::vector<int> gpus = setup.process_gpus;
    if (gpus.empty() && device.is_cuda()) gpus = {device.index};
    monitor.emplace(gpus.empty() ? std::vector<GpuTarget>{} : gpu_targets(query_cuda(), gpus), exp.logging.interval_s);
    monitor->start();
  }
  CheckpointStore store(sum.run_dir, exp.checkpoint, world);

  const int64_t batch = exp.data.batch_size, accumulate = exp.train.accumulate;
  Loader loader(data.train, batch, exp.data.shuffle, exp.seed, exp.data.augment);
  loader.shard(comm.rank(), world);
  const int64_t micro_per_epoch = loader.batches_per_epoch();
  if (micro_per_epoch == 0)
    throw DataError(fmt::format("{}: {} training samples are fewer than one global batch ({} ranks × batch {})",
                                data.train.source, data.train.size(), world, batch));
  const int64_t per_epoch = (micro_per_epoch + accumulate - 1) / accumulate;  // optimizer steps
  int64_t total_steps = per_epoch * exp.train.epochs;
  if (exp.train.max_steps > 0) total_steps = std::min(total_steps, exp.train.max_steps);

  spdlog::info("gputrain {}: run {} → {}", GPUTRAIN_VERSION, exp.name, sum.run_dir);
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  spdlog::info("{}device {} ({}), {} CPU thread(s), host {}",
               world > 1 ? fmt::format("rank {} of {} (local rank {}, {}), ", comm.rank(), world, opts.local_rank,
                                       comm.name())
                         : std::string(),
               sum.device, device_reason, threads, host);
  spdlog::info("data: {} training samples of {}{}, batch {}{}{}{}, {} steps per epoch{}", data.train.size(),
               data.train.input_shape().str(),
               data.test.size() ? fmt::format(", {} test samples", data.test.size()) : std::string(), batch,
               world > 1 ? " per rank" : "", accumulate > 1 ? fmt::format(" × {} accumulated", accumulate) : std::string(),
               world > 1 || accumulate > 1 ? fmt::format(" = global batch {}", batch * accumulate * world)
                                           : std::string(),
               per_epoch,
               world > 1 ? fmt::format(" ({} samples of each epoch's order dropped so every rank takes the same "
                                       "number of full batches)",
                                       data.train.size() - micro_per_epoch * batch * world)
                         : std::string());
  spdlog::info("model: {} layers, {} parameters; loss {}; optimizer {} lr {}; schedule {}", model.nodes().size(),
               model.param_count(), exp.loss.type, exp.optimizer.type, exp.optimizer.lr, exp.scheduler.type);

  if (plan.from) {
    const CheckpointInfo& c = *plan.from;
    if (metrics.bytes() < p.metrics_bytes)
      spdlog::warn("{}: shorter than when the checkpoint was written; rows are missing", (dir / "metrics.jsonl").string());
    else
      metrics.truncate(p.metrics_bytes);
    metrics.resume_after(p.step);
    if (c.config_hash != config_hash(resolved_text))
      spdlog::warn("the config differs from the checkpoint's in: {} (the run continues with the new one)",
                   config_differences(c.config, resolved_text));
    if (c.world_size != world)
      spdlog::warn("the checkpoint was written by {} rank(s) and this run has {}: the data order differs from there on",
                   c.world_size, world);
    spdlog::info("resuming from {}: step {}, epoch {}, {} samples into it", c.dir, p.step, p.epoch + 1,
                 p.micro_done * batch);
  } else if (metrics.bytes() > 0) {
    spdlog::warn("{}: rows of an earlier start without a checkpoint are dropped", (dir / "metrics.jsonl").string());
    metrics.truncate(0);
    metrics.resume_after(0);
  }

  // On GPUs the gradients, the initial state and the step's device-side sums travel through NCCL, bootstrapped over
  // the host communicator (MPI, TCP or the worker threads'), which keeps the host-side collectives. Declared before
  // the gradient sync that uses it, so it is destroyed after it.
  std::unique_ptr<Communicator> nccl;
  if (world > 1 && device.is_cuda()) nccl = make_nccl_comm(comm, device.index, exp.dist.timeout_s);
  Communicator& device_comm = nccl ? *nccl : comm;
  // Every replica starts from rank 0's state (the same seed gives the same weights, but a resumed or hand-edited
  // state must not diverge silently).
  if (world > 1) {
    for (auto& [name, t] : model.state_tensors())
      device_comm.broadcast(t->raw(), t->bytes(), 0, "the initial parameters");
    for (auto& [name, t] : optimizer->state()) device_comm.broadcast(t->raw(), t->bytes(), 0, "the optimizer state");
  }
  std::optional<GradSync> grad_sync;
  if (world > 1) {
    grad_sync.emplace(device_comm, model.params_by_node(), exp.dist.bucket_mb, exp.dist.overlap);
    model.set_grad_ready_hook([&](size_t node) { grad_sync->node_done(node); });
    spdlog::info("gradients: {:.2f} MB all-reduced per step in {} bucket(s) of up to {} MB, {}",
                 static_cast<double>(grad_sync->bytes_per_step()) / 1e6, grad_sync->buckets(), exp.dist.bucket_mb,
                 exp.dist.overlap ? "overlapping backward" : "after backward (dist.overlap: false)");
  }
  struct Unhook {
    Model& m;
    ~Unhook() { m.set_grad_ready_hook(nullptr); }
  } unhook{model};

  Tensor x = Tensor::empty(data.train.input_shape().batched(batch), DType::f32, device);
  Tensor y = Tensor::empty(data.train.target_shape().batched(batch), data.train.targets.dtype(), device);
  Tensor dout = Tensor::empty(model.output_shape().batched(batch), DType::f32, device);
  // The step's statistics (StepStat: loss sum, hits, squared gradient norm) and the log window's sums stay on the
  // device: the optimizer reads them there to skip a non-finite step or clip, and the host reads them when it needs
  // a number, so a GPU step queues its work without waiting for the device.
  Tensor stats = Tensor::zeros(Shape{kStepStats}, DType::f64, device);
  Tensor grad_sq = stats.slice0(kGradSq, 1);
  Tensor window = Tensor::zeros(Shape{3}, DType::f64, device);  // loss sum, hits, skipped steps
  Tensor eval_stats = Tensor::zeros(Shape{2}, DType::f64, device);
  const auto named_params = model.named_params();
  const int64_t n_params = std::max<int64_t>(1, static_cast<int64_t>(named_params.size()));
  Tensor param_sq = Tensor::zeros(Shape{n_params}, DType::f64, device);  // names the first non-finite gradient
  Tensor stats_host = Tensor::empty_pinned(Shape{kStepStats}, DType::f64);
  Tensor param_sq_host = Tensor::empty_pinned(Shape{n_params}, DType::f64);
  StreamEvent stats_ready;
  BatchStager stager(data.train, batch, device);
  const bool gpu = device.is_cuda();
  auto set_window = [&] {  // from the progress (a resumed or rolled-back run continues its window)
    Tensor h = Tensor::zeros(Shape{3}, DType::f64);
    h.data<double>()[0] = p.window_loss;
    h.data<double>()[1] = p.window_hits;
    window.copy_from(h);
  };
  auto read_window = [&] {  // into the progress: one wait for the device
    Tensor h = Tensor::empty(Shape{3}, DType::f64);
    h.copy_from(window);
    p.window_loss = h.data<double>()[0];
    p.window_hits = h.data<double>()[1];
  };
  set_window();
  Profiler profiler;
  profiler.set_device(device);
  model.set_profiler(&profiler);
  if (grad_sync) grad_sync->set_profiler(&profiler);
  const int64_t profile_end = exp.train.profile_start + exp.train.profile_steps;  // steps are 1-based here
  static const std::string kLoss = "loss", kOptimizer = "optimizer";
  auto finish_profile = [&] {
    profiler.enable(false);
    if (!lead) return;
    write_file_durable((dir / "trace.json").string(), profiler.chrome_trace());
    const std::string table = profiler.table();
    write_file_durable((dir / "profile.txt").string(), table);
    spdlog::info("profile of steps {}–{} (trace.json opens in Perfetto):\n{}", exp.train.profile_start,
                 exp.train.profile_start + profiler.steps() - 1, table);
  };

  // The training clock runs during steps only: evaluation and checkpoints stop it.
  auto window_start = Clock::now();
  double window_seconds = 0;
  auto stop_clock = [&] {
    const double dt = seconds_since(window_start);
    window_seconds += dt;
    p.train_seconds += dt;
  };
  auto restart_clock = [&] { window_start = Clock::now(); };

  auto run_eval = [&] {
    const EvalResult r = evaluate(model, exp, data.test, x, y, eval_stats, comm);
    p.test_loss = r.loss;
    p.test_accuracy = r.accuracy;
    p.last_eval_step = p.step;
    spdlog::info("eval epoch {}/{} | step {} | test_loss {:.4f} | test_accuracy {}", p.epoch + 1, exp.train.epochs,
                 p.step, r.loss, r.accuracy ? fmt::format("{:.4f}", *r.accuracy) : "n/a");
    metrics.write(JsonObject()
                      .add("type", "eval")
                      .add("step", p.step)
                      .add("epoch", p.epoch + 1)
                      .add("test_loss", r.loss)
                      .add("test_accuracy", r.accuracy));
  };

  bool dirty = !plan.from;  // state not yet in a checkpoint
  int64_t rollbacks = 0;    // since the last checkpoint written
  auto save_checkpoint = [&] {
    read_window();
    if (!exp.checkpoint.keep_best.empty()) {
      const bool acc = exp.checkpoint.keep_best == "test_accuracy";
      const std::optional<double> v = acc ? p.test_accuracy : p.test_loss;
      if (v && (!p.best_value || (acc ? *v > *p.best_value : *v < *p.best_value))) {
        p.best_value = v;
        p.best_step = p.step;
      }
    }
    p.metrics_bytes = metrics.bytes();
    p.optimizer_steps = optimizer->steps_taken();
    if (!lead) {  // rank 0 writes it; the state it holds is the same on every rank
      dirty = false;
      rollbacks = 0;
      return;
    }
    const auto t0 = Clock::now();
    const std::string where = store.save(model, *optimizer, exp.optimizer.type, p, resolved_text);
    spdlog::info("checkpoint {} ({:.0f} ms)", where, 1e3 * seconds_since(t0));
    dirty = false;
    rollbacks = 0;
  };

  // The live progress display (rank 0, stdout a terminal) stands for the periodic step lines on the console; train.log
  // still gets them. Its loss is the epoch's mean over the steps resolved so far; its rate counts training time only.
  std::optional<ProgressDisplay> bar;
  if (lead && opts.progress && exp.logging.progress && spdlog::should_log(spdlog::level::info) && console_is_live())
    bar.emplace();
  double bar_loss = 0, bar_t0 = 0;
  int64_t bar_samples = 0, bar_s0 = 0;
  auto start_bar_epoch = [&] {
    bar_t0 = p.train_seconds;
    bar_loss = 0;
    bar_samples = 0;
    bar_s0 = p.epoch_samples;
  };
  auto bar_state = [&](bool done) {
    const double train_s = p.train_seconds + seconds_since(window_start);
    ProgressState s;
    s.epoch = p.epoch + 1;
    s.epochs = exp.train.epochs;
    s.step = (p.micro_done + accumulate - 1) / accumulate;
    s.steps = per_epoch;
    if (bar_samples > 0) s.loss = bar_loss / static_cast<double>(bar_samples);
    if (train_s > bar_t0) s.samples_per_sec = static_cast<double>(p.epoch_samples - bar_s0) / (train_s - bar_t0);
    if (monitor) s.gpu = progress_gpu_text(monitor->latest());
    s.elapsed_s = seconds_since(wall_start);
    if (p.step > 0) s.eta_s = static_cast<double>(total_steps - p.step) * train_s / static_cast<double>(p.step);
    s.done = done;
    return s;
  };

  // What the host knows of the newest step whose update is queued. On the CPU it learns the outcome at once; on a
  // GPU one step later (or when it next logs, evaluates or saves), so the device never idles while the host waits.
  // The device has already skipped the update of a non-finite step; resolve() decides what else happens.
  enum class Outcome { ok, skipped, diverged, rolled_back };
  struct Pending {
    bool open = false;
    int64_t step = 0, samples = 0;
  } pending;
  auto resolve = [&]() -> Outcome {
    if (!pending.open) return Outcome::ok;
    pending.open = false;
    stats_ready.wait();
    const double* st = stats_host.data<double>();
    const double step_loss = st[kLossSum];
    p.grad_norm = std::sqrt(st[kGradSq]);
    if (std::isfinite(step_loss) && std::isfinite(st[kGradSq])) {
      p.skips_in_row = 0;
      bar_loss += step_loss;
      bar_samples += pending.samples;
      return Outcome::ok;
    }
    std::string first = "none (the loss itself)";
    for (size_t i = 0; i < named_params.size(); ++i)
      if (!std::isfinite(param_sq_host.data<double>()[i])) {
        first = named_params[i].first;
        break;
      }
    const std::string what =
        fmt::format("step {}: non-finite {} (loss sum {}, gradient norm {}); first non-finite gradient: {}",
                    pending.step, std::isfinite(step_loss) ? "gradient" : "loss", step_loss, p.grad_norm, first);
    // The update did not happen: the optimizer's step count and the statistics' sample counts take it back.
    optimizer->undo_step();
    p.window_samples -= pending.samples;
    p.epoch_samples -= pending.samples;
    const std::string& mode = exp.train.nonfinite;
    if (mode == "skip" && ++p.skips_in_row <= exp.train.max_skips) {
      spdlog::warn("{}: the step is skipped ({} in a row, train.max_skips {})", what, p.skips_in_row,
                   exp.train.max_skips);
      metrics.write(JsonObject().add("type", "skip").add("step", pending.step).add("epoch", p.epoch + 1));
      return Outcome::skipped;
    }
    if (mode == "rollback" && ++rollbacks <= exp.train.max_skips) {
      const auto back = newest_good_of_run(sum.run_dir, exp.checkpoint, true);
      const double lr_scale = p.lr_scale * 0.5;
      load_checkpoint(*back, model, *optimizer);
      p = back->progress;
      p.lr_scale = lr_scale;  // metrics.jsonl keeps the diverging steps' rows: the rollback row follows them
      set_window();
      if (lead) store.remove_after(p.step);  // the newer ones lead to the divergence
      dirty = false;
      spdlog::warn("{}: rolled back to {} (step {}); learning rate now × {}", what, back->dir, p.step, lr_scale);
      metrics.write(JsonObject()
                        .add("type", "rollback")
                        .add("from_step", pending.step)
                        .add("to_step", p.step)
                        .add("lr_scale", lr_scale));
      return Outcome::rolled_back;
    }
    stop_clock();
    spdlog::error("training diverged: {} (train.nonfinite: {}{})", what, mode,
                  mode == "abort" ? "" : fmt::format(", more than max_skips {} in a row", exp.train.max_skips));
    sum.exit_reason = "diverged";
    p.step = pending.step - 1;  // the diverging step made no update
    return Outcome::diverged;
  };

  if (exp.train.nonfinite == "rollback" && !plan.from) {
    spdlog::info("train.nonfinite: rollback: writing the step-0 checkpoint to return to");
    save_checkpoint();
  }
  struct RemoveHandlers {
    bool own;
    ~RemoveHandlers() {
      if (own) remove_stop_handlers();
    }
  } remove_handlers{!setup.threaded};
  if (remove_handlers.own) install_stop_handlers();

  sum.exit_reason = "completed";
  bool finished = false, any_stop = false;
  while (!finished && p.epoch < exp.train.epochs && p.step < total_steps) {
    loader.start_epoch(p.epoch, p.micro_done * batch * world);
    restart_clock();
    start_bar_epoch();
    bool restart = false;
    auto close_window = [&] {
      read_window();  // waits for the device, so the window's time includes its work
      stop_clock();
      const double loss_sum = p.window_loss;
      p.epoch_loss += loss_sum;
      p.window_loss = p.window_hits = 0;
      window.zero_();
      return loss_sum;
    };
    while (p.micro_done < micro_per_epoch) {
      // One optimizer step over up to `accumulate` micro-batches; each one's loss is its mean over the step's
      // micro-batches, so the gradient is the mean over the effective batch.
      const int64_t micros = std::min(accumulate, micro_per_epoch - p.micro_done);
      const double lr = scheduled_lr(exp.scheduler, exp.optimizer.lr, p.step, total_steps) * p.lr_scale;
      if (exp.train.profile_steps > 0 && p.step + 1 == exp.train.profile_start) profiler.enable(true);
      profiler.begin_step();
      stats.zero_();
      int64_t step_samples = 0;
      for (int64_t k = 0; k < micros; ++k) {
        int64_t n = 0;
        n = stager.next(loader, x, y, &profiler);
        const Tensor xb = x.narrow0(n), yb = y.narrow0(n);
        Tensor db = dout.narrow0(n);
        // Dropout masks are keyed by the micro-batch, so the micro-batches of one step draw different masks.
        const LayerContext ctx{true, k > 0, static_cast<uint64_t>(p.step * accumulate + k)};
        const Tensor& out = model.forward(xb, ctx);
        {
          ProfileScope scope(&profiler, kLoss, exp.loss.type, "forward+backward");
          compute_loss(exp.loss, out, yb, 1.0 / static_cast<double>(n * micros), db, stats);
        }
        if (grad_sync && k == micros - 1) grad_sync->arm();  // earlier micro-batches accumulate locally
        model.backward(db, ctx);
        step_samples += n;
      }
      if (grad_sync) grad_sync->finish();
      p.micro_done += micros;
      Outcome outcome = Outcome::ok;
      {
        ProfileScope scope(&profiler, kOptimizer, exp.optimizer.type, "update");
        if (world > 1 && nccl) {  // the global batch's sums stay on the device; the host's numbers go by host
          nccl->allreduce_sum(stats.data<double>(), kGradSq, "the step's loss");  // slots before the gradient norm
          double shared[2] = {static_cast<double>(step_samples), stop_requested() ? 1.0 : 0.0};
          comm.allreduce_sum(shared, 2, "the step's sample count and stop flag");
          step_samples = static_cast<int64_t>(shared[0]);
          any_stop = shared[1] > 0;
        } else if (world > 1) {  // (CPU tensors) the global batch's sums, and whether any rank was asked to stop
          double* st = stats.data<double>();
          double shared[4] = {st[kLossSum], st[kHits], static_cast<double>(step_samples), stop_requested() ? 1.0 : 0.0};
          comm.allreduce_sum(shared, 4, "the step's loss and stop flag");
          st[kLossSum] = shared[0];
          st[kHits] = shared[1];
          step_samples = static_cast<int64_t>(shared[2]);
          any_stop = shared[3] > 0;
        }
        param_sq.zero_();
        optimizer->grad_norm_sq(grad_sq, param_sq);
        // The previous step's outcome, now that this one's work is queued (a skip of it needs nothing more here).
        const Outcome before = gpu ? resolve() : Outcome::ok;
        if (before == Outcome::diverged || before == Outcome::rolled_back) {
          (before == Outcome::diverged ? finished : restart) = true;
          break;
        }
        optimizer->step(lr, stats, exp.train.grad_clip);
        ops::accumulate_step(stats, window);
        stats_host.copy_from_async(stats);
        param_sq_host.copy_from_async(param_sq);
        stats_ready.record(device);
        pending = {true, p.step + 1, step_samples};
      }
      profiler.end_step();
      ++p.step;
      dirty = true;
      p.train_samples += step_samples;
      p.window_samples += step_samples;  // resolve() takes a skipped step's samples back out
      p.epoch_samples += step_samples;
      if (profiler.enabled() && (p.step + 1 == profile_end || p.step == total_steps)) finish_profile();
      const bool last = p.step == total_steps;
      const bool eval_due =
          data.test.size() > 0 && exp.train.eval_every > 0 && (p.step % exp.train.eval_every == 0 || last);
      const bool checkpoint_due = exp.checkpoint.every_steps > 0 && p.step % exp.checkpoint.every_steps == 0;
      if (!gpu || last || p.step % exp.train.log_every == 0 || eval_due || checkpoint_due ||
          p.micro_done == micro_per_epoch || stop_requested() || any_stop) {
        outcome = resolve();  // the host needs this step's outcome before it goes on
        if (outcome == Outcome::diverged || outcome == Outcome::rolled_back) {
          (outcome == Outcome::diverged ? finished : restart) = true;
          break;
        }
      }
      const bool skipped = outcome == Outcome::skipped;
      if ((p.step % exp.train.log_every == 0 || last) && p.window_samples > 0) {
        const double loss = close_window() / static_cast<double>(p.window_samples);
        const double rate = static_cast<double>(p.window_samples) / std::max(window_seconds, 1e-9);
        const double eta = static_cast<double>(total_steps - p.step) * p.train_seconds / static_cast<double>(p.step);
        const DeviceMemoryStats mem = device_memory_stats(device);
        const MonitorSample sample = monitor ? monitor->latest() : MonitorSample{};
        step_logger().info("epoch {}/{} | step {}/{} | loss {:.4f} | lr {:.4g} | grad_norm {:.3g}{} | "
                           "{:.0f} samples/s | {}elapsed {} | eta {}{}",
                           p.epoch + 1, exp.train.epochs, p.step, total_steps, loss, lr, p.grad_norm,
                           skipped ? " (skipped)" : "", rate,
                           gpu ? fmt::format("mem {:.0f} MiB (peak {:.0f}) | ", mib(mem.in_use), mib(mem.peak)) : "",
                           hms(seconds_since(wall_start)), hms(eta),
                           sample.seq > 0 ? " | " + summary_text(sample) : std::string());
        JsonObject row = JsonObject()
                          .add("type", "train")
                          .add("step", p.step)
                          .add("epoch", p.epoch + 1)
                          .add("loss", loss)
                          .add("lr", lr)
                          .add("grad_norm", p.grad_norm)
                          .add("samples_per_sec", rate)
                          .add("elapsed_s", seconds_since(wall_start));
        if (gpu) row.add("device_mem_mib", mib(mem.in_use)).add("device_peak_mib", mib(mem.peak));
        if (sample.seq > 0) append_fields(row, sample);
        if (world > 1 && !setup.threaded && exp.logging.gpu_metrics) add_rank_fields(row, comm, sample, device);
        metrics.write(row);
        p.window_samples = 0;
        window_seconds = 0;
        restart_clock();
      }
      if (bar && (p.micro_done == micro_per_epoch || last))
        bar->finish(bar_state(true));  // before the epoch's eval and checkpoint lines
      else if (bar && bar->due())
        bar->show(bar_state(false));
      if (data.test.size() > 0 && exp.train.eval_every > 0 && (p.step % exp.train.eval_every == 0 || last)) {
        stop_clock();
        run_eval();
        restart_clock();
      }
      const bool epoch_checkpoint_next = p.micro_done == micro_per_epoch && exp.checkpoint.every_epochs > 0 &&
                                         (p.epochs_done + 1) % exp.checkpoint.every_epochs == 0;
      if (exp.checkpoint.every_steps > 0 && p.step % exp.checkpoint.every_steps == 0 && !last &&
          !epoch_checkpoint_next) {
        stop_clock();
        save_checkpoint();
        restart_clock();
      }
      if (last) {
        if (p.step < per_epoch * exp.train.epochs) sum.exit_reason = "max_steps";
        break;
      }
      if (const int sig = world > 1 ? (any_stop ? std::max(stop_requested(), 1) : 0) : stop_requested()) {
        stop_clock();
        spdlog::warn("{} received: stopping after step {}", sig > 1 ? signal_name(sig) : "a stop on another rank",
                     p.step);
        sum.exit_reason = "interrupted";
        finished = true;
        break;
      }
    }
    if (restart) continue;
    if (finished) break;
    // The end of the epoch (or of the run, at max_steps): the log window's remainder joins the epoch's loss.
    if (p.window_samples > 0)
      close_window();
    else
      stop_clock();
    p.window_samples = 0;
    p.final_train_loss = p.epoch_loss / static_cast<double>(std::max<int64_t>(p.epoch_samples, 1));
    if (data.test.size() > 0 && exp.train.eval_every == 0 && p.last_eval_step != p.step) run_eval();
    p.epochs_done = p.epoch + 1;
    if (p.micro_done < micro_per_epoch) {  // max_steps ended the run inside the epoch: a resume continues it
      dirty = true;
      break;
    }
    p.epoch += 1;
    p.micro_done = 0;
    p.epoch_loss = 0;
    p.epoch_samples = 0;
    dirty = true;
    if (exp.checkpoint.every_epochs > 0 && p.epochs_done % exp.checkpoint.every_epochs == 0 &&
        p.step < total_steps && p.epoch < exp.train.epochs)
      save_checkpoint();
    if (const int sig = world > 1 ? 0 : stop_requested(); sig && p.step < total_steps && p.epoch < exp.train.epochs) {
      spdlog::warn("{} received: stopping after step {}", signal_name(sig), p.step);
      sum.exit_reason = "interrupted";
      break;
    }
  }
  bar.reset();  // an interrupted epoch's bar stays on the screen as it was
  if (grad_sync && lead && p.step > 0 && !nccl)  // (NCCL's all-reduces run on a side stream the host never waits on)
    spdlog::info("all-reduce: {:.1f} ms per step, {:.0f}% of it hidden behind backward",
                 1e3 * grad_sync->comm_seconds() / static_cast<double>(p.step),
                 std::max(0.0, 100.0 * (1.0 - grad_sync->exposed_seconds() /
                                                   std::max(grad_sync->comm_seconds(), 1e-12))));
  if (sum.exit_reason == "diverged") {
    if (lead) write_summary(dir, exp, sum, p, threads, world, seconds_since(wall_start));
    if (lead && exp.logging.report) write_report_logged(dir.string());
    return sum;
  }
  if (dirty) save_checkpoint();  // the final one (or the one an interruption resumes from)

  if (lead) {
    // The final weights, in a format PyTorch's safetensors (and numpy) read; written before summary.json so that a
    // summary always means the weights are there.
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    for (auto& [name, t] : model.state_tensors()) tensors.emplace_back(name, t);
    write_safetensors((dir / "model.safetensors").string(), tensors,
                      {{"format", "pt"}, {"gputrain_version", GPUTRAIN_VERSION}, {"name", exp.name},
                       {"steps", std::to_string(p.step)}});
  }
  if (lead) write_summary(dir, exp, sum, p, threads, world, seconds_since(wall_start));
  if (lead && exp.logging.report) write_report_logged(dir.string());
  spdlog::info("{}: {} steps, {:.0f} samples/s, final train loss {:.4f}{} → {}",
               sum.exit_reason == "interrupted" ? "interrupted (resume with --resume auto)" : "done", sum.steps,
               sum.samples_per_sec, sum.final_train_loss,
               sum.test_accuracy ? fmt::format(", test accuracy {:.4f}", *sum.test_accuracy) : std::string(),
               sum.run_dir);
  return sum;
}

// Thrown by a thread communicator's collective when another worker failed: not the failure to report.
bool is_peer_failure(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const PeerFailure&) {
    return true;
  } catch (...) {
    return false;
  }
}

// One process, several devices: one worker thread per device, each the same train_worker as a rank of an mpirun,
// meeting in thread communicators. The data is loaded once and shared (read only); rank 0 writes the run directory.
RunSummary run_workers(const Experiment& exp, const RunOptions& opts) {
  const int n = static_cast<int>(exp.devices.size());
  const LoadedData data = load_data(exp);
  const std::vector<std::unique_ptr<Communicator>> comms = make_thread_comms(n, exp.dist.timeout_s);
  const int threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency());
  WorkerSetup setup;
  setup.data = &data;
  setup.threaded = true;
  for (const std::string& d : exp.devices)
    if (d.rfind("cuda:", 0) == 0) setup.process_gpus.push_back(std::stoi(d.substr(5)));

  std::mutex mutex;
  std::condition_variable cv;
  int running = n;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  RunSummary result;
  install_stop_handlers();
  std::vector<std::thread> workers;
  for (int i = 0; i < n; ++i)
    workers.emplace_back([&, i] {
      set_thread_log_rank(i);
      RunOptions o = opts;
      o.comm = comms[static_cast<size_t>(i)].get();
      o.local_rank = i;
      o.threads = std::max(1, threads / n);  // the cores are shared out
      WorkerSetup w = setup;
      w.device = exp.devices[static_cast<size_t>(i)];
      try {
        RunSummary s = train_worker(exp, o, w);
        if (i == 0) result = std::move(s);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
        comms[static_cast<size_t>(i)]->abort(1);  // the others' collectives throw instead of waiting
      }
      std::lock_guard<std::mutex> lock(mutex);
      --running;
      cv.notify_all();
    });
  {
    // After a failure the others leave at their next collective (at once: it throws); one that is stuck cannot be
    // joined, so the process ends after a grace period, as mpirun ends the ranks of a failed job.
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return running == 0 || std::any_of(errors.begin(), errors.end(), [](auto& e) { return !!e; }); });
    const double grace = std::min(exp.dist.timeout_s, 10.0);
    if (running > 0 && !cv.wait_for(lock, std::chrono::duration<double>(grace), [&] { return running == 0; })) {
      for (size_t i = 0; i < errors.size(); ++i)
        if (errors[i] && !is_peer_failure(errors[i])) try {
            std::rethrow_exception(errors[i]);
          } catch (const std::exception& e) {
            spdlog::error("{}", e.what());
          }
      spdlog::error("{} worker(s) did not stop within {:.0f} s of the failure", running, grace);
      spdlog::default_logger()->flush();
      std::_Exit(3);
    }
  }
  for (std::thread& t : workers) t.join();
  remove_stop_handlers();
  for (const auto& e : errors)  // the first worker's own failure, not the others' "rank r failed"
    if (e && !is_peer_failure(e)) std::rethrow_exception(e);
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return result;
}

}  // namespace

RunSummary run_training(const Experiment& exp, const RunOptions& opts) {
  const int world = opts.comm ? opts.comm->size() : 1;
  if (!exp.devices.empty() && world == 1) return run_workers(exp, opts);  // also a list of one: the same path
  WorkerSetup setup;
  setup.device = exp.device;
  if (!exp.devices.empty()) {  // under a launcher, rank r of a node takes the device at its local rank
    if (opts.local_rank >= static_cast<int>(exp.devices.size()))
      throw Error(ErrorKind::distributed,
                  fmt::format("device {}: local rank {} has no device in the list of {}", exp.devices.size() == 1
                                                                                              ? exp.devices[0]
                                                                                              : "list",
                              opts.local_rank, exp.devices.size()));
    setup.device = exp.devices[static_cast<size_t>(opts.local_rank)];
  } else if (world > 1 && exp.device == "cuda") {
    setup.device = fmt::format("cuda:{}", opts.local_rank);  // one GPU per rank of a node
  } else if (world > 1 && exp.device == "auto") {
    std::string reason;
    if (resolve_device("auto", reason).is_cuda()) setup.device = fmt::format("cuda:{}", opts.local_rank);
  }
  return train_worker(exp, opts, setup);
}

}  // namespace gt
