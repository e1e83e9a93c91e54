// Optimizers: they own their state buffers (allocated once) and update parameters from their gradients.
#pragma once

#include "layers/layer.h"
#include "train/experiment.h"

#include <memory>
#include <vector>

namespace gt {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Applies one update with learning rate `lr` to every parameter from its gradient.
  virtual void step(double lr) = 0;
  int64_t steps_taken() const { return m_steps; }

 protected:
  int64_t m_steps = 0;
};

/// Builds the optimizer the config names over `params` (state buffers on the parameters' device).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params);

}  // namespace gt
