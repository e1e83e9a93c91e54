// What a training run does around its steps, each when the loop says it is due: the training clock, the step log line
// and metrics rows, the progress bar, checkpoints, and the profile.
#pragma once

#include "parallel/comm.h"
#include "log/gpu_monitor.h"
#include "log/metrics.h"
#include "log/progress.h"
#include "train/checkpoint.h"
#include "train/experiment.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gt {

class Communicator;
class Model;
class Optimizer;
class Profiler;
class RunSetup;
class ZeroOptimizer;
struct StepPlan;

using RunClock = std::chrono::steady_clock;

/// Seconds from `t` to now.
double seconds_since(RunClock::time_point t);

/// The training clock: it runs during steps only (evaluation and checkpoints stop it), and what it measures goes to
/// the log window's seconds and to the progress's train_seconds.
class TrainClock {
 public:
  explicit TrainClock(TrainProgress& progress) : m_progress(progress) {}
  void restart() { m_start = RunClock::now(); }
  /// Adds the time since the last restart to the window and the progress.
  void stop();
  double window_seconds() const { return m_window_seconds; }
  void clear_window() { m_window_seconds = 0; }
  /// The run's training seconds, counting the time since the last restart.
  double train_seconds() const { return m_progress.train_seconds + seconds_since(m_start); }

 private:
  TrainProgress& m_progress;
  RunClock::time_point m_start = RunClock::now();
  double m_window_seconds = 0;
};

/// A closed log window, as the step line and the train row show it.
struct LogWindow {
  double loss = 0;             ///< mean over the window's samples
  double lr = 0;               ///< of its last step
  double samples_per_sec = 0;  ///< its samples (across epoch boundaries) over its training time
  double data_wait_ms = 0;     ///< per step: the host's time getting its batches ready (gather, scale, augment, copy)
  double train_s = 0;          ///< its training time: the rate's denominator
  double eval_s = 0, checkpoint_s = 0;  ///< wall time in evaluations and checkpoint writes since the last row
  bool skipped = false;                 ///< its last step was skipped
};

/// Where the run's numbers go: the periodic step line (train.log, and the console unless the progress bar stands for
/// it), metrics.jsonl and TensorBoard, with GPU and host metrics from a background sampler (never on the step's path).
class RunReporter {
 public:
  RunReporter(const Experiment& exp, const RunSetup& setup, const std::string& run_dir, bool threaded,
              const std::vector<int>& process_gpus, RunClock::time_point wall_start);

  MetricsSink& metrics() { return m_metrics; }
  /// The sampler, when logging.gpu_metrics runs one in this worker (one per process).
  const GpuMonitor* monitor() const { return m_monitor ? &*m_monitor : nullptr; }
  /// Cuts metrics.jsonl back to where the checkpoint of `resumed` (nullptr: a fresh start, which drops the rows of
  /// an earlier start without a checkpoint) left it, so the rows of steps done again appear once.
  void continue_metrics(const TrainProgress* resumed);
  /// The step line and the train row of a closed log window; with several processes a collective (the other ranks'
  /// sampler readings join rank 0's row).
  void log_train(const TrainProgress& p, int64_t total_steps, const LogWindow& w);

 private:
  MetricsSink m_metrics;
  std::optional<GpuMonitor> m_monitor;
  std::string m_run_dir;
  int64_t m_epochs = 0;
  Device m_device;
  Communicator& m_comm;
  bool m_rank_fields = false;  ///< rank 0's rows carry the other processes' sampler readings
  RunClock::time_point m_wall_start;
  // Token runs: tokens/s and the model FLOPs utilisation (3 × the graph's forward FLOPs per sample — 6N plus the
  // attention — over the peak of every device of the job; 0 = unknown peak).
  int64_t m_tokens_per_sample = 0;
  double m_flops_per_sample = 0, m_peak_flops = 0;
};

/// The live progress display (rank 0, stdout a terminal), which stands for the periodic step lines on the console.
/// Its loss is the epoch's mean over the steps resolved so far; its rate counts training time only.
class ProgressBar {
 public:
  /// Nothing is shown unless `live`.
  ProgressBar(bool live, const StepPlan& plan, const TrainClock& clock, const GpuMonitor* monitor,
              RunClock::time_point wall_start);
  void start_epoch(const TrainProgress& p);
  /// A step resolved as finite: its loss sum over its samples joins the epoch's mean.
  void add_step(double loss_sum, int64_t samples);
  /// After a step: the epoch's final line at its end (before the epoch's eval and checkpoint lines), else a
  /// redraw when one is due.
  void after_step(const TrainProgress& p, bool epoch_end);
  /// Leaves the bar as it was (an interrupted epoch's stays on the screen).
  void close() { m_display.reset(); }

 private:
  ProgressState state(const TrainProgress& p) const;  ///< an unfinished epoch's

  std::optional<ProgressDisplay> m_display;
  const StepPlan& m_plan;
  const TrainClock& m_clock;
  const GpuMonitor* m_monitor;
  RunClock::time_point m_wall_start;
  double m_loss = 0, m_t0 = 0;      ///< the epoch's loss sum over resolved steps; training seconds at its start
  int64_t m_samples = 0, m_s0 = 0;  ///< their samples; the epoch's samples at its start
};

/// The run's checkpoints: whether the state is newer than the last one written, and the rollbacks since then.
class CheckpointHook {
 public:
  CheckpointHook(const Experiment& exp, RunSetup& setup, const std::string& run_dir);

  /// The state changed since the last checkpoint (a step, an epoch's end).
  void mark_dirty() { m_dirty = true; }
  bool dirty() const { return m_dirty; }
  /// Non-finite rollbacks since the last checkpoint written (train.max_skips limits them).
  int64_t& rollbacks() { return m_rollbacks; }
  /// Records checkpoint.keep_best's metric and metrics.jsonl's length in `p`, then writes the checkpoint (rank 0;
  /// the state it holds is the same on every rank).
  void save(TrainProgress& p, uint64_t metrics_bytes);
  /// A non-finite rollback: loads the run's newest good checkpoint into the model and optimizer and its progress into
  /// `p`, with the learning rate scale halved, and (rank 0) removes the newer checkpoints, which lead to the
  /// divergence. Returns the checkpoint's folder.
  std::string roll_back(TrainProgress& p);

 private:
  /// dist.zero ≥ 1: every rank writes its own shard of the optimizer state, rank 0 the rest (a collective).
  void save_sharded(ZeroOptimizer& zero, TrainProgress& p);

  Communicator& m_comm;
  Model& m_model;
  Optimizer& m_optimizer;
  OptimizerType m_optimizer_type;
  const std::string& m_resolved_config;
  CheckpointConfig m_cfg;
  CheckpointStore m_store;
  std::string m_run_dir;
  bool m_lead = true;
  bool m_dirty = false;  ///< state not yet in a checkpoint
  int64_t m_rollbacks = 0;
};

/// Ends the profiled steps; rank 0 writes trace.json and profile.txt to the run directory and logs the table.
void finish_profile(Profiler& profiler, const std::string& run_dir, bool lead, int64_t profile_start);

}  // namespace gt
