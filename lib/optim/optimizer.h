// Optimizers: they own their state buffers (allocated once) and update parameters from their gradients.
#pragma once

#include "layers/layer.h"
#include "ops/optim.h"
#include "optim/settings.h"

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gt {

/// A range of one state buffer of one parameter, as a checkpoint load fills it: `dst` (f32, any device) receives
/// elements [offset, offset + dst.numel()) of parameter `param`'s buffer `buffer`.
struct StateRange {
  size_t param = 0;    ///< parameter index (the order the optimizer was given them in)
  std::string buffer;  ///< "exp_avg", …
  int64_t offset = 0;
  Tensor dst;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Queues one update of every parameter from its gradient, in one fused kernel on CUDA, each parameter group g
  /// (optimizer.param_groups; 0 the default group) at learning rate lrs[g] (one per group) and its weight decay.
  /// `stats` (f64[kStepStats] on the parameters' device, ops/math.h) gates and clips it on the device: nothing
  /// changes unless the step's loss sum and squared gradient norm are finite, and with max_norm > 0 the gradients
  /// are scaled to a global norm of at most max_norm. The step counts as taken either way; undo_step() takes back
  /// one the host later learns was skipped.
  virtual void step(std::span<const double> lrs, const Tensor& stats, double max_norm) = 0;
  /// The same at one rate `lr` for the default group, each other group at its own base rate × lr / optimizer.lr
  /// (a constant schedule; tests, benchmarks).
  void step(double lr, const Tensor& stats, double max_norm) { step(rates_at(lr), stats, max_norm); }
  /// An ungated, unclipped step (tests, benchmarks).
  void step(double lr);
  /// The host learnt that the last gated step was skipped: its count (Adam's bias correction, SGD's first step)
  /// is taken back.
  void undo_step() { --m_steps; }
  /// Adds the squared global gradient norm to out[0], and each parameter's own to per_param[i] when that is
  /// defined (f64 on the parameters' device), in one kernel on CUDA.
  virtual void grad_norm_sq(Tensor& out, Tensor& per_param) {
    if (!m_group.rows.empty()) ops::sum_squares_group(m_group, 1, out, per_param);
  }
  int64_t steps_taken() const { return m_steps; }
  /// Restores the step count of a checkpoint (Adam's bias corrections, SGD's first-step momentum).
  void set_steps_taken(int64_t steps) { m_steps = steps; }
  /// train.cuda_graphs: from now on the CUDA update reads its hyperparameters (the groups' learning rates and
  /// weight decays, Adam's bias corrections, SGD's first step) from device memory that each step writes first, so
  /// that a captured update replays with every step's own values: the same numbers as the arguments would pass, so
  /// the same updates.
  virtual void hyper_on_device();
  /// While a capture records the step: step() queues the update without writing the hyperparameters (a capture
  /// cannot record a copy from the host's stack; stage_hyper wrote them before it began).
  virtual void set_capturing(bool on) { m_capturing = on; }
  /// Queues the write of the next step's hyperparameters at the groups' rates `lrs` to the device
  /// (hyper_on_device), outside a capture.
  virtual void stage_hyper(std::span<const double> lrs) = 0;
  void stage_hyper(double lr) { stage_hyper(rates_at(lr)); }
  /// A replayed step's share of step(): its hyperparameters written, and the step counted.
  void stage_step(std::span<const double> lrs) {
    stage_hyper(lrs);
    ++m_steps;
  }
  void stage_step(double lr) { stage_step(rates_at(lr)); }
  /// The parameter groups: 1 + optimizer.param_groups.
  size_t groups() const { return m_base.size(); }
  /// Each parameter's group, in the order the optimizer was given them.
  const std::vector<int>& param_groups() const { return m_param_group; }
  /// The state buffers by name (momentum, moments), for checkpoints: "<parameter index>.<buffer>", whole
  /// parameters. A sharded optimizer (dist.zero) returns full-size buffers that hold what gather_state() or a load
  /// put there; shard_state() then takes its shard back from them and frees them.
  virtual std::vector<std::pair<std::string, Tensor*>> state() = 0;
  /// Whether this rank holds only a shard of the state (dist.zero ≥ 1).
  virtual bool sharded() const { return false; }
  /// Sharded: assembles the whole state in state()'s buffers on every rank (a collective: every rank calls it).
  virtual void gather_state() {}
  /// What this rank holds of the state, as ranges of the whole buffers: a sharded load fills exactly these. The
  /// default: state()'s buffers, whole.
  virtual std::vector<StateRange> state_ranges();
  /// Sharded: keeps this rank's shard of state()'s buffers (after a load or a gather) and frees them.
  virtual void shard_state() {}
  /// Finishes what the optimizer still owes the parameters (dist.offload_delay's update of the last step, running on
  /// the host), before anything outside the training step reads or replaces the weights or the state: an evaluation,
  /// a checkpoint, the final weights, a rollback's load. Returns whether it changed the weights; nothing (false) for
  /// an optimizer that updates in step().
  virtual bool settle() { return false; }
  /// The parameters' values were set from outside (a checkpoint's load, the first step's broadcast from rank 0): the
  /// copies of them an optimizer keeps (dist.offload's host masters, dist.zero 3's shards) are taken again. Nothing
  /// for an optimizer that keeps none.
  virtual void take_weights() {}

 protected:
  /// An optimizer of `params`, on the first one's device, parameter i in group groups[i] of cfg's (all in the
  /// default group when `groups` is empty).
  Optimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params, const std::vector<int>& groups);

  /// The step's rate and weight decay of each group, at the groups' learning rates `lrs`.
  std::vector<ops::GroupRate> group_rates(std::span<const double> lrs) const;
  /// Copies `h` and the groups' `rates` into m_group.hyper when the hyperparameters live on the device (and no
  /// capture is recording).
  template <class Hyper>
  void put_hyper(const Hyper& h, std::span<const ops::GroupRate> rates) {
    static_assert(sizeof(Hyper) <= ops::kHyperRatesOffset);
    if (m_group.hyper.defined() && !m_capturing) write_hyper_bytes(&h, sizeof h, rates);
  }

  int64_t m_steps = 0;
  Device m_device;           ///< the parameters'
  ops::TensorGroup m_group;  ///< a row per parameter: its value and gradient, then its state buffers
  Tensor m_always_ok;        ///< the statistics step(lr) passes: zeros, so the gate is open
  bool m_capturing = false;

 private:
  /// The groups' rates for the default group at `lr` (step(double)).
  std::vector<double> rates_at(double lr) const;
  void write_hyper_bytes(const void* h, size_t bytes, std::span<const ops::GroupRate> rates);

  std::vector<ops::GroupRate> m_base;  ///< each group's base learning rate and weight decay
  std::vector<int> m_param_group;
};

