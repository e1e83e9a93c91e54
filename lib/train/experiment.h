// The experiment file as typed settings: everything is validated here, before any work starts. Each section's
// settings, parser and YAML writer live with the code that owns the section; the experiment composes them.
#pragma once

#include "config/config.h"
#include "data/settings.h"
#include "graph/model_spec.h"
#include "log/settings.h"
#include "optim/settings.h"
#include "parallel/settings.h"
#include "train/loss.h"
#include "train/settings.h"

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace gt {

struct Experiment {
  std::string name = "experiment";
  uint64_t seed = 0;
  std::string device = "auto";       ///< as written: auto | cpu | cuda | cuda:N | [0, 1]
  std::vector<std::string> devices;  ///< a list, normalised to cuda:N | cpu (one worker each); empty: one device
  DataConfig data;
  LossConfig loss;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  TrainConfig train;
  CheckpointConfig checkpoint;
  DistConfig dist;
  LoggingConfig logging;
  ModelSpec model;  ///< the layers, for Model::build
  /// Where the keys that checks after parsing fail on were written (the data against the model, a checkpoint
  /// against the run, the device found): their nodes, for the key path and position of the message. A key that
  /// is not written names its section's position.
  struct Positions {
    ConfigNode data, batch_size, augment, tta;
    ConfigNode accumulate, recompute, cuda_graphs;
    ConfigNode init_from;  ///< the weights a new run starts from: what does not fit them fails here
    ConfigNode freeze;     ///< train.freeze: a pattern that matches no parameter fails here
    ConfigNode loss;  ///< the loss: section; where there is none, model.layers (a loss that does not fit the model)
  } at;
};

/// The top level's keys: name, seed, device and each section's table (experiment_section's JSON Schema is the
/// config language's; see train/config_schema.h).
const SectionSpec& experiment_section();
/// Loads a config file and applies `--set` overrides in order.
ConfigNode load_config(const std::string& file, const std::vector<std::string>& overrides);
/// Validates and reads every section, the model's layers too (their arguments are read by Model::build); throws
/// ConfigError.
Experiment parse_experiment(const ConfigNode& root);
/// The same, without checking that the data files exist: for commands that read no data file (generate; check of
/// a token config, whose shapes come from the config).
Experiment parse_experiment_without_data_files(const ConfigNode& root);
/// The experiment after defaults, with the model's resolved layers, as YAML (config.resolved.yaml).
YAML::Node resolved_config(const Experiment& exp, const YAML::Node& resolved_layers);
/// The same as the text config.resolved.yaml holds (and `gputrain config print` prints).
std::string resolved_config_text(const Experiment& exp, const YAML::Node& resolved_layers);
/// `resolved` as a run directory keeps it (config.resolved.yaml): its data paths and train.init_from made absolute, so
/// that the commands that take the run directory (eval, generate, export, train) find them from any folder.
std::string run_config_text(const std::string& resolved);

}  // namespace gt
