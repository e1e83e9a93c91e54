// The experiment file as typed settings: everything is validated here, before any work starts.
#pragma once

#include "config/config.h"
#include "data/dataset.h"

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace gt {

struct DataConfig {
  std::string format = "idx";  ///< idx | csv | npy | synthetic
  std::string train_images, train_labels, test_images, test_labels;  ///< idx; npy inputs and targets
  std::string train_csv, test_csv;                                   ///< csv
  CsvSpec csv;
  double scale = 1.0;
  SyntheticSpec synthetic;
  int64_t batch_size = 64;
  bool shuffle = true;
  AugmentConfig augment;  ///< training set only
};

struct LossConfig {
  std::string type = "cross_entropy";  ///< cross_entropy | mse
  double label_smoothing = 0.0;
};

struct OptimizerConfig {
  std::string type = "sgd";  ///< sgd | adam | adamw
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< adam, adamw
  bool amsgrad = false;
};

/// The learning-rate schedule, stepped once per optimizer step (t = 0 for the first step).
struct SchedulerConfig {
  std::string type = "constant";  ///< constant | step | multistep | exponential | cosine | linear | onecycle
  int64_t warmup_steps = 0;
  double warmup_start_factor = 0.0;
  int64_t step_size = 1;            ///< step
  std::vector<int64_t> milestones;  ///< multistep
  double gamma = 0.1;               ///< step, multistep, exponential
  int64_t t_max = 0;                ///< cosine: steps of one half period; 0 = the whole run
  double eta_min = 0.0;             ///< cosine
  double start_factor = 1.0, end_factor = 0.0;  ///< linear
  int64_t total_iters = 0;          ///< linear; 0 = the whole run
  double max_lr = 0.0, pct_start = 0.3, div_factor = 25.0, final_div_factor = 1e4;  ///< onecycle (max_lr 0 = lr)
};

struct TrainConfig {
  int64_t epochs = 1;
  int64_t log_every = 100;  ///< steps between log lines
  int64_t max_steps = 0;    ///< 0: no limit
  int64_t eval_every = 0;   ///< steps between evaluations; 0 = after every epoch
  int64_t accumulate = 1;   ///< micro-batches per optimizer step
  double grad_clip = 0.0;   ///< max global L2 norm of the gradients; 0 = off
  int64_t profile_start = 0, profile_steps = 0;  ///< profile steps [start, start + steps) (1-based); 0 steps = off
  std::string nonfinite = "abort";  ///< abort | skip | rollback: what a NaN/Inf loss or gradient does
  int64_t max_skips = 5;            ///< skip: steps skipped in a row; rollback: rollbacks to one checkpoint
};

/// When checkpoints are written and how many stay (checkpoints/step-<N>/ in the run directory).
struct CheckpointConfig {
  int64_t every_steps = 0;   ///< 0 = off
  int64_t every_epochs = 1;  ///< 0 = off
  int64_t keep = 3;          ///< newest complete checkpoints kept (the best one is kept besides)
  std::string keep_best;     ///< "" | test_accuracy | test_loss
};

/// Data-parallel settings (used when a launcher starts several ranks).
struct DistConfig {
  double bucket_mb = 25;   ///< gradient bucket size for the overlapped all-reduce
  double timeout_s = 300;  ///< a collective waiting longer than this ends the run with exit 3
  bool overlap = true;     ///< all-reduce gradient buckets on a thread during backward
  bool sync_batchnorm = false;  ///< batch norm statistics over the global batch (one all-reduce per layer and pass)
};

/// Where the numbers of a run go (the `logging:` section).
struct LoggingConfig {
  bool tensorboard = true;      ///< events.out.tfevents.* in the run directory
  bool jsonl = true;            ///< metrics.jsonl
  bool report = true;           ///< report.html at the end of the run
  std::string level = "info";   ///< debug | info | warn | error: the console and train.log
  bool gpu_metrics = true;      ///< sample GPU utilisation and memory (NVML) while training
  double interval_s = 1.0;      ///< seconds between GPU samples
  bool progress = true;         ///< a live progress bar on a terminal instead of the periodic step lines
};

struct Experiment {
  std::string name = "experiment";
  uint64_t seed = 0;
  std::string device = "auto";  ///< as written: auto | cpu | cuda | cuda:N | [0, 1]
  std::vector<std::string> devices;  ///< a list, normalised to cuda:N | cpu (one worker each); empty: one device
  DataConfig data;
  LossConfig loss;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  TrainConfig train;
  CheckpointConfig checkpoint;
  DistConfig dist;
  LoggingConfig logging;
  ConfigNode root;  ///< the whole config after overrides: the model is built from root["model"]
};

/// Loads a config file and applies `--set` overrides in order.
ConfigNode load_config(const std::string& file, const std::vector<std::string>& overrides);
/// Validates and reads every section except the layers (built by Model::build); throws ConfigError.
Experiment parse_experiment(const ConfigNode& root);
/// The experiment after defaults, with the model's resolved layers, as YAML (config.resolved.yaml).
YAML::Node resolved_config(const Experiment& exp, const YAML::Node& resolved_layers);

}  // namespace gt
