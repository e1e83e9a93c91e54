// The `train:` and `checkpoint:` sections: the loop's settings, how they are read from the config and written back.
#pragma once

#include "config/config.h"
#include "config/schema.h"
#include "graph/model.h"
#include "ops/math.h"
#include "ops/precision.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gt {

/// What a NaN/Inf loss or gradient does (train.nonfinite).
enum class NonFinitePolicy { abort, skip, rollback };
const std::string& to_string(NonFinitePolicy policy);
/// "none", "blocks", "all" (train.recompute).
const std::string& to_string(Recompute mode);

/// train.loss_scale: the loss is multiplied by a scale before backward and the gradients divided by it before the
/// clipping and the update, so that fp16 gradients neither underflow nor, for long, overflow. Dynamic (GradScaler's
/// rules, ops/math.h) unless a fixed number is given.
struct LossScaleConfig {
  bool set = false;  ///< the key was given (fp16 scales by the defaults without it)
  double init = 65536;
  LossScaleHyper hyper;
};

struct TrainConfig {
  int64_t epochs = 1;
  int64_t log_every = 100;                       ///< steps between log lines
  int64_t max_steps = 0;                         ///< 0: no limit
  int64_t eval_every = 0;                        ///< steps between evaluations; 0 = after every epoch
  int64_t accumulate = 1;                        ///< micro-batches per optimizer step
  double grad_clip = 0.0;                        ///< max global L2 norm of the gradients; 0 = off
  int64_t profile_start = 0, profile_steps = 0;  ///< profile steps [start, start + steps) (1-based); 0 steps = off
  NonFinitePolicy nonfinite = NonFinitePolicy::abort;
  Precision precision = Precision::fp32;  ///< of the matrix products (train.precision)
  Recompute recompute = Recompute::none;  ///< train.recompute
  LossScaleConfig loss_scale;
  /// Whether the run scales its loss: fp16 always, other precisions when train.loss_scale is set.
  bool loss_scaling() const { return precision == Precision::fp16 || loss_scale.set; }
  int64_t max_skips = 5;   ///< skip: steps skipped in a row; rollback: rollbacks to one checkpoint
  double peak_tflops = 0;  ///< one device's peak for the MFU; 0 = the known GPUs' table (none for the CPU)
  /// Token data: an evaluation stops after this many predicted tokens, rounded up to whole windows (0 = all).
  int64_t eval_tokens = 0;
  /// train.cuda_graphs: the step after warm-up is captured into one CUDA graph and replayed (train/step.h).
  bool cuda_graphs = false;
  /// train.init_from: the weights a new run starts from ("" = its own initialisation); a resume never reads them.
  std::string init_from;
  std::vector<std::pair<std::string, std::string>> init_map;  ///< source name prefixes renamed, in the config's order
  std::vector<std::string> init_skip;  ///< globs over the model's names that keep their fresh initialisation
  bool init_strict = true;             ///< missing and unexpected tensors stop the run
  /// train.freeze: globs over the parameter names whose parameters keep their values (Model::set_frozen).
  std::vector<std::string> freeze;
};

/// The test metric whose best checkpoint is kept besides the newest ones (checkpoint.keep_best).
enum class KeepBest { none, test_accuracy, test_loss };
/// "none" for none (what state.json records; the config writes null).
const std::string& to_string(KeepBest metric);

/// When checkpoints are written and how many stay (checkpoints/step-<N>/ in the run directory).
struct CheckpointConfig {
  int64_t every_steps = 0;   ///< 0 = off
  int64_t every_epochs = 1;  ///< 0 = off
  int64_t keep = 3;          ///< newest complete checkpoints kept (the best one is kept besides)
  KeepBest keep_best = KeepBest::none;
};

/// The keys of the `train:` and `checkpoint:` sections, their bounds and defaults (parse_* reads by them).
const SectionSpec& train_section();
const SectionSpec& checkpoint_section();
/// Reads the `train:` section; throws ConfigError naming the key.
void parse_train(const ConfigNode& n, TrainConfig& out);
/// Reads the `checkpoint:` section; throws ConfigError naming the key.
void parse_checkpoint(const ConfigNode& n, CheckpointConfig& out);
/// The section after defaults, as config.resolved.yaml writes it.
YAML::Node to_yaml(const TrainConfig& c);
YAML::Node to_yaml(const CheckpointConfig& c);

}  // namespace gt
