// The training loop: seeded batches → forward → loss → backward → SGD, with logging and per-epoch evaluation.
#include "train/trainer.h"

#include "core/parallel.h"
#include "graph/model.h"
#include "io/safetensors.h"
#include "log/logging.h"
#include "ops/devices.h"
#include "optim/optimizer.h"
#include "profile/profiler.h"
#include "train/loss.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

namespace gt {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

// Writes a whole file through a temporary and a rename, so readers never see half of it.
void write_file_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!(f << text) || !f.flush()) throw Error(fmt::format("{}: write failed", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error(fmt::format("{}: cannot rename into place: {}", path.string(), ec.message()));
}

class MetricsFile {
 public:
  explicit MetricsFile(const fs::path& path) : m_path(path.string()), m_out(path, std::ios::app) {
    if (!m_out) throw Error(fmt::format("{}: cannot open for writing", m_path));
  }
  void write(const JsonObject& obj) {
    m_out << obj.str() << '\n';
    m_out.flush();
    if (!m_out) throw Error(fmt::format("{}: write failed", m_path));
  }

 private:
  std::string m_path;
  std::ofstream m_out;
};

struct EvalResult {
  double loss = 0;
  std::optional<double> accuracy;
};

EvalResult evaluate(Model& model, const Experiment& exp, const Dataset& test, Tensor& x, Tensor& y, Tensor& stats) {
  Loader loader(test, x.dim(0), false, exp.seed);
  loader.start_epoch(0);
  stats.zero_();
  const LayerContext ctx{false, false, 0};
  Tensor none;
  for (int64_t n; (n = loader.next(x, y)) > 0;) {
    const Tensor& out = model.forward(x.narrow0(n), ctx);
    compute_loss(exp.loss, out, y.narrow0(n), 1.0, none, stats);
  }
  const double* s = stats.data<double>();
  EvalResult r;
  r.loss = s[0] / static_cast<double>(test.size());
  if (test.num_classes > 0) r.accuracy = s[1] / static_cast<double>(test.size());
  return r;
}

}  // namespace

Device resolve_device(const std::string& requested, std::string& reason) {
  if (requested == "cpu") {
    reason = "requested";
    return Device::cpu();
  }
  const CudaInfo cuda = query_cuda();
  if (requested == "auto") {
    if (cuda.devices.empty()) {
      reason = "auto: " + cuda.problem;
    } else {
      reason = fmt::format("auto: {} CUDA device(s) found, but this build trains on the CPU only (the CUDA kernels "
                           "are not in it yet)",
                           cuda.devices.size());
    }
    return Device::cpu();
  }
  if (cuda.devices.empty()) throw Error(fmt::format("device {}: no usable GPU: {}", requested, cuda.problem));
  throw Error(fmt::format("device {}: training on CUDA is not in this build yet; use device: cpu or auto",
                          requested));
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

void load_weights(Model& model, const std::string& path) {
  const auto file = read_safetensors(path);
  std::map<std::string, const Tensor*> in_file;
  for (const auto& [name, t] : file) in_file[name] = &t;
  std::vector<std::string> problems;
  const auto wanted = model.state_tensors();
  for (const auto& [name, t] : wanted) {
    auto it = in_file.find(name);
    if (it == in_file.end()) {
      problems.push_back(name + ": missing from the file");
      continue;
    }
    if (it->second->shape() != t->shape() || it->second->dtype() != t->dtype())
      problems.push_back(fmt::format("{}: {} {} in the file, {} {} in the model", name,
                                     dtype_name(it->second->dtype()), it->second->shape().str(), dtype_name(t->dtype()),
                                     t->shape().str()));
    in_file.erase(it);
  }
  for (const auto& [name, t] : in_file) problems.push_back(name + ": in the file but not in the model");
  if (!problems.empty()) {
    std::string list;
    for (size_t i = 0; i < problems.size() && i < 20; ++i) list += "; " + problems[i];
    throw DataError(fmt::format("{}: does not match the model ({} difference{}){}{}", path, problems.size(),
                                problems.size() == 1 ? "" : "s", list, problems.size() > 20 ? "; …" : ""));
  }
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : file) by_name[name] = &t;
  for (const auto& [name, t] : wanted) t->copy_from(*by_name.at(name));  // every name was matched above
}

