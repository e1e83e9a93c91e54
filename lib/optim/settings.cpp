// Reading and writing back the optimizer and scheduler sections; each unknown key or bad value names its path.
#include "optim/settings.h"

#include "config/choice.h"
#include "config/schema.h"

#include <fmt/format.h>
#include <fnmatch.h>

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

KeySpec weight_decay_key(const char* fallback) {
  return {.name = "weight_decay",
          .kind = KeyKind::number,
          .min = 0,
          .fallback = fallback,
          .doc = "L2 penalty (adam) or decoupled decay (adamw)"};
}

// optimizer.param_groups: a list of groups, each its own learning rate and weight decay.
KeySpec param_groups_key() {
  return {.name = "param_groups",
          .kind = KeyKind::list,
          .max_items = static_cast<int64_t>(kMaxParamGroups - 1),
          .items = {{.name = "group", .kind = KeyKind::map, .section = &param_group_section()}},
          .fallback = "[]",
          .doc =
              "groups of parameters by name, each with its own lr and weight_decay; the first group whose "
              "patterns match a parameter takes it, the top-level values serve the rest"};
}

}  // namespace

const SectionSpec& param_group_section() {
  static const SectionSpec s = plain_section(
      {
          {.name = "params",
           .kind = KeyKind::list,
           .required = true,
           .min_items = 1,
           .items = {{.name = "pattern", .kind = KeyKind::string}},
           .doc = "globs (fnmatch) over the parameters' full names: layers.7.*, *.bias; each must match one"},
          {.name = "lr",
           .kind = KeyKind::number,
           .min = 0,
           .doc = "the group's learning rate, scheduled as the top-level one (default: optimizer.lr)"},
          {.name = "weight_decay", .kind = KeyKind::number, .min = 0, .doc = "default: optimizer.weight_decay"},
      },
      "one parameter group (torch.optim's param_groups)");
  return s;
}

const SectionSpec& optimizer_section() {
  static const SectionSpec s = [] {
    const std::vector<KeySpec> head{
        {.name = "type",
         .kind = KeyKind::choice,
         .required = true,
         .choices = choice_names(kOptimizerTypes),
         .doc = "torch.optim's update rule of that name"},
        {.name = "lr",
         .kind = KeyKind::number,
         .required = true,
         .min = 0,
         .min_exclusive = true,
         .doc = "learning rate"},
    };
    const std::vector<KeySpec> sgd{
        {.name = "momentum", .kind = KeyKind::number, .min = 0, .max = 1, .fallback = "0"},
        {.name = "nesterov",
         .kind = KeyKind::boolean,
         .fallback = "false",
         .doc = "Nesterov momentum (needs momentum > 0 and dampening 0)"},
        {.name = "weight_decay", .kind = KeyKind::number, .min = 0, .fallback = "0", .doc = "L2 penalty"},
        {.name = "dampening", .kind = KeyKind::number, .min = 0, .max = 1, .fallback = "0"},
    };
    auto adam = [](const char* weight_decay) {
      return std::vector<KeySpec>{
          {.name = "betas",
           .kind = KeyKind::list,
           .min_items = 2,
           .max_items = 2,
           .items = {{.name = "beta",
                      .kind = KeyKind::number,
                      .min = 0,
                      .max = 1,
                      .extra_json = R"("exclusiveMaximum": 1)"}},
           .fallback = "[0.9, 0.999]",
           .doc = "[beta1, beta2], each in [0, 1)"},
          {.name = "eps", .kind = KeyKind::number, .min = 0, .fallback = "1e-8"},
          weight_decay_key(weight_decay),
          {.name = "amsgrad", .kind = KeyKind::boolean, .fallback = "false"},
      };
    };
    SectionSpec t;
    t.discriminator = "type";
    t.doc = "the optimizer (torch.optim's exact update rules)";
    const std::vector<KeySpec> groups{param_groups_key()};
    t.variants = {{{"sgd"}, concat_keys({head, sgd, groups})},
                  {{"adam"}, concat_keys({head, adam("0"), groups})},
                  {{"adamw"}, concat_keys({head, adam("0.01"), groups})}};
    return t;
  }();
  return s;
}

