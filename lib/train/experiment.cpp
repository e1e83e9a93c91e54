// Reading and validating the experiment file: the top level and the device here, each section by its owner's
// parser; the resolved config from each section's writer. Each unknown key or bad value names its path.
#include "train/experiment.h"

#include "core/quote.h"
#include "graph/model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>

namespace gt {
namespace {

// A device list (`[0, 1]`, `[cuda:0, cuda:1]`, `[cpu, cpu]`) gives one worker per entry; returns it normalised
// ("cuda:N" | "cpu"), or empty for a single device.
std::vector<std::string> check_device(const ConfigNode& n) {
  if (n.is_sequence()) {
    if (n.size() == 0) n.fail("expected at least one device");
    std::vector<std::string> list;
    for (size_t i = 0; i < n.size(); ++i) {
      const ConfigNode e = n.at(i);
      const std::string v = e.as_string();
      if (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos)
        list.push_back(fmt::format("cuda:{}", e.as_int(0)));
      else if (v == "cpu" ||
               (v.rfind("cuda:", 0) == 0 && v.size() > 5 && v.find_first_not_of("0123456789", 5) == std::string::npos))
        list.push_back(v);
      else
        e.fail(fmt::format("expected a GPU index, cuda:N or cpu, got \"{}\"", v));
      for (size_t j = 0; j + 1 < list.size(); ++j)
        if (list[j] == list.back() && list.back() != "cpu")
          e.fail(fmt::format("{} is listed twice (one worker per device)", list.back()));
    }
    if (list.size() > 1 && std::count(list.begin(), list.end(), "cpu") != 0 &&
        std::count(list.begin(), list.end(), "cpu") != static_cast<std::ptrdiff_t>(list.size()))
      n.fail("a device list is all GPUs or all cpu, not a mix (the replicas must compute alike)");
    return list;
  }
  const std::string d = n.as_string();
  if (d == "auto" || d == "cpu" || d == "cuda") return {};
  if (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.find_first_not_of("0123456789", 5) == std::string::npos) return {};
  n.fail(fmt::format("unknown device \"{}\"; choose auto, cpu, cuda, cuda:N or a list of GPU indices [0, 1]", d));
}

// The name is one path component of runs/<name>/: checked before anything is created, so that "a\0b" cannot leave
// an empty runs/a behind, ".." cannot write outside runs/, and a newline or 300 characters cannot reach the file
// system.
void check_run_name(const ConfigNode& n, const std::string& name) {
  const char* why = "(it names the run directory)";
  if (name.empty() || name.find_first_of("/\\") != std::string::npos)
    n.fail(fmt::format("expected a non-empty name without slashes {}", why));
  if (name == "." || name == "..") n.fail(fmt::format("{} is not a name {}", quote_value(name), why));
  if (static_cast<int64_t>(name.size()) > limits::kRunNameChars)
    n.fail(fmt::format("expected at most {} characters, got {} {}", limits::kRunNameChars, name.size(), why));
  for (const char c : name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      n.fail(fmt::format("expected printable characters, got {} {}", quote_value(name), why));
}

// train.cuda_graphs asks for what the config itself can rule out: a captured step runs on one GPU and needs no host
// decision inside it. (Several ranks under a launcher, a device: auto that finds no GPU and dropout layers are
// refused when the run starts: StepLoop.)
void check_cuda_graphs(const Experiment& exp) {
  if (!exp.train.cuda_graphs) return;
  const ConfigNode& key = exp.at.cuda_graphs;
  const bool all_cpu =
      exp.devices.empty() ? exp.device == "cpu" : std::count(exp.devices.begin(), exp.devices.end(), "cpu") > 0;
  if (all_cpu) key.fail("CUDA graphs need a GPU, and device is cpu (set device: cuda, or cuda_graphs: false)");
  if (exp.devices.size() > 1)
    key.fail(
        fmt::format("CUDA graphs capture one device's step; device lists {} devices (the gradient all-reduce "
                    "over several is not captured)",
                    exp.devices.size()));
  if (exp.train.accumulate > 1)
    key.fail(
        fmt::format("train.accumulate: {} copies a batch between the micro-batches of a step, which a captured "
                    "step cannot do (use accumulate: 1 with a larger data.batch_size)",
                    exp.train.accumulate));
  if (exp.train.profile_steps > 0)
    key.fail(
        "train.profile times each layer from the host, which a captured step cannot do (profile without "
        "cuda_graphs)");
  if (exp.dist.offload == "optimizer")
    key.fail("dist.offload: optimizer updates the weights on the host, which a captured step cannot do");
}

}  // namespace

const SectionSpec& experiment_section() {
  static const SectionSpec s = plain_section(
      {
          {.name = "name",
           .kind = KeyKind::string,
           .pattern = R"(^(?!\.\.?$)[^/\\\x00-\x1f\x7f]+$)",
           .max_length = limits::kRunNameChars,
           .fallback = "experiment",
           .doc = "run name: the default run directory is runs/<name>/<YYYYmmdd-HHMMSS>/"},
          {.name = "seed",
           .kind = KeyKind::integer,
           .min = 0,
           .fallback = "0",
           .doc = "one seed for everything: initial weights, shuffling and synthetic data"},
          {.name = "device",
           .kind = KeyKind::any_of,
           .items =
               {{.name = "device", .kind = KeyKind::string, .pattern = "^(auto|cpu|cuda|cuda:[0-9]+)$"},
                {.name = "devices",
                 .kind = KeyKind::list,
                 .min_items = 1,
                 .items = {{.name = "device",
                            .kind = KeyKind::any_of,
                            .items = {{.name = "gpu", .kind = KeyKind::integer, .min = 0},
                                      {.name = "device", .kind = KeyKind::string, .pattern = "^(cpu|cuda:[0-9]+)$"}}}},
                 .doc = "one worker per device: all GPUs or all cpu"}},
           .fallback = "auto",
           .doc = "auto | cpu | cuda | cuda:N | a list of GPU indices [0, 1]"},
          {.name = "data", .kind = KeyKind::map, .required = true, .section = &data_section()},
          {.name = "model", .kind = KeyKind::map, .required = true, .section = &model_section()},
          loss_key(),
          {.name = "optimizer", .kind = KeyKind::map, .required = true, .section = &optimizer_section()},
          {.name = "scheduler", .kind = KeyKind::map, .section = &scheduler_section()},
          {.name = "train", .kind = KeyKind::map, .section = &train_section()},
          {.name = "checkpoint", .kind = KeyKind::map, .section = &checkpoint_section()},
          {.name = "dist", .kind = KeyKind::map, .section = &dist_section()},
          {.name = "logging", .kind = KeyKind::map, .section = &logging_section()},
      },
      "a gputrain experiment");
  return s;
}

ConfigNode load_config(const std::string& file, const std::vector<std::string>& overrides) {
  ConfigNode root = ConfigNode::load_file(file);
  if (!root.is_map()) root.fail("expected a map of settings at the top of the file");
  for (const auto& o : overrides) root = apply_override(root, o);
  return root;
}

namespace {
Experiment parse(const ConfigNode& root, bool check_data_files);
}  // namespace

Experiment parse_experiment(const ConfigNode& root) { return parse(root, true); }
Experiment parse_experiment_without_data_files(const ConfigNode& root) { return parse(root, false); }

namespace {
Experiment parse(const ConfigNode& root, bool check_data_files) {
  if (!root.is_map()) root.fail("expected a map of settings at the top of the file");
  // A section's key written at the top level is a common slip: point at where it belongs.
  static const std::map<std::string, std::string> nested = {
      {"epochs", "train.epochs"},         {"log_every", "train.log_every"},
      {"max_steps", "train.max_steps"},   {"lr", "optimizer.lr"},
      {"momentum", "optimizer.momentum"}, {"weight_decay", "optimizer.weight_decay"},
      {"batch_size", "data.batch_size"},  {"layers", "model.layers"},
      {"shuffle", "data.shuffle"}};
  for (const auto& key : root.keys())
    if (auto it = nested.find(key); it != nested.end())
      root[key].fail(fmt::format("unknown key (did you mean \"{}\"?)", it->second));
  const std::vector<KeySpec>& keys = section_keys(experiment_section());
  expect_keys(root, keys);
  Experiment exp;
  exp.name = root.get_string("name", key_spec(keys, "name").fallback);
  check_run_name(root["name"], exp.name);
  exp.seed = static_cast<uint64_t>(get_int(root, key_spec(keys, "seed")));
  if (root.has("device")) {
    exp.devices = check_device(root["device"]);
    exp.device = root["device"].is_sequence() ? YAML::Dump(root["device"].yaml()) : root["device"].as_string();
  }
  root.require("data");
  exp.data.check_files = check_data_files;
  parse_data(root["data"], exp.data);
  root.require("model");
  if (root.has("loss")) parse_loss(root["loss"], exp.loss);
  root.require("optimizer");
  parse_optimizer(root["optimizer"], exp.optimizer);
  if (root.has("scheduler")) parse_scheduler(root["scheduler"], exp.scheduler);
  if (root.has("train")) parse_train(root["train"], exp.train);
  if (root.has("checkpoint")) parse_checkpoint(root["checkpoint"], exp.checkpoint);
  if (root.has("dist")) parse_dist(root["dist"], exp.dist);
  if (root.has("logging")) parse_logging(root["logging"], exp.logging, exp.train.log_every);
  const ConfigNode data = root["data"], train = root["train"];
  exp.at.data = data;
  exp.at.batch_size = data["batch_size"];
  exp.at.augment = data["augment"];
  exp.at.tta = data["tta"];
  exp.at.accumulate = train["accumulate"];
  exp.at.recompute = train["recompute"];
  exp.at.cuda_graphs = train["cuda_graphs"];
  exp.at.init_from = train["init_from"];
  exp.at.freeze = train["freeze"];
  check_cuda_graphs(exp);
  exp.model = parse_model_spec(root["model"]);
  exp.model.lora = parse_lora_plan(train["lora"]);
  exp.at.loss = root.has("loss") ? root["loss"] : exp.model.where;
  return exp;
}
}  // namespace

YAML::Node resolved_config(const Experiment& e, const YAML::Node& layers) {
  YAML::Node n(YAML::NodeType::Map);
  n["name"] = e.name;
  n["seed"] = e.seed;
  n["device"] = YAML::Load(e.device);
  n["data"] = to_yaml(e.data);
  n["model"]["layers"] = layers;
  n["loss"] = to_yaml(e.loss);
  n["optimizer"] = to_yaml(e.optimizer);
  n["scheduler"] = to_yaml(e.scheduler);
  n["train"] = to_yaml(e.train);
  if (e.model.lora) n["train"]["lora"] = to_yaml(*e.model.lora);
  n["checkpoint"] = to_yaml(e.checkpoint);
  n["dist"] = to_yaml(e.dist);
  n["logging"] = to_yaml(e.logging);
  return n;
}

namespace {

// yaml-cpp writes a double with 17 significant digits (0.050000000000000003): each such scalar becomes its shortest
// form that reads back as the same double (0.05).
void shorten_floats(YAML::Node n) {
  if (n.IsMap()) {
    for (auto kv : n) shorten_floats(kv.second);
  } else if (n.IsSequence()) {
    for (auto v : n) shorten_floats(v);
  } else if (n.IsScalar()) {
    const std::string s = n.Scalar();
    if (s.size() < 16 || s.find_first_not_of("0123456789+-.eE") != std::string::npos) return;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (*end != '\0' || !std::isfinite(v)) return;
    std::string t = fmt::format("{}", v);
    // YAML 1.1 readers (PyYAML) take a float only with a dot: 1e-05 is written 1.0e-05, as a float reads back.
    if (const size_t e = t.find('e'); e != std::string::npos && t.find('.') == std::string::npos) t.insert(e, ".0");
    if (t.size() < s.size() && std::strtod(t.c_str(), nullptr) == v) n = t;
  }
}

}  // namespace

std::string resolved_config_text(const Experiment& exp, const YAML::Node& resolved_layers) {
  YAML::Node n = resolved_config(exp, resolved_layers);
  shorten_floats(n);
  YAML::Emitter em;
  em << n;
  return std::string(em.c_str()) + "\n";
}

std::string run_config_text(const std::string& resolved) {
  namespace fs = std::filesystem;
  YAML::Node n = YAML::Load(resolved);
  YAML::Node data = n["data"];
  const auto absolute = [](YAML::Node v) {
    if (!v.IsScalar()) return;
    const std::string path = v.as<std::string>();
    std::error_code ec;
    if (!path.empty() && path[0] != '/') v = fs::absolute(path, ec).lexically_normal().string();
  };
  if (data.IsMap() && data["format"].as<std::string>("") != "synthetic") {
    for (const char* split : {"train", "test"}) {
      YAML::Node s = data[split];
      if (s.IsScalar()) absolute(s);
      if (s.IsMap())
        for (auto kv : s) absolute(kv.second);
    }
    if (data["cache"].IsScalar()) absolute(data["cache"]);
  }
  if (YAML::Node train = n["train"]; train.IsMap() && train["init_from"]) absolute(train["init_from"]);
  YAML::Emitter em;
  em << n;
  return std::string(em.c_str()) + "\n";
}

}  // namespace gt
