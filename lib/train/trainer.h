// The training run: data, model, loop, evaluation, and the run directory it leaves behind.
#pragma once

#include "train/experiment.h"

#include <optional>
#include <string>

namespace gt {

class Communicator;

struct RunOptions {
  std::string out_dir;  ///< "" → runs/<name>/<YYYYmmdd-HHMMSS>/
  int threads = 0;      ///< CPU threads; 0 → all cores
  std::string resume;   ///< "" | auto (the newest good checkpoint, else a fresh start) | a checkpoint or run folder
  Communicator* comm = nullptr;  ///< data-parallel ranks; nullptr: one process
  int local_rank = 0;
  bool progress = true;  ///< a live progress bar when stdout is a terminal (false: --no-progress)
};

struct RunSummary {
  std::string run_dir, device;
  std::string exit_reason;  ///< completed | max_steps | interrupted (exit 75) | diverged (exit 4)
  int64_t epochs = 0, steps = 0;
  double samples_per_sec = 0, final_train_loss = 0, wall_seconds = 0;
  std::optional<double> test_loss, test_accuracy;
};

/// Picks the device the config asks for; `reason` says why, for the log. Throws gt::Error (exit 1) when
/// the device asked for cannot be used.
Device resolve_device(const std::string& requested, std::string& reason);

/// Loads the data the experiment names (train split, and the test split when there is one).
struct LoadedData {
  Dataset train, test;
};
LoadedData load_data(const Experiment& exp);

/// Trains the experiment and writes the run directory; returns what summary.json holds.
RunSummary run_training(const Experiment& exp, const RunOptions& opts);

class Model;
/// Copies the tensors of a safetensors file into the model's parameters and buffers. A file that does not match
/// (a missing or unexpected name, a different shape or dtype) is refused with every difference listed.
void load_weights(Model& model, const std::string& path);

struct EvalSummary {
  int64_t samples = 0;
  double loss = 0;
  std::optional<double> accuracy;
};
/// Test-set metrics of the experiment's model with the weights of `weights_path` (`gputrain eval`).
EvalSummary evaluate_weights(const Experiment& exp, const std::string& weights_path, int threads);

}  // namespace gt
