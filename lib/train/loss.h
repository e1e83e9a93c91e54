// Losses over the model output: fused, numerically stable, accumulating their statistics on the device.
#pragma once

#include "config/config.h"
#include "core/tensor.h"
#include "train/experiment.h"

namespace gt {

/// Checks that the model output fits the loss and the targets; a misfit is a ConfigError at `where`.
void check_loss_fits(const LossConfig& loss, const Shape& output, const Dataset& data, const ConfigNode& where);

/// Adds Σ per-sample loss to stats[0] (and correct predictions to stats[1] for classification). When dout is
/// defined, writes ∂(scale · Σ loss)/∂out into it.
void compute_loss(const LossConfig& loss, const Tensor& out, const Tensor& target, double scale, Tensor& dout,
                  Tensor& stats);

}  // namespace gt
