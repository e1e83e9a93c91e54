// One optimizer step, the only hot path of a training run: forward, loss and backward over the step's micro-batches,
// the gradients averaged over the ranks, the gated update queued on the device, and the host's deferred verdict on it.
#pragma once

#include "core/noncopyable.h"
#include "core/span_timer.h"
#include "data/batch_stager.h"
#include "ops/stream.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"
#include "train/checkpoint.h"
#include "train/experiment.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gt {

class Model;
struct Param;
class Optimizer;
class Profiler;
class RunSetup;
struct StepPlan;
class ZeroOptimizer;

/// What a step came to, as the host learns it.
enum class StepOutcome {
  ok,           ///< updated (or not known yet)
  skipped,      ///< non-finite: the device skipped its update, and the run goes on (train.nonfinite: skip)
  diverged,     ///< non-finite, and the run ends
  rolled_back,  ///< non-finite: the run went back to its newest good checkpoint (train.nonfinite: rollback)
};

/// What a non-finite step leads to under train.nonfinite `mode` (abort | skip | rollback). A skip counts in
/// `skips_in_row`, a rollback in `rollbacks` (those since the last checkpoint); past `max_skips` of either, or at once
/// under abort, the run diverges.
StepOutcome nonfinite_outcome(NonFinitePolicy mode, int64_t max_skips, int64_t& skips_in_row, int64_t& rollbacks);

/// What the host reads of a step once the device has done it.
struct StepReading {
  int64_t step = 0;     ///< 1-based
  int64_t samples = 0;  ///< of the global batch
  double loss_sum = 0;  ///< over the global batch
  double grad_sq = 0;   ///< the squared global gradient norm
  /// A non-finite step's first parameter whose gradient is not finite ("none (the loss itself)"); "" when finite.
  std::string first_nonfinite;
  bool finite() const;
};

/// A step's statistics on their way to the host: copied behind its update, read when the host needs its outcome. On
/// the CPU that is at once; on a GPU one step later (or when it next logs, evaluates or saves), so the device never
/// idles while the host waits. The device has already skipped the update of a non-finite step by then.
class DeferredVerdict {
 public:
  /// For a model whose parameters are `param_names`, in the order of the per-parameter norms.
  explicit DeferredVerdict(std::vector<std::string> param_names);

  /// Queues the copy of `stats` (f64[kStepStats]) and `per_param` (each parameter's squared gradient norm) behind the
  /// work queued on `device` so far, as step `step`'s of `samples` samples.
  void queue(const Tensor& stats, const Tensor& per_param, Device device, int64_t step, int64_t samples);
  /// The queued step's numbers, after waiting for them (the host's one wait for a step); nullopt when there is none.
  /// Each queued step is taken once.
  std::optional<StepReading> take();

 private:
  std::vector<std::string> m_names;
  Tensor m_stats, m_per_param;  ///< pinned host copies
  StreamEvent m_ready;
  bool m_open = false;
  int64_t m_step = 0, m_samples = 0;
};

/// A step's global batch as the ranks add it up.
struct RankSums {
  int64_t samples = 0;    ///< over every rank
  bool any_stop = false;  ///< some rank was asked to stop
};

/// The machinery of a step, allocated once: the batch and gradient tensors, the step's statistics and the log
/// window's sums on the device, the gradient sync over the ranks (through NCCL on GPUs) and the verdict's host
/// copies. A step is forward_backward, sum_over_ranks, queue_grad_norm, then update unless the previous step's
/// verdict ends the run or rolls it back.
class StepLoop : NonCopyable {
 public:
  /// Also makes every replica start from rank 0's state: the model's and the optimizer's tensors are broadcast.
  StepLoop(const Experiment& exp, RunSetup& setup, const StepPlan& plan, Profiler& profiler);
  ~StepLoop();

  /// Forward, loss and backward over the next `micros` micro-batches of `loader` for optimizer step `step`
  /// (0-based); each micro-batch's loss is its mean over the step's micro-batches, so the gradient is the mean over
  /// the effective batch, averaged over the ranks once the last is done. Returns this rank's samples.
  int64_t forward_backward(Loader& loader, int64_t step, int64_t micros);
  /// Sums the step's loss statistics, sample counts and stop requests over the ranks (one rank: its own).
  RankSums sum_over_ranks(int64_t samples);
  /// Queues the squared gradient norms, the global one into the statistics and each parameter's own.
  void queue_grad_norm();
  /// Queues the update at the parameter groups' rates `lrs` (group_lrs; gated and clipped to `max_norm` by the
  /// statistics on the device), adds the statistics to the log window, and queues their copy to the host as step
  /// `step`'s (1-based).
  void update(std::span<const double> lrs, double max_norm, int64_t step, int64_t samples);
  DeferredVerdict& verdict() { return m_verdict; }