/// Each parameter group's learning rate at optimizer step t (0-based) of a run of `total_steps`, index 0 the
/// default group's: scheduled_lr of the group's own base rate, × lr_scale (the rollbacks' factor). So each group
/// follows the schedule as torch's lr_scheduler steps every param group's own rate (cosine's eta_min and warmup
/// apply to each); onecycle's max_lr, when given, is scaled per group by lr_g / optimizer.lr.
std::vector<double> group_lrs(const OptimizerConfig& o, const SchedulerConfig& s, int64_t t, int64_t total_steps,
                              double lr_scale);

/// What an out-of-memory error names while the state `buffers` ("exp_avg, exp_avg_sq") of parameter `i` are
/// allocated: "the optimizer state (exp_avg, exp_avg_sq of h.0.fc.weight, 4194304 elements)", the parameter's full
/// name when a ParamNames on this thread has it, else its own ("weight").
std::string optimizer_state_label(const char* buffers, const Param& p, size_t i);

/// The model's full parameter names (Model::named_params) for optimizer_state_label, on this thread while this lives.
class ParamNames {
 public:
  explicit ParamNames(const std::vector<std::pair<std::string, Param*>>& named);
  ~ParamNames();
  ParamNames(const ParamNames&) = delete;
  ParamNames& operator=(const ParamNames&) = delete;

 private:
  const std::vector<std::pair<std::string, Param*>>* m_previous;
};

/// Builds the optimizer the config names over `params` (state buffers on the parameters' device), parameter i in
/// group groups[i] (param_group_of; empty: all in the default group).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params,
                                          const std::vector<int>& groups = {});
std::unique_ptr<Optimizer> make_adam(const OptimizerConfig& cfg, const std::vector<Param*>& params,
                                     const std::vector<int>& groups);

/// The global L2 norm of all gradients (non-finite when any gradient is). `scratch` holds two f64 scalars.
double global_grad_norm(const std::vector<Param*>& params, Tensor& scratch);

/// Scales all gradients so that their global L2 norm is at most max_norm (torch.nn.utils.clip_grad_norm_:
/// coefficient max_norm / (norm + 1e-6), applied when below 1). Returns the norm before clipping. `scratch` holds
/// two f64 scalars on the gradients' device.
double clip_grad_norm(const std::vector<Param*>& params, double max_norm, Tensor& scratch);

/// The learning rate of optimizer step t (0-based) of a run of `total_steps`, for base rate `lr`: the schedule's
/// value, multiplied during the first warmup_steps by a factor rising linearly from warmup_start_factor to 1.
double scheduled_lr(const SchedulerConfig& s, double lr, int64_t t, int64_t total_steps);

}  // namespace gt
