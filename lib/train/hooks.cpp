// The hooks around a run's steps: the log line and metrics rows, the progress bar, checkpoints and the profile.
#include "train/hooks.h"

#include "core/atomic_file.h"
#include "core/json.h"
#include "graph/model.h"
#include "log/logging.h"
#include "ops/device_memory.h"
#include "ops/devices.h"
#include "optim/optimizer.h"
#include "parallel/zero.h"
#include "profile/profiler.h"
#include "train/setup.h"

#include <algorithm>
#include <filesystem>
#include <limits>

namespace gt {
namespace fs = std::filesystem;

double seconds_since(RunClock::time_point t) { return std::chrono::duration<double>(RunClock::now() - t).count(); }

void TrainClock::stop() {
  const double dt = seconds_since(m_start);
  m_window_seconds += dt;
  m_progress.train_seconds += dt;
}

namespace {

double mib(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

std::string hms(double s) {
  const auto t = static_cast<int64_t>(s + 0.5);
  return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
}

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
  const double fields[kPerRank] = {s.seq > 0 ? s.host.rss_mib : nan,
                                   v(s.host.cpu_pct),
                                   s.seq > 0 ? static_cast<double>(s.host.threads) : nan,
                                   device.is_cuda() ? static_cast<double>(device.index) : -1.0,
                                   g ? v(g->util_pct) : nan,
                                   g ? v(g->mem_used_mib) : nan,
                                   g ? v(g->temp_c) : nan,
                                   g ? v(g->power_w) : nan,
                                   g ? v(g->sm_clock_mhz) : nan};
  std::copy(std::begin(fields), std::end(fields), mine);
  comm.allreduce_sum(all.data(), all.size(), "the ranks' GPU and host metrics");
  if (comm.rank() != 0) return;
  for (size_t r = 1; r < world; ++r) {
    const double* f = all.data() + r * kPerRank;
    const std::string pre = fmt::format("rank{}_", r);
    row.add(pre + "host_rss_mib", f[0]).add(pre + "host_cpu_pct", f[1]).add(pre + "host_threads", f[2]);
    if (f[3] < 0) continue;
    const std::string gp = fmt::format("{}gpu{}_", pre, static_cast<int>(f[3]));
    row.add(gp + "util", f[4])
        .add(gp + "mem_used_mib", f[5])
        .add(gp + "temp_c", f[6])
        .add(gp + "power_w", f[7])
        .add(gp + "sm_clock_mhz", f[8]);
  }
}

}  // namespace

RunReporter::RunReporter(const Experiment& exp, const RunSetup& setup, const std::string& run_dir, bool threaded,
                         const std::vector<int>& process_gpus, RunClock::time_point wall_start)
    : m_metrics(setup.lead ? run_dir : std::string(), exp.logging.jsonl, exp.logging.tensorboard),
      m_run_dir(run_dir),
      m_epochs(exp.train.epochs),
      m_device(setup.device),
      m_comm(*setup.comm),
      m_rank_fields(setup.world > 1 && !threaded && exp.logging.gpu_metrics),
      m_wall_start(wall_start) {
  if (exp.logging.gpu_metrics && (setup.lead || !threaded)) {  // one sampler per process
    std::vector<int> gpus = process_gpus;
    if (gpus.empty() && m_device.is_cuda()) gpus = {m_device.index};
    m_monitor.emplace(gpus.empty() ? std::vector<GpuTarget>{} : gpu_targets(query_cuda(), gpus),
                      exp.logging.interval_s);
    m_monitor->start();
  }
  m_tokens_per_sample = setup.train().tokens ? setup.train().tokens->block_size() : 0;
  m_flops_per_sample = 3.0 * static_cast<double>(setup.model.forward_flops());
  double peak = exp.train.peak_tflops;
  if (peak <= 0 && m_device.is_cuda()) {
    const CudaInfo cuda = query_cuda();
    if (m_device.index < static_cast<int>(cuda.devices.size()))
      if (const auto known = known_peak(cuda.devices[static_cast<size_t>(m_device.index)].name))
        peak = known->at(exp.train.precision);
  }
  m_peak_flops = peak * 1e12 * setup.world;
}

void RunReporter::continue_metrics(const TrainProgress* resumed) {
  const std::string path = (fs::path(m_run_dir) / "metrics.jsonl").string();
  if (resumed) {
    if (m_metrics.bytes() < resumed->metrics_bytes)
      spdlog::warn("{}: shorter than when the checkpoint was written; rows are missing", path);
    else
      m_metrics.truncate(resumed->metrics_bytes);
    m_metrics.resume_after(resumed->step);
  } else if (m_metrics.bytes() > 0) {
    spdlog::warn("{}: rows of an earlier start without a checkpoint are dropped", path);
    m_metrics.truncate(0);
    m_metrics.resume_after(0);
  }
}

void RunReporter::log_train(const TrainProgress& p, int64_t total_steps, const LogWindow& w) {
  const bool gpu = m_device.is_cuda();
  const double eta = static_cast<double>(total_steps - p.step) * p.train_seconds / static_cast<double>(p.step);
  const DeviceMemoryStats mem = device_memory_stats(m_device);
  const MonitorSample sample = m_monitor ? m_monitor->latest() : MonitorSample{};
  const double tokens_per_sec = w.samples_per_sec * static_cast<double>(m_tokens_per_sample);
  const double mfu = m_peak_flops > 0 ? w.samples_per_sec * m_flops_per_sample / m_peak_flops : 0;
  std::string rate = fmt::format("{:.0f} samples/s", w.samples_per_sec);
  if (m_tokens_per_sample > 0)
    rate = fmt::format("{:.0f} tok/s | {}", tokens_per_sec,
                       mfu > 0 ? fmt::format("MFU {:.1f}%", 100 * mfu) : std::string("MFU: unknown peak"));
  step_logger().info(
      "epoch {}/{} | step {}/{} | loss {:.4f} | lr {:.4g} | grad_norm {:.3g}{}{} | {} | {}elapsed {} | eta {}{}",
      p.epoch + 1, m_epochs, p.step, total_steps, w.loss, w.lr, p.grad_norm, w.skipped ? " (skipped)" : "",
      p.loss_scale > 0 ? fmt::format(" | loss_scale {:g} ({} overflow skips)", p.loss_scale, p.overflow_skips) : "",
      rate, gpu ? fmt::format("mem {:.0f} MiB (peak {:.0f}) | ", mib(mem.in_use), mib(mem.peak)) : "",
      hms(seconds_since(m_wall_start)), hms(eta), sample.seq > 0 ? " | " + summary_text(sample) : std::string());
  JsonObject row = JsonObject()
                       .add("type", "train")
                       .add("step", p.step)
                       .add("epoch", p.epoch + 1)
                       .add("loss", w.loss)
                       .add("lr", w.lr)
                       .add("grad_norm", p.grad_norm)
                       .add("samples_per_sec", w.samples_per_sec)
                       .add("data_wait_ms", w.data_wait_ms)
                       .add("train_s", w.train_s)
                       .add("eval_s", w.eval_s)
                       .add("checkpoint_s", w.checkpoint_s)
                       .add("elapsed_s", seconds_since(m_wall_start));
  if (p.loss_scale > 0) row.add("loss_scale", p.loss_scale).add("overflow_skips", p.overflow_skips);
  if (m_tokens_per_sample > 0) row.add("tokens_per_sec", tokens_per_sec);
  if (m_tokens_per_sample > 0 && mfu > 0) row.add("mfu", mfu);
  if (gpu) row.add("device_mem_mib", mib(mem.in_use)).add("device_peak_mib", mib(mem.peak));
  if (sample.seq > 0) append_fields(row, sample);
  if (m_rank_fields) add_rank_fields(row, m_comm, sample, m_device);
  m_metrics.write(row);
}

ProgressBar::ProgressBar(bool live, const StepPlan& plan, const TrainClock& clock, const GpuMonitor* monitor,
                         RunClock::time_point wall_start)
    : m_plan(plan), m_clock(clock), m_monitor(monitor), m_wall_start(wall_start) {
  if (live) m_display.emplace();
}

void ProgressBar::start_epoch(const TrainProgress& p) {
  m_t0 = p.train_seconds;
  m_loss = 0;
  m_samples = 0;
  m_s0 = p.epoch_samples;
}

void ProgressBar::add_step(double loss_sum, int64_t samples) {
  m_loss += loss_sum;
  m_samples += samples;
}

void ProgressBar::after_step(const TrainProgress& p, bool epoch_end) {
  if (m_display && epoch_end) {
    ProgressState s = state(p);
    s.done = true;
    m_display->finish(s);
  } else if (m_display && m_display->due()) {
    m_display->show(state(p));
  }
}

ProgressState ProgressBar::state(const TrainProgress& p) const {
  const double train_s = m_clock.train_seconds();
  ProgressState s;
  s.epoch = p.epoch + 1;
  s.epochs = m_plan.epochs;
  s.step = (p.micro_done + m_plan.accumulate - 1) / m_plan.accumulate;
  s.steps = m_plan.per_epoch;
  if (m_samples > 0) s.loss = m_loss / static_cast<double>(m_samples);
  if (train_s > m_t0) s.samples_per_sec = static_cast<double>(p.epoch_samples - m_s0) / (train_s - m_t0);
  if (m_monitor) s.gpu = progress_gpu_text(m_monitor->latest());
  s.elapsed_s = seconds_since(m_wall_start);
  if (p.step > 0) s.eta_s = static_cast<double>(m_plan.total_steps - p.step) * train_s / static_cast<double>(p.step);
  return s;
}

CheckpointHook::CheckpointHook(const Experiment& exp, RunSetup& setup, const std::string& run_dir)
    : m_comm(*setup.comm),
      m_model(setup.model),
      m_optimizer(*setup.optimizer),
      m_optimizer_type(exp.optimizer.type),
      m_resolved_config(setup.resolved_config),
      m_cfg(exp.checkpoint),
      m_store(run_dir, exp.checkpoint, setup.world, setup.batch, exp.train.accumulate),
      m_run_dir(run_dir),
      m_lead(setup.lead),
      m_dirty(!setup.plan.from) {}

void CheckpointHook::save(TrainProgress& p, uint64_t metrics_bytes) {
  if (m_cfg.keep_best != KeepBest::none) {
    const bool acc = m_cfg.keep_best == KeepBest::test_accuracy;
    const std::optional<double> v = acc ? p.test_accuracy : p.test_loss;
    if (v && (!p.best_value || (acc ? *v > *p.best_value : *v < *p.best_value))) {
      p.best_value = v;
      p.best_step = p.step;
    }
  }
  p.metrics_bytes = metrics_bytes;
  p.optimizer_steps = m_optimizer.steps_taken();
  if (auto* zero = dynamic_cast<ZeroOptimizer*>(&m_optimizer)) {
    save_sharded(*zero, p);
  } else if (m_lead) {  // the state it holds is the same on every rank
    const auto t0 = RunClock::now();
    const std::string where = m_store.save(m_model, m_optimizer, m_optimizer_type, p, m_resolved_config);
    spdlog::info("checkpoint {} ({:.0f} ms)", where, 1e3 * seconds_since(t0));
  }
  m_dirty = false;
  m_rollbacks = 0;
}

void CheckpointHook::save_sharded(ZeroOptimizer& zero, TrainProgress& p) {
  const auto t0 = RunClock::now();
  const int world = m_comm.size(), rank = m_comm.rank();
  // 1. Rank 0 makes the temporary folder; the others wait for it (and learn when it could not).
  std::string error;
  if (m_lead) try {
      m_store.begin(p.step);
    } catch (const Error& e) {
      error = e.what();
    }
  double ready = error.empty() ? 1 : 0;
  m_comm.broadcast(&ready, sizeof ready, 0, "the checkpoint folder");
  if (ready == 0) throw Error(m_lead ? error : fmt::format("rank 0 could not start checkpoint step-{}", p.step));
  // 2. Every rank writes its shard beside it; the sizes and checksums go to rank 0 for state.json.
  const std::string name = shard_file_name(rank, world);
  CheckpointInfo::File mine;
  try {
    mine = write_shard_file((std::filesystem::path(m_store.folder(p.step)) / name).string(), name, zero.shard_pieces());
  } catch (const Error& e) {
    error = e.what();
  }
  const double sent[3] = {error.empty() ? 1.0 : 0.0, static_cast<double>(mine.bytes),
                          mine.crc32.empty() ? 0.0 : static_cast<double>(std::stoul(mine.crc32, nullptr, 16))};
  std::vector<double> all(3 * static_cast<size_t>(world));
  m_comm.allgather(sent, all.data(), 3, "the checkpoint's shard files");
  for (int r = 0; r < world; ++r)
    if (all[3 * static_cast<size_t>(r)] == 0) {
      if (m_lead) m_store.abandon(p.step);
      throw Error(r == rank ? error
                            : fmt::format("rank {} could not write its shard of checkpoint step-{}", r, p.step));
    }
  if (!m_lead) return;
  // 3. Rank 0 writes the model and state.json, with how the state was cut, and renames the folder into place.
  CheckpointInfo::Shards shards;
  shards.world_size = world;
  shards.stage = zero.stage();
  shards.buffers = zero.buffers();
  const auto chunks = zero.bucket_chunks();
  const auto buckets = zero.bucket_params();
  for (size_t b = 0; b < buckets.size(); ++b) {
    CheckpointInfo::Shards::Bucket out;
    out.chunk = static_cast<int64_t>(chunks[b]);
    for (size_t i : buckets[b]) {
      out.params.push_back(static_cast<int64_t>(i));
      out.sizes.push_back(zero.param_numel(i));
    }
    shards.buckets.push_back(std::move(out));
  }
  for (int r = 0; r < world; ++r) {
    const auto at = 3 * static_cast<size_t>(r);
    shards.files.push_back({shard_file_name(r, world), static_cast<uint64_t>(all[at + 1]),
                            fmt::format("{:08x}", static_cast<uint32_t>(all[at + 2]))});
  }
  const std::string where = m_store.save(m_model, m_optimizer, m_optimizer_type, p, m_resolved_config, &shards);
  spdlog::info("checkpoint {} ({:.0f} ms, optimizer state in {} shards)", where, 1e3 * seconds_since(t0), world);
}

std::string CheckpointHook::roll_back(TrainProgress& p) {
  const CheckpointInfo back = require_newest_good_of_run(m_run_dir, m_cfg);
  const double lr_scale = p.lr_scale * 0.5;
  m_optimizer.settle();  // (a delayed update must not write the state the load brings)
  if (auto* zero = dynamic_cast<ZeroOptimizer*>(&m_optimizer)) zero->gather_values();  // dist.zero 3: loaded whole
  load_checkpoint(back, m_model, m_optimizer);
  m_optimizer.take_weights();  // dist.zero 3's shards, dist.offload's masters
  p = back.progress;
  p.lr_scale = lr_scale;
  if (m_lead) m_store.remove_after(p.step);  // the newer ones lead to the divergence
  m_dirty = false;
  return back.dir;
}

void finish_profile(Profiler& profiler, const std::string& run_dir, bool lead, int64_t profile_start) {
  profiler.enable(false);
  if (!lead) return;
  const fs::path dir = run_dir;
  write_file_atomic((dir / "trace.json").string(), profiler.chrome_trace());
  const std::string table = profiler.table();
  write_file_atomic((dir / "profile.txt").string(), table);
  spdlog::info("profile of steps {}–{} (trace.json opens in Perfetto):\n{}", profile_start,
               profile_start + profiler.steps() - 1, table);
}

}  // namespace gt
