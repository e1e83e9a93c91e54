// Losses over the model output: fused, numerically stable, accumulating their statistics on the device; and the
// `loss:` section that picks one.
#pragma once

#include "config/config.h"
#include "config/schema.h"
#include "core/tensor.h"
#include "data/dataset.h"
#include "ops/loss.h"

#include <yaml-cpp/yaml.h>

#include <string>

namespace gt {

enum class LossType { cross_entropy, mse };
const std::string& to_string(LossType type);

struct LossConfig {
  LossType type = LossType::cross_entropy;
  double label_smoothing = 0.0;
  /// cross_entropy: targets equal to this count nowhere (loss, accuracy, gradient); ops::kNoIgnore = none.
  int64_t ignore_index = ops::kNoIgnore;
};

/// Reads the `loss:` section (a type name, or a map with `type:`); throws ConfigError naming the key.
/// The `loss:` key: a bare type name, or a map of the section's keys (parse_loss reads by them).
const KeySpec& loss_key();
void parse_loss(const ConfigNode& n, LossConfig& out);
/// The section after defaults, as config.resolved.yaml writes it.
YAML::Node to_yaml(const LossConfig& c);

/// Checks that the model output fits the loss and the targets; a misfit is a ConfigError at `where`. A class label
/// from a file (train or `test`) that the model's output has no class for is a DataError naming the file, the
/// sample and the label: there the data, not the config, is the likelier mistake.
void check_loss_fits(const LossConfig& loss, const Shape& output, const Dataset& data, const ConfigNode& where,
                     const Dataset* test = nullptr);

/// Adds Σ per-sample loss to stats[0] (and correct predictions to stats[1] for classification). When dout is
/// defined, writes ∂(scale · Σ loss)/∂out into it. Sequences (out [B, T, V], targets [B, T]): a sample's loss and
/// accuracy are the means over its T tokens (over the batch's counted tokens with ignore_index, ops/loss.h), so
/// Σ loss / B is the per-token mean and scale 1/B gives each token the gradient scale 1/(B·T).
void compute_loss(const LossConfig& loss, const Tensor& out, const Tensor& target, double scale, Tensor& dout,
                  Tensor& stats);

}  // namespace gt
