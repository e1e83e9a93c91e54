// dist.offload: optimizer — ZeRO-Offload's split: the weights and gradients stay on the device, the fp32 master
// weights and the optimizer state live in page-locked host memory, and the update runs there on the CPU's kernels.
#pragma once

#include "optim/optimizer.h"

#include <exception>
#include <memory>
#include <thread>
#include <vector>

namespace gt {

/// dist.offload and dist.offload_delay: where an optimizer's update runs.
enum class Offload {
  none,     ///< where the parameters are
  exact,    ///< on the host, within the step
  delayed,  ///< on the host, beside the next step's passes (OffloadOptimizer's `delayed`)
};

/// An optimizer over `params` (on any device) whose state and master weights are on the host: a step copies the
/// gradients to host buffers, gates, clips and updates the master weights there with the plain optimizer the config
/// names (the CPU's fused kernels), and copies the new weights back into the parameters. The update is elementwise
/// and runs on the same values, so each weight gets exactly what the optimizer on the device would give it (tested on
/// the CPU, where the "device" is the host and every copy is a memcpy). The gradient norm is still summed on the
/// device, where the gradients are (grad_norm_sq). What the device no longer holds: the state (Adam's two moments
/// per element). What the host holds: the state, the master weights and a gradient buffer.
///
/// `delayed` (dist.offload_delay, opt-in; DeepSpeed's delayed parameter update): step() applies the update the last
/// step started, copies this step's gradients and statistics to the host and starts their update on a thread of
/// its own, then returns, so the next forward and backward passes run beside it, on the weights one update behind
/// (each gradient is taken at the weights before the previous step's update). Not the plain optimizer's training: a
/// GPU gains the host update's time, and the results differ within the tolerance the tests state. settle() waits
/// for the update under way and applies it.
class OffloadOptimizer final : public Optimizer {
 public:
  OffloadOptimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params, const std::vector<int>& groups = {},
                   bool delayed = false);
  ~OffloadOptimizer() override;

  using Optimizer::stage_hyper;
  using Optimizer::step;
  void step(std::span<const double> lrs, const Tensor& stats, double max_norm) override;
  /// (train.cuda_graphs cannot capture a step that runs on the host: RunSetup refuses the two together.)
  void stage_hyper(std::span<const double> lrs) override { m_inner->stage_hyper(lrs); }
  std::vector<std::pair<std::string, Tensor*>> state() override { return m_inner->state(); }
  /// The master weights taken again from the parameters' values (after a load or the first step's broadcast).
  void take_weights() override;
  bool settle() override;
  /// Bytes of host memory it holds: the state, the master weights and the gradient buffers.
  int64_t host_bytes() const;

 private:
  std::vector<Param*> m_params;  ///< the model's, on the device
  std::vector<Param> m_host;     ///< their masters: values and gradients in page-locked host memory
  std::unique_ptr<Optimizer> m_inner;
  Tensor m_stats;  ///< the step's statistics, copied to the host for the gate and the clipping
  bool m_delayed = false;
  std::thread m_update;  ///< delayed: the update under way (joinable), started by the last step()
  std::exception_ptr m_error;
  /// Copies the master weights into the parameters.
  void put_weights();
};

}  // namespace gt
