// Reading and validating the experiment file section by section; each unknown key or bad value names its path.
#include "train/experiment.h"

#include <filesystem>
#include <map>

namespace gt {
namespace {

std::string existing_file(const ConfigNode& n) {
  const std::string path = n.as_string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    n.fail(fmt::format("file not found: {}{}", path,
                       path.rfind("/usr/share/datasets/", 0) == 0 ? " (scripts/setup.sh installs the data sets)" : ""));
  }
  return path;
}

void parse_data(const ConfigNode& d, DataConfig& out) {
  d.require("format");
  out.format = d["format"].as_choice({"idx", "synthetic"});
  if (out.format == "idx") {
    d.expect_keys({"format", "train", "test", "scale", "batch_size", "shuffle"});
    d.require("train");
    for (const char* split : {"train", "test"}) {
      const ConfigNode s = d[split];
      if (!s.defined()) continue;
      s.expect_keys({"images", "labels"});
      s.require("images");
      s.require("labels");
      const std::string images = existing_file(s["images"]), labels = existing_file(s["labels"]);
      (std::string(split) == "train" ? out.train_images : out.test_images) = images;
      (std::string(split) == "train" ? out.train_labels : out.test_labels) = labels;
    }
    out.scale = d.get_double("scale", 1.0);
  } else {
    d.expect_keys({"format", "samples", "test_samples", "input_shape", "targets", "batch_size", "shuffle"});
    d.require("samples");
    d.require("input_shape");
    d.require("targets");
    out.synthetic.samples = d["samples"].as_int(1);
    out.synthetic.test_samples = d.get_int("test_samples", 0, 0);
    out.synthetic.input_shape = d["input_shape"].as_int_list(1);
    if (out.synthetic.input_shape.empty()) d["input_shape"].fail("expected at least one dimension");
    const ConfigNode t = d["targets"];
    t.expect_keys({"shape", "classes"});
    if (t.has("classes") == t.has("shape")) t.fail("give exactly one of `classes: K` or `shape: [..]`");
    if (t.has("classes")) {
      out.synthetic.classes = t["classes"].as_int(2);
    } else {
      out.synthetic.target_shape = t["shape"].as_int_list(1);
      if (out.synthetic.target_shape.empty()) t["shape"].fail("expected at least one dimension");
    }
  }
  out.batch_size = d.get_int("batch_size", 64, 1);
  out.shuffle = d.get_bool("shuffle", true);
}

void parse_loss(const ConfigNode& n, LossConfig& out) {
  const std::vector<std::string> types{"cross_entropy", "mse"};
  if (n.is_scalar()) {
    out.type = n.as_choice(types);
    return;
  }
  n.expect_keys({"type", "label_smoothing"});
  n.require("type");
  out.type = n["type"].as_choice(types);
  out.label_smoothing = n.get_double("label_smoothing", 0.0, 0.0, 1.0);
  if (out.label_smoothing != 0 && out.type != "cross_entropy")
    n["label_smoothing"].fail("applies to cross_entropy only");
}

void parse_optimizer(const ConfigNode& n, OptimizerConfig& out) {
  n.expect_keys({"type", "lr", "momentum", "nesterov", "weight_decay", "dampening"});
  n.require("type");
  out.type = n["type"].as_choice({"sgd"});
  n.require("lr");
  out.lr = n["lr"].as_double(0.0, 1e300, false);
  out.momentum = n.get_double("momentum", 0.0, 0.0, 1.0);
  out.dampening = n.get_double("dampening", 0.0, 0.0, 1.0);
  out.weight_decay = n.get_double("weight_decay", 0.0, 0.0);
  out.nesterov = n.get_bool("nesterov", false);
  // torch.optim.SGD: "Nesterov momentum requires a momentum and zero dampening".
  if (out.nesterov && (out.momentum <= 0 || out.dampening != 0))
    n["nesterov"].fail("Nesterov momentum needs momentum > 0 and dampening 0");
}

void parse_train(const ConfigNode& n, TrainConfig& out) {
  n.expect_keys({"epochs", "log_every", "max_steps"});
  out.epochs = n.get_int("epochs", 1, 1);
  out.log_every = n.get_int("log_every", 100, 1);
  out.max_steps = n.get_int("max_steps", 0, 0);
}

void check_device(const ConfigNode& n) {
  if (n.is_sequence()) {
    if (n.size() == 0) n.fail("expected at least one device index");
    for (size_t i = 0; i < n.size(); ++i) n.at(i).as_int(0);
    return;
  }
  const std::string d = n.as_string();
  if (d == "auto" || d == "cpu" || d == "cuda") return;
  if (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.find_first_not_of("0123456789", 5) == std::string::npos) return;
  n.fail(fmt::format("unknown device \"{}\"; choose auto, cpu, cuda, cuda:N or a list of GPU indices [0, 1]", d));
}

}  // namespace