const SectionSpec& scheduler_section() {
  static const SectionSpec s = [] {
    const std::vector<KeySpec> head{
        {.name = "type",
         .kind = KeyKind::choice,
         .required = true,
         .choices = choice_names(kScheduleTypes),
         .doc = "torch.optim.lr_scheduler's schedule of that name, stepped once per optimizer step"},
        {.name = "warmup_steps",
         .kind = KeyKind::size,
         .min = 0,
         .limit = &limits::kSteps,
         .fallback = "0",
         .doc = "steps whose factor rises linearly to 1 first"},
        {.name = "warmup_start_factor", .kind = KeyKind::number, .min = 0, .max = 1, .fallback = "0"},
    };
    const KeySpec gamma{
        .name = "gamma", .kind = KeyKind::number, .min = 0, .fallback = "0.1", .doc = "the factor at each decay"};
    SectionSpec t;
    t.discriminator = "type";
    t.doc = "the learning-rate schedule";
    t.variants = {
        {{"constant"}, head},
        {{"step"},
         concat_keys({head,
                      {{.name = "step_size",
                        .kind = KeyKind::size,
                        .required = true,
                        .min = 1,
                        .limit = &limits::kSteps,
                        .doc = "steps between decays"},
                       gamma}})},
        {{"multistep"},
         concat_keys({head,
                      {{.name = "milestones",
                        .kind = KeyKind::list,
                        .required = true,
                        .items = {{.name = "milestone", .kind = KeyKind::integer, .min = 1}},
                        .doc = "increasing step numbers at which the rate decays"},
                       gamma}})},
        {{"exponential"},
         concat_keys({head,
                      {{.name = "gamma",
                        .kind = KeyKind::number,
                        .required = true,
                        .min = 0,
                        .min_exclusive = true,
                        .doc = "the factor per step"}}})},
        {{"cosine"},
         concat_keys({head,
                      {{.name = "t_max",
                        .kind = KeyKind::size,
                        .min = 0,
                        .limit = &limits::kSteps,
                        .fallback = "0",
                        .doc = "steps of one half period (0: the whole run)"},
                       {.name = "eta_min", .kind = KeyKind::number, .min = 0, .fallback = "0"}}})},
        {{"linear"},
         concat_keys({head,
                      {{.name = "start_factor", .kind = KeyKind::number, .min = 0, .fallback = "1"},
                       {.name = "end_factor", .kind = KeyKind::number, .min = 0, .fallback = "0"},
                       {.name = "total_iters",
                        .kind = KeyKind::size,
                        .min = 0,
                        .limit = &limits::kSteps,
                        .fallback = "0",
                        .doc = "0: the whole run"}}})},
        {{"onecycle"},
         concat_keys(
             {head,
              {{.name = "max_lr", .kind = KeyKind::number, .min = 0, .fallback = "0", .doc = "0: the optimizer's lr"},
               {.name = "pct_start",
                .kind = KeyKind::number,
                .min = 0,
                .max = 1,
                .fallback = "0.3",
                .doc = "the rising part, strictly between 0 and 1",
                .extra_json = R"("exclusiveMinimum": 0, "exclusiveMaximum": 1)"},
               {.name = "div_factor", .kind = KeyKind::number, .min = 0, .fallback = "25"},
               {.name = "final_div_factor", .kind = KeyKind::number, .min = 0, .fallback = "1e4"}}})},
    };
    return t;
  }();
  return s;
}

const std::string& to_string(OptimizerType type) { return choice_name(kOptimizerTypes, type); }
const std::string& to_string(ScheduleType type) { return choice_name(kScheduleTypes, type); }

