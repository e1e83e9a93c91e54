// The run directory: made (and checked writable) before training starts; train.log while it runs; the final weights
// and summary.json when it ends.
#pragma once

#include "core/noncopyable.h"
#include "data/dataset.h"
#include "train/checkpoint.h"
#include "train/memory_peaks.h"

#include <optional>
#include <string>
#include <vector>

namespace gt {

class Model;

/// Why a run ended (summary.json's exit_reason; `gputrain train` exits 0, 0, 75 and 4).
enum class ExitReason { completed, max_steps, interrupted, diverged };

/// "completed", "max_steps", "interrupted" or "diverged": the word summary.json and docs/runs.md use.
const char* exit_reason_name(ExitReason reason);

/// What summary.json holds (and `gputrain train` returns).
struct RunSummary {
  std::string run_dir, device;
  ExitReason exit_reason = ExitReason::completed;
  int64_t epochs = 0, steps = 0;
  double samples_per_sec = 0, wall_seconds = 0;
  std::optional<double> final_train_loss;  ///< the last finished epoch's mean loss; none before one ends
  std::optional<double> test_loss, test_accuracy;
  std::optional<double> test_bpb;     ///< byte tokens: test_loss in bits per byte
  std::optional<int64_t> bad_files;   ///< image folders: files skipped as corrupt or unreadable
  std::optional<double> loss_scale;   ///< a loss-scaled run's scale at the end
  int64_t overflow_skips = 0;         ///< and the steps its overflows skipped
  std::string init_from, init_fnv1a;  ///< train.init_from: the weights file a new run started from, its bytes' hash
  std::optional<MemoryPeaks> memory;  ///< every process's memory peaks at the end (gather_memory_peaks)
};

/// A run continued into a new folder (--resume RUN --out NEW) starts its metrics.jsonl with the rows `from` had, so
/// that its record (charts, runs) covers the whole run; the earlier folder is left as it was. Nothing when `run_dir`
/// is the checkpoint's own run or already has metrics.
void carry_metrics(const CheckpointInfo& from, const std::string& run_dir);

/// Claims the run directory (core/ownership.h): `requested`, or runs/<name>/<YYYYmmdd-HHMMSS>[-i] when it is "". A
/// folder that holds a run is taken only when `resume`; another command's output, or a folder of files gputrain did
/// not write, never (ConfigError). Throws gt::Error when it cannot be created or written (checked now, not after an
/// hour of training). Returns its path.
std::string make_run_dir(const std::string& name, const std::string& requested, bool resume);

/// The run's copy of its data's tokenizer (written atomically), so that eval and generate find it when the shards
/// have moved: tokenizer.model for a SentencePiece model, gputrain_tokenizer.json for bytes. Nothing without one.
void copy_tokenizer(const Dataset& data, const std::string& dir);
/// A new run's overrides.json (overrides_json) and its copy of the tokenizer (copy_tokenizer).
void write_overrides_and_tokenizer(const std::string& dir, const std::vector<std::string>& overrides,
                                   const Dataset& data);

/// The tokenizer file of the run that `weights` (a run directory, its model.safetensors, or one of its checkpoints)
/// belongs to, or "" when it has none.
std::string run_tokenizer_file(const std::string& weights);

/// An exclusive lock on a run directory for as long as this exists: a flock on <dir>/.lock, which records the
/// holder's pid, so that two runs never write one directory at once (their metrics rows and checkpoints would mix).
/// The lock goes with the process, also when it is killed.
class RunDirLock : NonCopyable {
 public:
  RunDirLock() = default;
  ~RunDirLock();

  /// Locks `dir`, an existing folder (a no-op when this holds it already). Throws gt::Error naming the holder's pid
  /// when another process holds it.
  void acquire(const std::string& dir);
  bool held() const { return m_fd >= 0; }

 private:
  int m_fd = -1;
  std::string m_dir;
};

/// summary.json's exit_reason in `dir`, or "" when there is no readable one (running, killed, never started).
std::string run_exit_reason(const std::string& dir);
/// Whether the run in `dir` has ended for good: summary.json says completed (every epoch) or diverged. An
/// interrupted run (exit 75) is there to be resumed, and one that stopped at train.max_steps may go on in place
/// under a further limit (llm.c's way of extending a run); with nothing left to train, a resume writes nothing.
bool run_is_complete(const std::string& dir);
/// Whether a live process holds the run directory's lock (a run is using it now).
bool run_is_alive(const std::string& dir);
/// The command that continues the run in `dir` where it stopped (printed when a run is interrupted).
std::string resume_command(const std::string& dir);
/// What a refusal to start a new run in `dir` (a run's folder) suggests: --resume for an unfinished run, a new
/// folder for a complete one.
std::string run_folder_hint(const std::string& dir);

/// overrides.json's text, `{"overrides": ["optimizer.lr=0.1", "train.max_steps=300"]}`: the overrides a run was
/// started with (`--set` values and the flags that stand for one), in the order given.
std::string overrides_json(const std::vector<std::string>& overrides);

/// Copies the run's final numbers from its progress into `sum`.
void summarize(RunSummary& sum, const TrainProgress& p, double wall_seconds);

/// Writes <dir>/summary.json (durably): what a sweep reads.
void write_summary(const std::string& dir, const std::string& name, const RunSummary& sum, int world, int threads);

/// Writes <dir>/model.safetensors: the model's parameters and buffers in a format PyTorch's safetensors (and numpy)
/// read, with the run's name and step count in its metadata.
void write_final_weights(const std::string& dir, Model& model, const std::string& name, int64_t steps);

/// train.log: the run's log lines go there too while this exists (rank 0; an empty path attaches nothing).
class RunLogFile : NonCopyable {
 public:
  explicit RunLogFile(const std::string& path);
  ~RunLogFile();

 private:
  bool m_attached = false;
};

}  // namespace gt
