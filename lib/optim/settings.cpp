// Reading and writing back the optimizer and scheduler sections; each unknown key or bad value names its path.
#include "optim/settings.h"

#include "config/choice.h"

#include <algorithm>

namespace gt {
namespace {

const Choice<OptimizerType> kOptimizerTypes[] = {
    {OptimizerType::sgd, "sgd"},
    {OptimizerType::adam, "adam"},
    {OptimizerType::adamw, "adamw"},
};

const Choice<ScheduleType> kScheduleTypes[] = {
    {ScheduleType::constant, "constant"},   {ScheduleType::step, "step"},
    {ScheduleType::multistep, "multistep"}, {ScheduleType::exponential, "exponential"},
    {ScheduleType::cosine, "cosine"},       {ScheduleType::linear, "linear"},
    {ScheduleType::onecycle, "onecycle"},
};

}  // namespace

const std::string& to_string(OptimizerType type) { return choice_name(kOptimizerTypes, type); }
const std::string& to_string(ScheduleType type) { return choice_name(kScheduleTypes, type); }

void parse_optimizer(const ConfigNode& n, OptimizerConfig& out) {
  n.require("type");
  out.type = parse_choice(n["type"], kOptimizerTypes);
  if (out.type == OptimizerType::sgd) {
    n.expect_keys({"type", "lr", "momentum", "nesterov", "weight_decay", "dampening"});
  } else {
    n.expect_keys({"type", "lr", "betas", "eps", "weight_decay", "amsgrad"});
  }
  n.require("lr");
  out.lr = n["lr"].as_double(0.0, 1e300, false);
  if (out.type == OptimizerType::sgd) {
    out.momentum = n.get_double("momentum", 0.0, 0.0, 1.0);
    out.dampening = n.get_double("dampening", 0.0, 0.0, 1.0);
    out.weight_decay = n.get_double("weight_decay", 0.0, 0.0);
    out.nesterov = n.get_bool("nesterov", false);
    // torch.optim.SGD: "Nesterov momentum requires a momentum and zero dampening".
    if (out.nesterov && (out.momentum <= 0 || out.dampening != 0))
      n["nesterov"].fail("Nesterov momentum needs momentum > 0 and dampening 0");
    return;
  }
  // torch.optim.Adam/AdamW defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0 and 0.01.
  out.weight_decay = n.get_double("weight_decay", out.type == OptimizerType::adamw ? 0.01 : 0.0, 0.0);
  out.eps = n.get_double("eps", 1e-8, 0.0);
  out.amsgrad = n.get_bool("amsgrad", false);
  if (n.has("betas")) {
    const ConfigNode b = n["betas"];
    if (!b.is_sequence() || b.size() != 2) b.fail("expected two numbers [beta1, beta2]");
    out.beta1 = b.at(0).as_double(0.0, 1.0);
    out.beta2 = b.at(1).as_double(0.0, 1.0);
    if (out.beta1 >= 1 || out.beta2 >= 1) b.fail("betas must be below 1");
  }
}

void parse_scheduler(const ConfigNode& n, SchedulerConfig& out) {
  using enum ScheduleType;
  n.require("type");
  out.type = parse_choice(n["type"], kScheduleTypes);
  std::vector<std::string> keys{"type", "warmup_steps", "warmup_start_factor"};
  if (out.type == step) keys.insert(keys.end(), {"step_size", "gamma"});
  if (out.type == multistep) keys.insert(keys.end(), {"milestones", "gamma"});
  if (out.type == exponential) keys.insert(keys.end(), {"gamma"});
  if (out.type == cosine) keys.insert(keys.end(), {"t_max", "eta_min"});
  if (out.type == linear) keys.insert(keys.end(), {"start_factor", "end_factor", "total_iters"});
  if (out.type == onecycle) keys.insert(keys.end(), {"max_lr", "pct_start", "div_factor", "final_div_factor"});
  n.expect_keys(keys);
  out.warmup_steps = n.get_size("warmup_steps", 0, 0, limits::kSteps);
  out.warmup_start_factor = n.get_double("warmup_start_factor", 0.0, 0.0, 1.0);
  if (out.type == step) {
    n.require("step_size");
    out.step_size = n["step_size"].as_size(1, limits::kSteps);
  }
  if (out.type == multistep) {
    n.require("milestones");
    out.milestones = n["milestones"].as_int_list(1);
    if (!std::is_sorted(out.milestones.begin(), out.milestones.end()))
      n["milestones"].fail("expected increasing step numbers");
  }
  if (out.type == exponential) {
    n.require("gamma");
    out.gamma = n["gamma"].as_double(0.0, 1e300, false);
  } else {
    out.gamma = n.get_double("gamma", 0.1, 0.0, 1e300);
  }
  out.t_max = n.get_size("t_max", 0, 0, limits::kSteps);
  out.eta_min = n.get_double("eta_min", 0.0, 0.0);
  out.start_factor = n.get_double("start_factor", 1.0, 0.0);
  out.end_factor = n.get_double("end_factor", 0.0, 0.0);
  out.total_iters = n.get_size("total_iters", 0, 0, limits::kSteps);
  out.max_lr = n.get_double("max_lr", 0.0, 0.0);
  out.pct_start = n.get_double("pct_start", 0.3, 0.0, 1.0);
  out.div_factor = n.get_double("div_factor", 25.0, 0.0);
  out.final_div_factor = n.get_double("final_div_factor", 1e4, 0.0);
  if (out.type == onecycle && (out.pct_start <= 0 || out.pct_start >= 1))
    n["pct_start"].fail("expected a fraction strictly between 0 and 1");
}

YAML::Node to_yaml(const OptimizerConfig& c) {
  YAML::Node o(YAML::NodeType::Map);
  o["type"] = to_string(c.type);
  o["lr"] = c.lr;
  if (c.type == OptimizerType::sgd) {
    o["momentum"] = c.momentum;
    o["dampening"] = c.dampening;
    o["nesterov"] = c.nesterov;
  } else {
    o["betas"].push_back(c.beta1);
    o["betas"].push_back(c.beta2);
    o["betas"].SetStyle(YAML::EmitterStyle::Flow);
    o["eps"] = c.eps;
    o["amsgrad"] = c.amsgrad;
  }
  o["weight_decay"] = c.weight_decay;
  return o;
}

YAML::Node to_yaml(const SchedulerConfig& c) {
  using enum ScheduleType;
  YAML::Node s(YAML::NodeType::Map);
  s["type"] = to_string(c.type);
  s["warmup_steps"] = c.warmup_steps;
  s["warmup_start_factor"] = c.warmup_start_factor;
  if (c.type == step) s["step_size"] = c.step_size, s["gamma"] = c.gamma;
  if (c.type == multistep) {
    s["milestones"] = c.milestones;
    s["milestones"].SetStyle(YAML::EmitterStyle::Flow);
    s["gamma"] = c.gamma;
  }
  if (c.type == exponential) s["gamma"] = c.gamma;
  if (c.type == cosine) s["t_max"] = c.t_max, s["eta_min"] = c.eta_min;
  if (c.type == linear)
    s["start_factor"] = c.start_factor, s["end_factor"] = c.end_factor, s["total_iters"] = c.total_iters;
  if (c.type == onecycle) {
    s["max_lr"] = c.max_lr;
    s["pct_start"] = c.pct_start;
    s["div_factor"] = c.div_factor;
    s["final_div_factor"] = c.final_div_factor;
  }
  return s;
}

}  // namespace gt