ConfigNode load_config(const std::string& file, const std::vector<std::string>& overrides) {
  ConfigNode root = ConfigNode::load_file(file);
  if (!root.is_map()) root.fail("expected a map of settings at the top of the file");
  for (const auto& o : overrides) root = apply_override(root, o);
  return root;
}

Experiment parse_experiment(const ConfigNode& root) {
  if (!root.is_map()) root.fail("expected a map of settings at the top of the file");
  // A section's key written at the top level is a common slip: point at where it belongs.
  static const std::map<std::string, std::string> nested = {
      {"epochs", "train.epochs"},      {"log_every", "train.log_every"}, {"max_steps", "train.max_steps"},
      {"lr", "optimizer.lr"},          {"momentum", "optimizer.momentum"}, {"weight_decay", "optimizer.weight_decay"},
      {"batch_size", "data.batch_size"}, {"layers", "model.layers"},      {"shuffle", "data.shuffle"}};
  for (const auto& key : root.keys())
    if (auto it = nested.find(key); it != nested.end())
      root[key].fail(fmt::format("unknown key (did you mean \"{}\"?)", it->second));
  root.expect_keys({"name", "seed", "device", "data", "model", "loss", "optimizer", "train"});
  Experiment exp;
  exp.root = root;
  exp.name = root.get_string("name", "experiment");
  if (exp.name.empty() || exp.name.find_first_of("/\\") != std::string::npos)
    root["name"].fail("expected a non-empty name without slashes (it names the run directory)");
  exp.seed = static_cast<uint64_t>(root.get_int("seed", 0, 0));
  if (root.has("device")) {
    check_device(root["device"]);
    exp.device = root["device"].is_sequence() ? YAML::Dump(root["device"].yaml()) : root["device"].as_string();
  }
  root.require("data");
  parse_data(root["data"], exp.data);
  root.require("model");
  if (root.has("loss")) parse_loss(root["loss"], exp.loss);
  root.require("optimizer");
  parse_optimizer(root["optimizer"], exp.optimizer);
  if (root.has("train")) parse_train(root["train"], exp.train);
  return exp;
}

YAML::Node resolved_config(const Experiment& e, const YAML::Node& layers) {
  YAML::Node n(YAML::NodeType::Map);
  n["name"] = e.name;
  n["seed"] = e.seed;
  n["device"] = YAML::Load(e.device);
  YAML::Node d(YAML::NodeType::Map);
  d["format"] = e.data.format;
  if (e.data.format == "idx") {
    d["train"]["images"] = e.data.train_images;
    d["train"]["labels"] = e.data.train_labels;
    if (!e.data.test_images.empty()) {
      d["test"]["images"] = e.data.test_images;
      d["test"]["labels"] = e.data.test_labels;
    }
    d["scale"] = e.data.scale;
  } else {
    d["samples"] = e.data.synthetic.samples;
    d["test_samples"] = e.data.synthetic.test_samples;
    d["input_shape"] = e.data.synthetic.input_shape;
    d["input_shape"].SetStyle(YAML::EmitterStyle::Flow);
    if (e.data.synthetic.classes > 0) {
      d["targets"]["classes"] = e.data.synthetic.classes;
    } else {
      d["targets"]["shape"] = e.data.synthetic.target_shape;
      d["targets"]["shape"].SetStyle(YAML::EmitterStyle::Flow);
    }
  }
  d["batch_size"] = e.data.batch_size;
  d["shuffle"] = e.data.shuffle;
  n["data"] = d;
  n["model"]["layers"] = layers;
  n["loss"]["type"] = e.loss.type;
  if (e.loss.type == "cross_entropy") n["loss"]["label_smoothing"] = e.loss.label_smoothing;
  YAML::Node o(YAML::NodeType::Map);
  o["type"] = e.optimizer.type;
  o["lr"] = e.optimizer.lr;
  o["momentum"] = e.optimizer.momentum;
  o["dampening"] = e.optimizer.dampening;
  o["nesterov"] = e.optimizer.nesterov;
  o["weight_decay"] = e.optimizer.weight_decay;
  n["optimizer"] = o;
  n["train"]["epochs"] = e.train.epochs;
  n["train"]["log_every"] = e.train.log_every;
  n["train"]["max_steps"] = e.train.max_steps;
  return n;
}

}  // namespace gt
