// Reading and validating the experiment file section by section; each unknown key or bad value names its path.
#include "train/experiment.h"

#include <algorithm>
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
  out.format = d["format"].as_choice({"idx", "csv", "npy", "synthetic"});
  if (out.format == "csv") {
    d.expect_keys({"format", "train", "test", "label", "header", "targets", "batch_size", "shuffle", "augment"});
    d.require("train");
    for (const char* split : {"train", "test"}) {
      const ConfigNode s = d[split];
      if (!s.defined()) continue;
      s.expect_keys({"path"});
      s.require("path");
      (std::string(split) == "train" ? out.train_csv : out.test_csv) = existing_file(s["path"]);
    }
    if (d.has("label")) out.csv.label = d["label"].as_string();
    out.csv.header = d.get_choice("header", "auto", {"auto", "true", "false"});
    out.csv.classes = d.get_choice("targets", "classes", {"classes", "values"}) == "classes";
  } else if (out.format == "npy") {
    d.expect_keys({"format", "train", "test", "scale", "batch_size", "shuffle", "augment"});
    d.require("train");
    for (const char* split : {"train", "test"}) {
      const ConfigNode s = d[split];
      if (!s.defined()) continue;
      s.expect_keys({"inputs", "targets"});
      s.require("inputs");
      s.require("targets");
      const std::string inputs = existing_file(s["inputs"]), targets = existing_file(s["targets"]);
      (std::string(split) == "train" ? out.train_images : out.test_images) = inputs;
      (std::string(split) == "train" ? out.train_labels : out.test_labels) = targets;
    }
    out.scale = d.get_double("scale", 1.0);
  } else if (out.format == "idx") {
    d.expect_keys({"format", "train", "test", "scale", "batch_size", "shuffle", "augment"});
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
    d.expect_keys({"format", "samples", "test_samples", "input_shape", "targets", "batch_size", "shuffle", "augment"});
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
  if (d.has("augment")) {
    const ConfigNode a = d["augment"];
    a.expect_keys({"random_crop", "hflip"});
    if (a.has("random_crop")) {
      a["random_crop"].expect_keys({"padding"});
      a["random_crop"].require("padding");
      out.augment.crop_padding = a["random_crop"]["padding"].as_int(0);
    }
    out.augment.hflip = a.get_bool("hflip", false);
  }
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
  n.require("type");
  out.type = n["type"].as_choice({"sgd", "adam", "adamw"});
  if (out.type == "sgd") {
    n.expect_keys({"type", "lr", "momentum", "nesterov", "weight_decay", "dampening"});
  } else {
    n.expect_keys({"type", "lr", "betas", "eps", "weight_decay", "amsgrad"});
  }
  n.require("lr");
  out.lr = n["lr"].as_double(0.0, 1e300, false);
  if (out.type == "sgd") {
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
  out.weight_decay = n.get_double("weight_decay", out.type == "adamw" ? 0.01 : 0.0, 0.0);
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
  n.require("type");
  out.type = n["type"].as_choice({"constant", "step", "multistep", "exponential", "cosine", "linear", "onecycle"});
  std::vector<std::string> keys{"type", "warmup_steps", "warmup_start_factor"};
  if (out.type == "step") keys.insert(keys.end(), {"step_size", "gamma"});
  if (out.type == "multistep") keys.insert(keys.end(), {"milestones", "gamma"});
  if (out.type == "exponential") keys.insert(keys.end(), {"gamma"});
  if (out.type == "cosine") keys.insert(keys.end(), {"t_max", "eta_min"});
  if (out.type == "linear") keys.insert(keys.end(), {"start_factor", "end_factor", "total_iters"});
  if (out.type == "onecycle") keys.insert(keys.end(), {"max_lr", "pct_start", "div_factor", "final_div_factor"});
  n.expect_keys(keys);
  out.warmup_steps = n.get_int("warmup_steps", 0, 0);
  out.warmup_start_factor = n.get_double("warmup_start_factor", 0.0, 0.0, 1.0);
  if (out.type == "step") {
    n.require("step_size");
    out.step_size = n["step_size"].as_int(1);
  }
  if (out.type == "multistep") {
    n.require("milestones");
    out.milestones = n["milestones"].as_int_list(1);
    if (!std::is_sorted(out.milestones.begin(), out.milestones.end()))
      n["milestones"].fail("expected increasing step numbers");
  }
  if (out.type == "exponential") {
    n.require("gamma");
    out.gamma = n["gamma"].as_double(0.0, 1e300, false);
  } else {
    out.gamma = n.get_double("gamma", 0.1, 0.0, 1e300);
  }
  out.t_max = n.get_int("t_max", 0, 0);
  out.eta_min = n.get_double("eta_min", 0.0, 0.0);
  out.start_factor = n.get_double("start_factor", 1.0, 0.0);
  out.end_factor = n.get_double("end_factor", 0.0, 0.0);
  out.total_iters = n.get_int("total_iters", 0, 0);
  out.max_lr = n.get_double("max_lr", 0.0, 0.0);
  out.pct_start = n.get_double("pct_start", 0.3, 0.0, 1.0);
  out.div_factor = n.get_double("div_factor", 25.0, 0.0);
  out.final_div_factor = n.get_double("final_div_factor", 1e4, 0.0);
  if (out.type == "onecycle" && (out.pct_start <= 0 || out.pct_start >= 1))
    n["pct_start"].fail("expected a fraction strictly between 0 and 1");
}

void parse_train(const ConfigNode& n, TrainConfig& out) {
  n.expect_keys({"epochs", "log_every", "max_steps", "eval_every", "accumulate", "grad_clip", "profile", "nonfinite",
                 "max_skips"});
  if (n.has("nonfinite")) out.nonfinite = n["nonfinite"].as_choice({"abort", "skip", "rollback"});
  out.max_skips = n.get_int("max_skips", 5, 1);
  if (n.has("profile")) {
    const ConfigNode p = n["profile"];
    p.expect_keys({"start_step", "steps"});
    out.profile_start = p.get_int("start_step", 5, 1);
    out.profile_steps = p.get_int("steps", 20, 1);
  }
  out.epochs = n.get_int("epochs", 1, 1);
  out.log_every = n.get_int("log_every", 100, 1);
  out.max_steps = n.get_int("max_steps", 0, 0);
  out.accumulate = n.get_int("accumulate", 1, 1);
  if (n.has("eval_every")) {
    const ConfigNode e = n["eval_every"];
    out.eval_every = e.is_scalar() && e.as_string() == "epoch" ? 0 : e.as_int(1);
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
  out.every_steps = n.get_int("every_steps", 0, 0);
  out.every_epochs = n.get_int("every_epochs", 1, 0);
  out.keep = n.get_int("keep", 3, 1);
  if (n.has("keep_best"))  // null (or absent) keeps no best
    out.keep_best = n["keep_best"].as_choice({"test_accuracy", "test_loss"});
}

void parse_dist(const ConfigNode& n, DistConfig& out) {
  n.expect_keys({"bucket_mb", "timeout_s", "overlap", "sync_batchnorm"});
  out.sync_batchnorm = n.get_bool("sync_batchnorm", false);
  // Synchronised batch norm all-reduces on the training thread during backward; the gradient buckets' all-reduces
  // on the communication thread would then race it for the same communicator (and their order could differ
  // between ranks), so it all-reduces the buckets after backward instead.
  if (out.sync_batchnorm && n.has("overlap") && n.get_bool("overlap", false))
    n["overlap"].fail("dist.overlap cannot be true with dist.sync_batchnorm (batch norm's all-reduces run during "
                      "backward); leave it out or set it false");
  out.overlap = n.get_bool("overlap", !out.sync_batchnorm);
  out.bucket_mb = n.get_double("bucket_mb", 25, 1e-3, 1e6);
  out.timeout_s = n.get_double("timeout_s", 300, 0.1, 1e7);
}

// logging.every_steps is train.log_every under the name the other logging settings suggest; given, it wins.
void parse_logging(const ConfigNode& n, LoggingConfig& out, TrainConfig& train) {
  n.expect_keys({"every_steps", "tensorboard", "jsonl", "report", "level", "gpu_metrics", "interval_s", "progress"});
  if (n.has("every_steps")) train.log_every = n["every_steps"].as_int(1);
  out.tensorboard = n.get_bool("tensorboard", true);
  out.jsonl = n.get_bool("jsonl", true);
  out.report = n.get_bool("report", true);
  out.level = n.get_choice("level", "info", {"debug", "info", "warn", "error"});
  out.gpu_metrics = n.get_bool("gpu_metrics", true);
  out.interval_s = n.get_double("interval_s", 1.0, 1e-3, 3600);
  out.progress = n.get_bool("progress", true);
}

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
      else if (v == "cpu" || (v.rfind("cuda:", 0) == 0 && v.size() > 5 &&
                              v.find_first_not_of("0123456789", 5) == std::string::npos))
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
  root.expect_keys(
      {"name", "seed", "device", "data", "model", "loss", "optimizer", "scheduler", "train", "checkpoint", "dist",
       "logging"});
  Experiment exp;
  exp.root = root;
  exp.name = root.get_string("name", "experiment");
  if (exp.name.empty() || exp.name.find_first_of("/\\") != std::string::npos)
    root["name"].fail("expected a non-empty name without slashes (it names the run directory)");
  exp.seed = static_cast<uint64_t>(root.get_int("seed", 0, 0));
  if (root.has("device")) {
    exp.devices = check_device(root["device"]);
    exp.device = root["device"].is_sequence() ? YAML::Dump(root["device"].yaml()) : root["device"].as_string();
  }
  root.require("data");
  parse_data(root["data"], exp.data);
  root.require("model");
  if (root.has("loss")) parse_loss(root["loss"], exp.loss);
  root.require("optimizer");
  parse_optimizer(root["optimizer"], exp.optimizer);
  if (root.has("scheduler")) parse_scheduler(root["scheduler"], exp.scheduler);
  if (root.has("train")) parse_train(root["train"], exp.train);
  if (root.has("checkpoint")) parse_checkpoint(root["checkpoint"], exp.checkpoint);
  if (root.has("dist")) parse_dist(root["dist"], exp.dist);
  if (root.has("logging")) parse_logging(root["logging"], exp.logging, exp.train);
  return exp;
}

YAML::Node resolved_config(const Experiment& e, const YAML::Node& layers) {
  YAML::Node n(YAML::NodeType::Map);
  n["name"] = e.name;
  n["seed"] = e.seed;
  n["device"] = YAML::Load(e.device);
  YAML::Node d(YAML::NodeType::Map);
  d["format"] = e.data.format;
  if (e.data.format == "csv") {
    d["train"]["path"] = e.data.train_csv;
    if (!e.data.test_csv.empty()) d["test"]["path"] = e.data.test_csv;
    if (!e.data.csv.label.empty()) d["label"] = e.data.csv.label;
    d["header"] = e.data.csv.header;
    d["targets"] = e.data.csv.classes ? "classes" : "values";
  } else if (e.data.format == "npy") {
    d["train"]["inputs"] = e.data.train_images;
    d["train"]["targets"] = e.data.train_labels;
    if (!e.data.test_images.empty()) {
      d["test"]["inputs"] = e.data.test_images;
      d["test"]["targets"] = e.data.test_labels;
    }
    d["scale"] = e.data.scale;
  } else if (e.data.format == "idx") {
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
  if (e.data.augment.crop_padding >= 0) d["augment"]["random_crop"]["padding"] = e.data.augment.crop_padding;
  if (e.data.augment.hflip) d["augment"]["hflip"] = true;
  n["data"] = d;
  n["model"]["layers"] = layers;
  n["loss"]["type"] = e.loss.type;
  if (e.loss.type == "cross_entropy") n["loss"]["label_smoothing"] = e.loss.label_smoothing;
  YAML::Node o(YAML::NodeType::Map);
  o["type"] = e.optimizer.type;
  o["lr"] = e.optimizer.lr;
  if (e.optimizer.type == "sgd") {
    o["momentum"] = e.optimizer.momentum;
    o["dampening"] = e.optimizer.dampening;
    o["nesterov"] = e.optimizer.nesterov;
  } else {
    o["betas"].push_back(e.optimizer.beta1);
    o["betas"].push_back(e.optimizer.beta2);
    o["betas"].SetStyle(YAML::EmitterStyle::Flow);
    o["eps"] = e.optimizer.eps;
    o["amsgrad"] = e.optimizer.amsgrad;
  }
  o["weight_decay"] = e.optimizer.weight_decay;
  n["optimizer"] = o;
  const SchedulerConfig& sc = e.scheduler;
  YAML::Node s(YAML::NodeType::Map);
  s["type"] = sc.type;
  s["warmup_steps"] = sc.warmup_steps;
  s["warmup_start_factor"] = sc.warmup_start_factor;
  if (sc.type == "step") s["step_size"] = sc.step_size, s["gamma"] = sc.gamma;
  if (sc.type == "multistep") {
    s["milestones"] = sc.milestones;
    s["milestones"].SetStyle(YAML::EmitterStyle::Flow);
    s["gamma"] = sc.gamma;
  }
  if (sc.type == "exponential") s["gamma"] = sc.gamma;
  if (sc.type == "cosine") s["t_max"] = sc.t_max, s["eta_min"] = sc.eta_min;
  if (sc.type == "linear")
    s["start_factor"] = sc.start_factor, s["end_factor"] = sc.end_factor, s["total_iters"] = sc.total_iters;
  if (sc.type == "onecycle") {
    s["max_lr"] = sc.max_lr;
    s["pct_start"] = sc.pct_start;
    s["div_factor"] = sc.div_factor;
    s["final_div_factor"] = sc.final_div_factor;
  }
  n["scheduler"] = s;
  n["train"]["epochs"] = e.train.epochs;
  n["train"]["log_every"] = e.train.log_every;
  n["train"]["max_steps"] = e.train.max_steps;
  n["train"]["accumulate"] = e.train.accumulate;
  if (e.train.eval_every > 0)
    n["train"]["eval_every"] = e.train.eval_every;
  else
    n["train"]["eval_every"] = "epoch";
  if (e.train.grad_clip > 0) n["train"]["grad_clip"]["max_norm"] = e.train.grad_clip;
  if (e.train.profile_steps > 0) {
    n["train"]["profile"]["start_step"] = e.train.profile_start;
    n["train"]["profile"]["steps"] = e.train.profile_steps;
  }
  n["train"]["nonfinite"] = e.train.nonfinite;
  n["train"]["max_skips"] = e.train.max_skips;
  n["checkpoint"]["every_steps"] = e.checkpoint.every_steps;
  n["checkpoint"]["every_epochs"] = e.checkpoint.every_epochs;
  n["checkpoint"]["keep"] = e.checkpoint.keep;
  n["checkpoint"]["keep_best"] = e.checkpoint.keep_best.empty() ? YAML::Node() : YAML::Node(e.checkpoint.keep_best);
  n["dist"]["bucket_mb"] = e.dist.bucket_mb;
  n["dist"]["timeout_s"] = e.dist.timeout_s;
  n["dist"]["overlap"] = e.dist.overlap;
  n["dist"]["sync_batchnorm"] = e.dist.sync_batchnorm;
  n["logging"]["tensorboard"] = e.logging.tensorboard;
  n["logging"]["jsonl"] = e.logging.jsonl;
  n["logging"]["report"] = e.logging.report;
  n["logging"]["level"] = e.logging.level;
  n["logging"]["gpu_metrics"] = e.logging.gpu_metrics;
  n["logging"]["interval_s"] = e.logging.interval_s;
  n["logging"]["progress"] = e.logging.progress;
  return n;
}

}  // namespace gt
