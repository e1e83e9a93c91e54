// Reading and writing back the train and checkpoint sections; each unknown key or bad value names its path.
#include "train/settings.h"

#include "config/choice.h"
#include "data/tokens.h"

namespace gt {
namespace {

const Choice<NonFinitePolicy> kNonfinitePolicies[] = {
    {NonFinitePolicy::abort, "abort"},
    {NonFinitePolicy::skip, "skip"},
    {NonFinitePolicy::rollback, "rollback"},
};

const Choice<KeepBest> kKeepBestMetrics[] = {
    {KeepBest::none, "none"},
    {KeepBest::test_accuracy, "test_accuracy"},
    {KeepBest::test_loss, "test_loss"},
};

}  // namespace

const std::string& to_string(NonFinitePolicy policy) { return choice_name(kNonfinitePolicies, policy); }
const std::string& to_string(KeepBest metric) { return choice_name(kKeepBestMetrics, metric); }

void parse_train(const ConfigNode& n, TrainConfig& out) {
  n.expect_keys({"epochs", "log_every", "max_steps", "eval_every", "accumulate", "grad_clip", "profile", "nonfinite",
                 "max_skips", "peak_tflops", "eval_tokens"});
  out.eval_tokens = n.get_size("eval_tokens", 0, 0, limits::kTokens);
  if (n.has("nonfinite")) out.nonfinite = parse_choice(n["nonfinite"], kNonfinitePolicies);
  out.max_skips = n.get_size("max_skips", 5, 1, limits::kSteps);
  out.peak_tflops = n.get_double("peak_tflops", 0.0, 0.0, 1e9);
  if (n.has("profile")) {
    const ConfigNode p = n["profile"];
    p.expect_keys({"start_step", "steps"});
    out.profile_start = p.get_size("start_step", 5, 1, limits::kSteps);
    out.profile_steps = p.get_size("steps", 20, 1, limits::kSteps);
  }
  out.epochs = n.get_size("epochs", 1, 1, limits::kEpochs);
  out.log_every = n.get_size("log_every", 100, 1, limits::kInterval);
  out.max_steps = n.get_size("max_steps", 0, 0, limits::kSteps);
  out.accumulate = n.get_size("accumulate", 1, 1, limits::kAccumulate);
  if (n.has("eval_every")) {
    const ConfigNode e = n["eval_every"];
    out.eval_every = e.is_scalar() && e.as_string() == "epoch" ? 0 : e.as_size(1, limits::kInterval);
  }
  if (n.has("grad_clip")) {
    const ConfigNode g = n["grad_clip"];
    g.expect_keys({"max_norm"});
    g.require("max_norm");
    out.grad_clip = g["max_norm"].as_double(0.0, 1e300, false);
  }
}

void parse_checkpoint(const ConfigNode& n, CheckpointConfig& out) {
  n.expect_keys({"every_steps", "every_epochs", "keep", "keep_best"});
  out.every_steps = n.get_size("every_steps", 0, 0, limits::kInterval);
  out.every_epochs = n.get_size("every_epochs", 1, 0, limits::kEpochs);
  out.keep = n.get_size("keep", 3, 1, limits::kInterval);
  if (n.has("keep_best"))  // null (or absent) keeps no best
    out.keep_best = parse_choice(n["keep_best"], kKeepBestMetrics);
}

YAML::Node to_yaml(const TrainConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  n["epochs"] = c.epochs;
  n["log_every"] = c.log_every;
  n["max_steps"] = c.max_steps;
  n["accumulate"] = c.accumulate;
  if (c.eval_every > 0)
    n["eval_every"] = c.eval_every;
  else
    n["eval_every"] = "epoch";
  if (c.grad_clip > 0) n["grad_clip"]["max_norm"] = c.grad_clip;
  if (c.profile_steps > 0) {
    n["profile"]["start_step"] = c.profile_start;
    n["profile"]["steps"] = c.profile_steps;
  }
  n["nonfinite"] = to_string(c.nonfinite);
  n["max_skips"] = c.max_skips;
  if (c.peak_tflops > 0) n["peak_tflops"] = c.peak_tflops;
  n["eval_tokens"] = c.eval_tokens;
  return n;
}

YAML::Node to_yaml(const CheckpointConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  n["every_steps"] = c.every_steps;
  n["every_epochs"] = c.every_epochs;
  n["keep"] = c.keep;
  n["keep_best"] = c.keep_best == KeepBest::none ? YAML::Node() : YAML::Node(to_string(c.keep_best));
  return n;
}

}  // namespace gt
