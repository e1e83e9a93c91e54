// Checkpoints: checkpoints/step-<N>/{model,optimizer}.safetensors + state.json, written atomically, verified on load.
#pragma once

#include "core/tensor.h"
#include "optim/settings.h"
#include "train/settings.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gt {

class Model;
class Optimizer;
struct StateRange;

/// Where a run stands after a completed optimizer step: every number besides the tensors that the training loop
/// needs to continue exactly as if it had never stopped. The random streams need no state of their own: data order
/// is keyed by (seed, epoch), augmentation by (seed, epoch, position) and dropout by (seed, layer, micro-batch), so
/// the counters here are the whole RNG state.
struct TrainProgress {
  int64_t step = 0;        ///< optimizer steps completed
  int64_t epoch = 0;       ///< the epoch in progress (0-based)
  int64_t micro_done = 0;  ///< micro-batches of `epoch` consumed
  int64_t epochs_done = 0;
  int64_t train_samples = 0, epoch_samples = 0, window_samples = 0;
  double epoch_loss = 0;                    ///< loss summed over the epoch's closed log windows
  double window_loss = 0, window_hits = 0;  ///< the open log window's sums (the loss statistics)
  /// The open window's loss sum from epochs that already ended (in their epoch_loss already): a log window spans
  /// epoch boundaries, so its rate counts every sample of its time.
  double window_loss_carried = 0;
  double final_train_loss = 0, grad_norm = 0, train_seconds = 0;
  double lr_scale = 1;  ///< learning-rate multiplier (halved by each non-finite rollback)
  int64_t last_eval_step = -1, skips_in_row = 0, optimizer_steps = 0;
  /// The loss scaler (train.loss_scale; all 0 without one): the scale for the next step, the finite steps since it
  /// last changed, and the steps skipped for an overflow so far.
  double loss_scale = 0;
  int64_t scale_growth_tracker = 0, overflow_skips = 0;
  std::optional<double> test_loss, test_accuracy;
  std::optional<double> best_value;  ///< keep_best: the best metric seen at a checkpoint, and where
  int64_t best_step = -1;
  uint64_t metrics_bytes = 0;  ///< length of metrics.jsonl when the checkpoint was taken
};

/// A checkpoint read back from disk and verified (state.json parsed, every file's size and checksum checked).
/// FNV-1a of the names of the parameters that learn, in order, 8 hex digits: a checkpoint's optimizer state is
/// theirs, so a resume must train the same ones.
std::string trained_params_hash(Model& model);

struct CheckpointInfo {
  std::string dir;
  TrainProgress progress;
  std::string gputrain_version, config_hash, config, optimizer_type;
  /// The parameters the optimizer state belongs to (those that learn: train.freeze and LoRA decide): their count and
  /// trained_params_hash's of their names. Absent (−1, "") in checkpoints written before 2026-12-05.
  int64_t trained_params = -1;
  std::string trained_params_fnv1a;
  int64_t world_size = 1;
  int64_t batch_size = 1, accumulate = 1;  ///< the batch shape `progress.micro_done` counts in (per rank)
  /// What state.json records of model.safetensors and optimizer.safetensors: name, size, CRC-32 (8 hex digits).
  struct File {
    std::string name;
    uint64_t bytes = 0;
    std::string crc32;
  };
  std::vector<File> files;
  /// dist.zero ≥ 1: the optimizer state is in per-rank shard files instead of optimizer.safetensors.
  struct Shards {
    int64_t world_size = 1, stage = 1;
    std::vector<std::string> buffers;  ///< one parameter's state buffers, in file order: "exp_avg", …
    /// A gradient bucket of the writer: its parameters (indices, in order) and their element counts, and the chunk
    /// of it each rank wrote (the bucket's elements [r · chunk, (r + 1) · chunk) go to shard r).
    struct Bucket {
      std::vector<int64_t> params, sizes;
      int64_t chunk = 0;
    };
    std::vector<Bucket> buckets;
    std::vector<File> files;  ///< shard r is files[r] (also in `files`, so read_checkpoint verifies them)
  };
  std::optional<Shards> shards;
};

/// Shard file r holds, for each of the writer's buckets and then each buffer, the bucket's elements
/// [r · chunk, (r + 1) · chunk) that exist (the padding is not written), as raw little-endian f32.
/// The name of shard file `rank` of `world`.
std::string shard_file_name(int rank, int world);