namespace {

void parse_param_groups(const ConfigNode& n, const KeySpec& key, OptimizerConfig& out) {
  if (!n.is_sequence()) n.fail("expected a list of groups, each {params: [patterns], lr, weight_decay}");
  if (n.size() > static_cast<size_t>(key.max_items))
    n.fail(fmt::format("at most {} groups (besides the default one), got {}", key.max_items, n.size()));
  const std::vector<KeySpec>& keys = section_keys(param_group_section());
  for (size_t i = 0; i < n.size(); ++i) {
    const ConfigNode g = n.at(i);
    if (!g.is_map()) g.fail("expected a map {params: [patterns], lr, weight_decay}");
    expect_keys(g, keys);
    g.require("params");
    ParamGroupConfig group;
    group.at = g["params"];
    if (!group.at.is_sequence() || group.at.size() == 0) group.at.fail("expected a list of name patterns");
    for (size_t j = 0; j < group.at.size(); ++j) group.params.push_back(group.at.at(j).as_string());
    if (g.has("lr")) group.lr = read_double(g["lr"], key_spec(keys, "lr"));
    if (g.has("weight_decay")) group.weight_decay = read_double(g["weight_decay"], key_spec(keys, "weight_decay"));
    out.param_groups.push_back(std::move(group));
  }
}

}  // namespace

std::vector<int> param_group_of(const OptimizerConfig& cfg, const std::vector<std::string>& names) {
  auto matches = [&](const std::string& pattern, size_t i) {
    return fnmatch(pattern.c_str(), names[i].c_str(), 0) == 0;
  };
  for (const ParamGroupConfig& group : cfg.param_groups)
    for (const std::string& pattern : group.params) {
      bool any = false;
      for (size_t i = 0; i < names.size() && !any; ++i) any = matches(pattern, i);
      if (any) continue;
      std::string some;
      for (size_t i = 0; i < names.size() && i < 6; ++i) some += (i ? ", " : "") + names[i];
      if (names.size() > 6) some += ", …";
      group.at.fail(fmt::format("{} matches none of the trainable parameters ({})", pattern,
                                names.empty() ? std::string("there are none") : some));
    }
  std::vector<int> out(names.size(), 0);
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t g = 0; g < cfg.param_groups.size() && out[i] == 0; ++g)
      for (const std::string& pattern : cfg.param_groups[g].params)
        if (matches(pattern, i)) {
          out[i] = static_cast<int>(g + 1);
          break;
        }
  return out;
}

std::vector<std::string> describe_param_groups(const OptimizerConfig& cfg, const std::vector<int>& groups,
                                               const std::vector<int64_t>& numels) {
  std::vector<std::string> out;
  if (cfg.param_groups.empty()) return out;
  for (size_t g = 0; g < cfg.groups(); ++g) {
    int64_t params = 0, elements = 0;
    for (size_t i = 0; i < groups.size() && i < numels.size(); ++i)
      if (static_cast<size_t>(groups[i]) == g) ++params, elements += numels[i];
    std::string patterns = "the rest";
    if (g > 0) {
      patterns.clear();
      for (const std::string& p : cfg.param_groups[g - 1].params) patterns += (patterns.empty() ? "" : ", ") + p;
    }
    out.push_back(fmt::format("optimizer group {} [{}]: lr {}, weight_decay {}, {} parameters ({} elements)", g,
                              patterns, cfg.group_lr(g), cfg.group_weight_decay(g), params, elements));
  }
  return out;
}

