// The `optimizer:` and `scheduler:` sections: their settings, how they are read from the config and written back.
#pragma once

#include "config/config.h"
#include "config/schema.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gt {

enum class OptimizerType { sgd, adam, adamw };
/// The config's name of an optimizer type (also what checkpoints record).
const std::string& to_string(OptimizerType type);

/// One of optimizer.param_groups: the parameters whose full names (layers.1.weight) one of `params` matches (fnmatch
/// globs; the first group that matches a parameter takes it), with their own learning rate and weight decay. A key
/// not given takes the optimizer's top-level value.
struct ParamGroupConfig {
  std::vector<std::string> params;
  std::optional<double> lr, weight_decay;
  ConfigNode at;  ///< the group's `params`, which a pattern that matches no parameter fails on
};

/// The most parameter groups an optimizer takes, its default group included (the CUDA update passes their rates to
/// its kernel by value).
inline constexpr size_t kMaxParamGroups = 32;

struct OptimizerConfig {
  OptimizerType type = OptimizerType::sgd;
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< adam, adamw
  bool amsgrad = false;
  std::vector<ParamGroupConfig> param_groups;  ///< group g + 1 of the optimizer; group 0 is every other parameter
  /// Group g's base learning rate and weight decay (0: the top-level values).
  double group_lr(size_t g) const { return g == 0 ? lr : param_groups[g - 1].lr.value_or(lr); }
  double group_weight_decay(size_t g) const {
    return g == 0 ? weight_decay : param_groups[g - 1].weight_decay.value_or(weight_decay);
  }
  size_t groups() const { return param_groups.size() + 1; }
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
/// The keys of one entry of optimizer.param_groups.
const SectionSpec& param_group_section();
/// Reads the `optimizer:` section; throws ConfigError naming the key.
void parse_optimizer(const ConfigNode& n, OptimizerConfig& out);
/// Reads the `scheduler:` section; throws ConfigError naming the key.
void parse_scheduler(const ConfigNode& n, SchedulerConfig& out);
/// Which group each parameter of `names` (full names, in the optimizer's order) is in: 0 for the default group, g for
/// cfg.param_groups[g - 1], the first whose patterns match the name. Throws ConfigError naming
/// optimizer.param_groups[i].params when one of its patterns matches none of `names`.
std::vector<int> param_group_of(const OptimizerConfig& cfg, const std::vector<std::string>& names);
/// One line per parameter group when there are groups besides the default one (none otherwise): its patterns, base
/// learning rate and weight decay, and how many of the parameters (`groups` from param_group_of, `numels` their
/// sizes) and elements it holds. For the run's log.
std::vector<std::string> describe_param_groups(const OptimizerConfig& cfg, const std::vector<int>& groups,
                                               const std::vector<int64_t>& numels);
/// The section after defaults, as config.resolved.yaml writes it (the keys its type reads).
YAML::Node to_yaml(const OptimizerConfig& c);
YAML::Node to_yaml(const SchedulerConfig& c);

}  // namespace gt
