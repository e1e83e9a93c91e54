// The run directory: made (and checked writable) before training starts; train.log while it runs; the final weights
// and summary.json when it ends.
#pragma once

#include "train/checkpoint.h"

#include <optional>
#include <string>

namespace gt {

class Model;

/// Why a run ended (summary.json's exit_reason; `gputrain train` exits 0, 0, 75 and 4).
enum class ExitReason { completed, max_steps, interrupted, diverged };

/// "completed", "max_steps", "interrupted" or "diverged": the word summary.json and the README use.
const char* exit_reason_name(ExitReason reason);

/// What summary.json holds (and `gputrain train` returns).
struct RunSummary {
  std::string run_dir, device;
  ExitReason exit_reason = ExitReason::completed;
  int64_t epochs = 0, steps = 0;
  double samples_per_sec = 0, final_train_loss = 0, wall_seconds = 0;
  std::optional<double> test_loss, test_accuracy;
};

/// Creates the run directory: `requested`, or runs/<name>/<YYYYmmdd-HHMMSS>[-i] when it is "". Throws gt::Error when
/// it cannot be created or written (checked now, not after an hour of training). Returns its path.
std::string make_run_dir(const std::string& name, const std::string& requested);

/// Copies the run's final numbers from its progress into `sum`.
void summarize(RunSummary& sum, const TrainProgress& p, double wall_seconds);

/// Writes <dir>/summary.json (durably): what a sweep reads.
void write_summary(const std::string& dir, const std::string& name, const RunSummary& sum, int world, int threads);

/// Writes <dir>/model.safetensors: the model's parameters and buffers in a format PyTorch's safetensors (and numpy)
/// read, with the run's name and step count in its metadata.
void write_final_weights(const std::string& dir, Model& model, const std::string& name, int64_t steps);

/// train.log: the run's log lines go there too while this exists (rank 0; an empty path attaches nothing).
class RunLogFile {
 public:
  explicit RunLogFile(const std::string& path);
  ~RunLogFile();
  RunLogFile(const RunLogFile&) = delete;
  RunLogFile& operator=(const RunLogFile&) = delete;

 private:
  bool m_attached = false;
};

}  // namespace gt
