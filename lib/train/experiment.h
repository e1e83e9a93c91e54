// The experiment file as typed settings: everything is validated here, before any work starts.
#pragma once

#include "config/config.h"
#include "data/dataset.h"

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace gt {

struct DataConfig {
  std::string format = "idx";  ///< idx | synthetic
  std::string train_images, train_labels, test_images, test_labels;  ///< idx
  double scale = 1.0;
  SyntheticSpec synthetic;
  int64_t batch_size = 64;
  bool shuffle = true;
};

struct LossConfig {
  std::string type = "cross_entropy";  ///< cross_entropy | mse
  double label_smoothing = 0.0;
};

struct OptimizerConfig {
  std::string type = "sgd";
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

struct TrainConfig {
  int64_t epochs = 1;
  int64_t log_every = 100;  ///< steps between log lines
  int64_t max_steps = 0;    ///< 0: no limit
};

struct Experiment {
  std::string name = "experiment";
  uint64_t seed = 0;
  std::string device = "auto";  ///< as written: auto | cpu | cuda | cuda:N | [0, 1]
  DataConfig data;
  LossConfig loss;
  OptimizerConfig optimizer;
  TrainConfig train;
  ConfigNode root;  ///< the whole config after overrides: the model is built from root["model"]
};

/// Loads a config file and applies `--set` overrides in order.
ConfigNode load_config(const std::string& file, const std::vector<std::string>& overrides);
/// Validates and reads every section except the layers (built by Model::build); throws ConfigError.
Experiment parse_experiment(const ConfigNode& root);
/// The experiment after defaults, with the model's resolved layers, as YAML (config.resolved.yaml).
YAML::Node resolved_config(const Experiment& exp, const YAML::Node& resolved_layers);

}  // namespace gt