  /// train.cuda_graphs: whether this step runs as a CUDA graph (captured now, or replayed) rather than op by op: after
  /// kGraphWarmup steps of this loop (or of it since reset_graph), whose first uses make the library plans,
  /// workspaces and the allocator's cached blocks that the capture then finds.
  bool graph_due() const { return m_graph && m_steps_run >= kGraphWarmup; }
  /// A graph step's batch: the loader's next one copied into x and y, queued before the launch (its copy is no part
  /// of the graph). Returns its samples: always the full batch (the last partial one of an epoch is dropped).
  int64_t stage_batch(Loader& loader);
  /// A graph step (step `step`, 0-based, at the groups' rates `lrs`, clipped to `max_norm`) on the staged batch: the
  /// first one captures forward, loss, backward, the gradient norm, the gated update, the log window's and the loss
  /// scaler's updates into one graph and launches it; the later ones write the step's hyperparameters to the device and
  /// launch it again. A capture that fails throws gt::Error naming the operation that broke it. The statistics'
  /// copy to the host is queue_verdict's, once the host has taken the previous step's.
  void graph_step(std::span<const double> lrs, double max_norm, int64_t step, int64_t samples);
  /// Queues the copy of the statistics to the host as step `step`'s (1-based), as update() does.
  void queue_verdict(int64_t step, int64_t samples) { m_verdict.queue(m_stats, m_param_sq, m_device, step, samples); }
  /// Drops the captured graph: the next steps warm up and capture again (after a rollback reloaded the state).
  void reset_graph();
  static constexpr int64_t kGraphWarmup = 3;

  /// Loads the log window's sums from the progress (a resumed or rolled-back run continues its window).
  void set_window(const TrainProgress& p);
  /// Reads the log window's sums into the progress: a wait for the device.
  void read_window(TrainProgress& p);
  void clear_window() { m_window.zero_(); }
  /// Loads the loss scaler's device state from the progress (the start of a run, a resume, a rollback).
  void set_scaler(const TrainProgress& p);

  /// Host seconds spent getting batches ready (the data wait) since the last call.
  double take_data_wait_seconds() { return m_stager.take_wait_seconds(); }

  /// The batch tensors (evaluation borrows them).
  Tensor& x() { return m_x; }
  Tensor& y() { return m_y; }
  /// The all-reduce's cost per step and how much of it backward hid, once the run is over (host communicators).
  void log_allreduce_cost(int64_t steps) const;

 private:
  /// Micro-batch k of `micros` (n samples, in x and y) of step `step`: forward, loss and backward; `timer` times
  /// the spans (the profiler, or what names the operation a capture is in).
  void micro_step(int64_t step, int64_t k, int64_t n, int64_t micros, SpanTimer* timer);
  /// graph_step's first: the capture, then the launch.
  void capture_step(std::span<const double> lrs, double max_norm, int64_t step, int64_t samples);

  Model& m_model;
  Optimizer& m_optimizer;
  Communicator& m_comm;
  const LossConfig& m_loss;
  Device m_device;
  Profiler& m_profiler;
  int m_world = 1;
  int64_t m_accumulate = 1;
  Precision m_precision = Precision::fp32;  ///< train.precision, entered around forward and backward
  bool m_scaling = false;                   ///< train.loss_scale (or fp16): the loss gradient is scaled
  LossScaleHyper m_scale_hyper;
  Communicator* m_nccl = nullptr;  ///< CUDA ranks: RunSetup's NCCL communicator, which outlives this loop
  std::optional<GradSync> m_grad_sync;
  ZeroOptimizer* m_zero = nullptr;  ///< the optimizer, when dist.zero shards it over several ranks
  Tensor m_x, m_y, m_dout;
  /// The step's statistics (StepStat: loss sum, hits, squared gradient norm) and the log window's sums (loss sum,
  /// hits, skipped steps) stay on the device: the optimizer reads them there to skip a non-finite step or clip, and
  /// the host reads them when it needs a number, so a GPU step queues its work without waiting for the device.
  Tensor m_stats, m_grad_sq, m_window;
  Tensor m_param_sq;  ///< each parameter's squared gradient norm: names the first non-finite gradient
  /// The loss scaler's state (ops/math.h's LossScaleSlot) on the device: the step scales the loss gradient by it and
  /// unscales the gradients by its inverse, and the device updates it after the step by the same verdict that gates
  /// the optimizer, so a GPU step never waits for the host to learn whether it overflowed.
  Tensor m_scale_state;
  std::vector<Param*> m_params;       ///< whose gradients the scaler unscales (scaling runs only)
  std::vector<Tensor> m_grad_chunks;  ///< dist.zero 2: the optimizer's gradient chunks, which GradSync fills
  BatchStager m_stager;
  DeferredVerdict m_verdict;
  std::unique_ptr<StepGraph> m_graph;  ///< train.cuda_graphs: the captured step (not ready before the capture)
  int64_t m_steps_run = 0;             ///< steps since the loop began or reset_graph: the graph's warm-up
};

}  // namespace gt