void parse_optimizer(const ConfigNode& n, OptimizerConfig& out) {
  n.require("type");
  out.type = parse_choice(n["type"], kOptimizerTypes);
  const std::vector<KeySpec>& keys = section_keys(optimizer_section(), to_string(out.type));
  auto key = [&](const char* name) -> const KeySpec& { return key_spec(keys, name); };
  expect_keys(n, keys);
  n.require("lr");
  out.lr = read_double(n["lr"], key("lr"));
  if (n.has("param_groups")) parse_param_groups(n["param_groups"], key("param_groups"), out);
  if (out.type == OptimizerType::sgd) {
    out.momentum = get_double(n, key("momentum"));
    out.dampening = get_double(n, key("dampening"));
    out.weight_decay = get_double(n, key("weight_decay"));
    out.nesterov = get_bool(n, key("nesterov"));
    // torch.optim.SGD: "Nesterov momentum requires a momentum and zero dampening".
    if (out.nesterov && (out.momentum <= 0 || out.dampening != 0))
      n["nesterov"].fail("Nesterov momentum needs momentum > 0 and dampening 0");
    return;
  }
  // torch.optim.Adam/AdamW defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0 and 0.01.
  out.weight_decay = get_double(n, key("weight_decay"));
  out.eps = get_double(n, key("eps"));
  out.amsgrad = get_bool(n, key("amsgrad"));
  if (n.has("betas")) {
    const ConfigNode b = n["betas"];
    const KeySpec& beta = key("betas").items[0];
    if (!b.is_sequence() || b.size() != 2) b.fail("expected two numbers [beta1, beta2]");
    out.beta1 = read_double(b.at(0), beta);
    out.beta2 = read_double(b.at(1), beta);
    if (out.beta1 >= 1 || out.beta2 >= 1) b.fail("betas must be below 1");
  }
}

void parse_scheduler(const ConfigNode& n, SchedulerConfig& out) {
  using enum ScheduleType;
  n.require("type");
  out.type = parse_choice(n["type"], kScheduleTypes);
  const std::vector<KeySpec>& keys = section_keys(scheduler_section(), to_string(out.type));
  expect_keys(n, keys);
  // Each key is read whatever the type (its default stays when the type has no such key); the entry is the type's
  // own where it has one.
  auto key = [&](const char* name) -> const KeySpec& {
    for (const KeySpec& k : keys)
      if (k.name == name) return k;
    for (const auto& v : scheduler_section().variants)
      for (const KeySpec& k : v.keys)
        if (k.name == name && !k.required) return k;
    return key_spec(keys, name);  // throws: not in the table
  };
  out.warmup_steps = get_size(n, key("warmup_steps"));
  out.warmup_start_factor = get_double(n, key("warmup_start_factor"));
  if (out.type == step) {
    n.require("step_size");
    out.step_size = read_size(n["step_size"], key("step_size"));
  }
  if (out.type == multistep) {
    n.require("milestones");
    out.milestones = n["milestones"].as_int_list(static_cast<int64_t>(key("milestones").items[0].min));
    if (!std::is_sorted(out.milestones.begin(), out.milestones.end()))
      n["milestones"].fail("expected increasing step numbers");
  }
  if (out.type == exponential) {
    n.require("gamma");
    out.gamma = read_double(n["gamma"], key("gamma"));
  } else {
    out.gamma = get_double(n, key("gamma"));
  }
  out.t_max = get_size(n, key("t_max"));
  out.eta_min = get_double(n, key("eta_min"));
  out.start_factor = get_double(n, key("start_factor"));
  out.end_factor = get_double(n, key("end_factor"));
  out.total_iters = get_size(n, key("total_iters"));
  out.max_lr = get_double(n, key("max_lr"));
  out.pct_start = get_double(n, key("pct_start"));
  out.div_factor = get_double(n, key("div_factor"));
  out.final_div_factor = get_double(n, key("final_div_factor"));
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
  // Only the keys a group gave: the others follow the top-level values, also when a later run overrides them.
  for (const ParamGroupConfig& g : c.param_groups) {
    YAML::Node y(YAML::NodeType::Map);
    y["params"] = g.params;
    y["params"].SetStyle(YAML::EmitterStyle::Flow);
    if (g.lr) y["lr"] = *g.lr;
    if (g.weight_decay) y["weight_decay"] = *g.weight_decay;
    o["param_groups"].push_back(y);
  }
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
