// The `optimizer:` and `scheduler:` sections: their settings, how they are read from the config and written back.
#pragma once

#include "config/config.h"
#include "config/schema.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gt {

enum class OptimizerType { sgd, adam, adamw };
/// The config's name of an optimizer type (also what checkpoints record).
const std::string& to_string(OptimizerType type);

struct OptimizerConfig {
  OptimizerType type = OptimizerType::sgd;
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< adam, adamw
  bool amsgrad = false;
};

enum class ScheduleType { constant, step, multistep, exponential, cosine, linear, onecycle };
const std::string& to_string(ScheduleType type);

/// The learning-rate schedule, stepped once per optimizer step (t = 0 for the first step).
struct SchedulerConfig {
  ScheduleType type = ScheduleType::constant;
  int64_t warmup_steps = 0;
  double warmup_start_factor = 0.0;
  int64_t step_size = 1;                        ///< step
  std::vector<int64_t> milestones;              ///< multistep
  double gamma = 0.1;                           ///< step, multistep, exponential
  int64_t t_max = 0;                            ///< cosine: steps of one half period; 0 = the whole run
  double eta_min = 0.0;                         ///< cosine
  double start_factor = 1.0, end_factor = 0.0;  ///< linear
  int64_t total_iters = 0;                      ///< linear; 0 = the whole run
  double max_lr = 0.0, pct_start = 0.3, div_factor = 25.0, final_div_factor = 1e4;  ///< onecycle (max_lr 0 = lr)
};

/// The keys of each optimizer type and each schedule type, their bounds and defaults (parse_* reads by them).
const SectionSpec& optimizer_section();
const SectionSpec& scheduler_section();
/// Reads the `optimizer:` section; throws ConfigError naming the key.
void parse_optimizer(const ConfigNode& n, OptimizerConfig& out);
/// Reads the `scheduler:` section; throws ConfigError naming the key.
void parse_scheduler(const ConfigNode& n, SchedulerConfig& out);
/// The section after defaults, as config.resolved.yaml writes it (the keys its type reads).
YAML::Node to_yaml(const OptimizerConfig& c);
YAML::Node to_yaml(const SchedulerConfig& c);

}  // namespace gt