/// Writes `pieces` (f32 tensors; device ones through a host copy) one after the other, raw, as the file `path`
/// (atomically) and returns its size and CRC-32 under `name`.
CheckpointInfo::File write_shard_file(const std::string& path, const std::string& name,
                                      const std::vector<const Tensor*>& pieces);

/// The hash recorded for a resolved config (its text's CRC-32, as 8 hex digits).
std::string config_hash(const std::string& resolved_config);

/// Parses state.json text (`source` names it in errors); throws DataError for anything malformed.
CheckpointInfo parse_state_json(const std::string& text, const std::string& source);

/// state.json's text for a JSON object: the object with a last field "state_crc32", the CRC-32 of `object` itself.
std::string seal_state_json(const std::string& object);
/// Throws DataError (naming `source`) unless `text` ends with a state_crc32 field that matches the text before it.
void check_state_checksum(const std::string& text, const std::string& source);

/// Reads and verifies `dir` (a checkpoints/step-<N> folder); throws DataError naming the file that is wrong.
CheckpointInfo read_checkpoint(const std::string& dir);

/// Copies the checkpoint's tensors into the model and the optimizer. Names, shapes and dtypes must match; a
/// mismatch is refused with every difference listed.
void load_checkpoint(const CheckpointInfo& ckpt, Model& model, Optimizer& optimizer);

/// Fills `ranges` from a sharded checkpoint's shard files, reading only the byte ranges each one needs (a range may
/// span several of the writer's shards). Throws DataError naming the file for a missing or short shard, and listing
/// the differences when the writer's parameters do not match.
void load_state_ranges(const CheckpointInfo& ckpt, const std::vector<StateRange>& ranges,
                       const std::vector<int64_t>& param_sizes);

/// Copies the tensors of a safetensors file into `wanted` by name; any difference (missing, unexpected, other shape
/// or dtype) is a DataError listing them all. With `finite_only`, a float tensor holding NaN or Inf is a DataError
/// too, naming the tensor and its first such element, before anything is copied.
void load_named_tensors(const std::vector<std::pair<std::string, Tensor*>>& wanted, const std::string& path,
                        bool finite_only = false);

/// The checkpoints of one run directory.
class CheckpointStore {
 public:
  /// `batch_size` and `accumulate` (per rank) are what the checkpoints it writes record of the batches their position
  /// counts; a store that only reads may leave them at 1.
  CheckpointStore(std::string run_dir, CheckpointConfig cfg, int world_size = 1, int64_t batch_size = 1,
                  int64_t accumulate = 1);

  const std::string& root() const { return m_root; }
  /// Writes checkpoints/step-<step>/ (into a temporary folder, every file fsync'ed, then renamed into place),
  /// points `latest` (and `best`) at it, and only then prunes old ones. Returns the folder. Throws gt::Error naming
  /// the file when a write fails; the previous checkpoints are untouched then.
  std::string save(Model& model, Optimizer& optimizer, OptimizerType optimizer_type, const TrainProgress& progress,
                   const std::string& resolved_config);
  /// A sharded save (dist.zero ≥ 1), in three parts: the lead calls begin(step), which makes a clean temporary
  /// folder; every rank then writes its shard into folder(step) (write_shard); the lead, once all are written, calls
  /// save with the manifest, which writes the model and state.json beside them and renames the folder into place.
  std::string begin(int64_t step);
  std::string folder(int64_t step) const;
  std::string save(Model& model, Optimizer& optimizer, OptimizerType optimizer_type, const TrainProgress& progress,
                   const std::string& resolved_config, const CheckpointInfo::Shards* shards);
  /// Drops the temporary folder of a sharded save that failed.
  void abandon(int64_t step);
  /// Complete checkpoint folders, newest step first (`latest` first when it names one).
  std::vector<std::string> list() const;
  /// Removes the checkpoints of steps after `step` and points `latest` at step-<step> (a non-finite rollback).
  void remove_after(int64_t step);
  /// The newest checkpoint that verifies; broken ones are skipped with a warning naming the file. nullopt if none.
  std::optional<CheckpointInfo> newest_good() const;

 private:
  std::string m_root;  ///< <run>/checkpoints
  CheckpointConfig m_cfg;
  int m_world = 1;
  int64_t m_batch = 1, m_accumulate = 1;
};

}  // namespace gt