EvalSummary evaluate_weights(const Experiment& exp, const std::string& weights_path, int threads) {
  set_num_threads(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
  std::string reason;
  const Device device = resolve_device(exp.device, reason);
  const LoadedData data = load_data(exp);
  if (data.test.size() == 0) exp.root["data"].fail("eval needs a test set (data.test, or test_samples for synthetic)");
  Model model = Model::build(exp.root["model"], data.train.input_shape(), DType::f32, device, exp.seed);
  check_loss_fits(exp.loss, model.output_shape(), data.train, exp.root.has("loss") ? exp.root["loss"] : exp.root);
  load_weights(model, weights_path);
  const int64_t batch = exp.data.batch_size;
  model.allocate(batch);
  Tensor x = Tensor::empty(data.test.input_shape().batched(batch), DType::f32, device);
  Tensor y = Tensor::empty(data.test.target_shape().batched(batch), data.test.targets.dtype(), device);
  Tensor stats = Tensor::zeros(Shape{2}, DType::f64, device);
  const EvalResult r = evaluate(model, exp, data.test, x, y, stats);
  return {data.test.size(), r.loss, r.accuracy};
}

RunSummary run_training(const Experiment& exp, const RunOptions& opts) {
  const auto wall_start = Clock::now();
  const int threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency());
  set_num_threads(threads);

  std::string device_reason;
  const Device device = resolve_device(exp.device, device_reason);

  // Everything that can be wrong with the config is found before the run directory exists.
  LoadedData data = load_data(exp);
  Model model = Model::build(exp.root["model"], data.train.input_shape(), DType::f32, device, exp.seed);
  const ConfigNode loss_where = exp.root.has("loss") ? exp.root["loss"] : exp.root["model"]["layers"];
  check_loss_fits(exp.loss, model.output_shape(), data.train, loss_where);
  if (exp.data.augment.any() && data.train.input_shape().rank() != 3)
    exp.root["data"]["augment"].fail(fmt::format("augmentation works on [channels, height, width] images; the "
                                                 "samples are {}", data.train.input_shape().str()));

  RunSummary sum;
  sum.run_dir = make_run_dir(exp, opts.out_dir);
  sum.device = device.str();
  const fs::path dir = sum.run_dir;
  add_log_file((dir / "train.log").string());
  struct DetachLog {
    ~DetachLog() { remove_log_file(); }
  } detach_log;
  {
    YAML::Emitter em;
    em << resolved_config(exp, model.resolved_layers());
    write_file_atomic(dir / "config.resolved.yaml", std::string(em.c_str()) + "\n");
  }
  MetricsFile metrics(dir / "metrics.jsonl");

  const int64_t batch = exp.data.batch_size, accumulate = exp.train.accumulate;
  Loader loader(data.train, batch, exp.data.shuffle, exp.seed, exp.data.augment);
  const int64_t micro_per_epoch = loader.batches_per_epoch();
  const int64_t per_epoch = (micro_per_epoch + accumulate - 1) / accumulate;  // optimizer steps
  int64_t total_steps = per_epoch * exp.train.epochs;
  if (exp.train.max_steps > 0) total_steps = std::min(total_steps, exp.train.max_steps);

  spdlog::info("gputrain {}: run {} → {}", GPUTRAIN_VERSION, exp.name, sum.run_dir);
  spdlog::info("device {} ({}), {} CPU thread(s)", sum.device, device_reason, threads);
  spdlog::info("data: {} training samples of {}{}, batch {}{}, {} steps per epoch", data.train.size(),
               data.train.input_shape().str(),
               data.test.size() ? fmt::format(", {} test samples", data.test.size()) : std::string(), batch,
               accumulate > 1 ? fmt::format(" × {} accumulated = effective batch {}", accumulate, batch * accumulate)
                              : std::string(),
               per_epoch);
  spdlog::info("model: {} layers, {} parameters; loss {}; optimizer {} lr {}; schedule {}", model.nodes().size(),
               model.param_count(), exp.loss.type, exp.optimizer.type, exp.optimizer.lr, exp.scheduler.type);

  model.allocate(batch);
  const std::vector<Param*> params = model.params();
  auto optimizer = make_optimizer(exp.optimizer, params);
  Tensor x = Tensor::empty(data.train.input_shape().batched(batch), DType::f32, device);
  Tensor y = Tensor::empty(data.train.target_shape().batched(batch), data.train.targets.dtype(), device);
  Tensor dout = Tensor::empty(model.output_shape().batched(batch), DType::f32, device);
  Tensor stats = Tensor::zeros(Shape{2}, DType::f64, device);
  Tensor eval_stats = Tensor::zeros(Shape{2}, DType::f64, device);
  Tensor clip_scratch = Tensor::zeros(Shape{2}, DType::f64, device);
  Profiler profiler;
  model.set_profiler(&profiler);
  const int64_t profile_end = exp.train.profile_start + exp.train.profile_steps;  // steps are 1-based here
  static const std::string kData = "data", kLoss = "loss", kOptimizer = "optimizer", kTrainer = "trainer";
  auto finish_profile = [&] {
    profiler.enable(false);
    write_file_atomic(dir / "trace.json", profiler.chrome_trace());
    const std::string table = profiler.table();
    write_file_atomic(dir / "profile.txt", table);
    spdlog::info("profile of steps {}–{} (trace.json opens in Perfetto):\n{}", exp.train.profile_start,
                 exp.train.profile_start + profiler.steps() - 1, table);
  };

  auto run_eval = [&](int64_t epoch, int64_t step) {
    const EvalResult r = evaluate(model, exp, data.test, x, y, eval_stats);
    sum.test_loss = r.loss;
    sum.test_accuracy = r.accuracy;
    spdlog::info("eval epoch {}/{} | step {} | test_loss {:.4f} | test_accuracy {}", epoch + 1, exp.train.epochs, step,
                 r.loss, r.accuracy ? fmt::format("{:.4f}", *r.accuracy) : "n/a");
    metrics.write(JsonObject()
                      .add("type", "eval")
                      .add("step", step)
                      .add("epoch", epoch + 1)
                      .add("test_loss", r.loss)
                      .add("test_accuracy", r.accuracy));
  };

  // Loss statistics stay on the device and are read once per log line and once per epoch: the only syncs.
  // A log window never spans two epochs, so the epoch's loss is the sum of its windows.
  int64_t step = 0, train_samples = 0, last_eval_step = -1;
  double train_seconds = 0, grad_norm = 0;
  sum.exit_reason = "completed";
  for (int64_t epoch = 0; epoch < exp.train.epochs && sum.exit_reason == "completed"; ++epoch) {
    loader.start_epoch(epoch);
    double epoch_loss = 0;
    int64_t epoch_samples = 0, window_samples = 0, micro_done = 0;
    auto window_start = Clock::now();
    double window_seconds = 0;
    auto stop_clock = [&] {  // training time stops during evaluation
      const double dt = seconds_since(window_start);
      window_seconds += dt;
      train_seconds += dt;
    };
    auto close_window = [&] {
      stop_clock();
      const double loss_sum = stats.data<double>()[0];
      epoch_loss += loss_sum;
      stats.zero_();
      return loss_sum;
    };
    while (micro_done < micro_per_epoch) {
      // One optimizer step over up to `accumulate` micro-batches; each one's loss is its mean over the step's
      // micro-batches, so the gradient is the mean over the effective batch.
      const int64_t micros = std::min(accumulate, micro_per_epoch - micro_done);
      const double lr = scheduled_lr(exp.scheduler, exp.optimizer.lr, step, total_steps);
      if (exp.train.profile_steps > 0 && step + 1 == exp.train.profile_start) profiler.enable(true);
      const auto step_begin = Profiler::Clock::now();
      for (int64_t k = 0; k < micros; ++k) {
        int64_t n = 0;
        {
          ProfileScope scope(&profiler, kData, kTrainer, "load");
          n = loader.next(x, y);
        }
        const Tensor xb = x.narrow0(n), yb = y.narrow0(n);
        Tensor db = dout.narrow0(n);
        // Dropout masks are keyed by the micro-batch, so the micro-batches of one step draw different masks.
        const LayerContext ctx{true, k > 0, static_cast<uint64_t>(step * accumulate + k)};
        const Tensor& out = model.forward(xb, ctx);
        {
          ProfileScope scope(&profiler, kLoss, exp.loss.type, "forward+backward");
          compute_loss(exp.loss, out, yb, 1.0 / static_cast<double>(n * micros), db, stats);
        }
        model.backward(db, ctx);
        window_samples += n;
        epoch_samples += n;
        train_samples += n;
      }
      micro_done += micros;
      {
        ProfileScope scope(&profiler, kOptimizer, exp.optimizer.type, "update");
        if (exp.train.grad_clip > 0) grad_norm = clip_grad_norm(params, exp.train.grad_clip, clip_scratch);
        optimizer->step(lr);
      }
      profiler.record_step(step_begin, Profiler::Clock::now());
      ++step;
      if (profiler.enabled() && (step + 1 == profile_end || step == total_steps)) finish_profile();
      const bool last = step == total_steps;
      if (step % exp.train.log_every == 0 || last) {
        const double loss = close_window() / static_cast<double>(window_samples);
        const double rate = static_cast<double>(window_samples) / std::max(window_seconds, 1e-9);
        const double eta = static_cast<double>(total_steps - step) * train_seconds / static_cast<double>(step);
        spdlog::info("epoch {}/{} | step {}/{} | loss {:.4f} | lr {:.4g}{} | {:.0f} samples/s | elapsed {} | eta {}",
                     epoch + 1, exp.train.epochs, step, total_steps, loss, lr,
                     exp.train.grad_clip > 0 ? fmt::format(" | grad_norm {:.3g}", grad_norm) : std::string(), rate,
                     hms(seconds_since(wall_start)), hms(eta));
        JsonObject row;
        row.add("type", "train").add("step", step).add("epoch", epoch + 1).add("loss", loss).add("lr", lr);
        if (exp.train.grad_clip > 0) row.add("grad_norm", grad_norm);
        metrics.write(row.add("samples_per_sec", rate).add("elapsed_s", seconds_since(wall_start)));
        window_samples = 0;
        window_seconds = 0;
        window_start = Clock::now();
      }
      if (data.test.size() > 0 && exp.train.eval_every > 0 && (step % exp.train.eval_every == 0 || last)) {
        stop_clock();
        run_eval(epoch, step);
        last_eval_step = step;
        window_start = Clock::now();
      }
      if (last) {
        if (step < per_epoch * exp.train.epochs) sum.exit_reason = "max_steps";
        break;
      }
    }
    if (window_samples > 0)
      close_window();
    else
      stop_clock();
    sum.final_train_loss = epoch_loss / static_cast<double>(std::max<int64_t>(epoch_samples, 1));
    sum.epochs = epoch + 1;
    if (data.test.size() > 0 && exp.train.eval_every == 0 && last_eval_step != step) {
      run_eval(epoch, step);
      last_eval_step = step;
    }
  }
  sum.steps = step;
  sum.samples_per_sec = static_cast<double>(train_samples) / std::max(train_seconds, 1e-9);
  sum.wall_seconds = seconds_since(wall_start);

  {
    // The final weights, in a format PyTorch's safetensors (and numpy) read; written before summary.json so that a
    // summary always means the weights are there.
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    for (auto& [name, t] : model.state_tensors()) tensors.emplace_back(name, t);
    write_safetensors((dir / "model.safetensors").string(), tensors,
                      {{"format", "pt"}, {"gputrain_version", GPUTRAIN_VERSION}, {"name", exp.name},
                       {"steps", std::to_string(step)}});
  }
  write_file_atomic(dir / "summary.json", JsonObject()
                                              .add("name", exp.name)
                                              .add("device", sum.device)
                                              .add("world_size", 1)
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
  spdlog::info("done: {} steps, {:.0f} samples/s, final train loss {:.4f}{} → {}", sum.steps, sum.samples_per_sec,
               sum.final_train_loss,
               sum.test_accuracy ? fmt::format(", test accuracy {:.4f}", *sum.test_accuracy) : std::string(),
               sum.run_dir);
  return sum;
}

}  // namespace gt
