// The training run: set up, stepped, evaluated and checkpointed on one device, or by one worker per device or rank.
#pragma once

#include "train/experiment.h"
#include "train/run_dir.h"

#include <string>
#include <vector>

namespace gt {

class Communicator;

struct RunOptions {
  std::string out_dir;  ///< "" → runs/<name>/<YYYYmmdd-HHMMSS>/
  int threads = 0;      ///< CPU threads; 0 → all cores
  std::string resume;   ///< "" | auto (the newest good checkpoint, else a fresh start) | a checkpoint or run folder
  Communicator* comm = nullptr;  ///< data-parallel ranks; nullptr: one process
  int local_rank = 0;
  bool progress = true;   ///< a live progress bar when stdout is a terminal (false: --no-progress)
  bool launched = false;  ///< started by mpirun, srun or torchrun (logging.progress: auto draws no bar then)
  /// The overrides the run was started with (`--set` and the flags that stand for one), as given: written to the
  /// run directory's overrides.json, so `gputrain runs` and `gputrain sweep` can show them.
  std::vector<std::string> overrides;
};

/// Trains the experiment and writes the run directory; returns what summary.json holds. A device list in one
/// process runs one worker thread per device; under a launcher, each rank takes the device at its local rank.
RunSummary run_training(const Experiment& exp, const RunOptions& opts);

}  // namespace gt
