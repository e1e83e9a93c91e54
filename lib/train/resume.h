// Continuing from checkpoints: which one a run resumes from, and loading saved weights into a model.
#pragma once

#include "train/checkpoint.h"
#include "train/experiment.h"

#include <optional>
#include <string>

namespace gt {

class Model;
class Optimizer;

/// Which checkpoint a run continues from, and in which run directory (`--resume auto | PATH`).
struct ResumePlan {
  std::string run_dir;  ///< "" → a new run directory
  std::optional<CheckpointInfo> from;
};

/// The plan for `--out out_dir` (may be "") and `--resume resume`: "" starts afresh (refused when out_dir already holds
/// checkpoints); auto continues from the newest good checkpoint of out_dir, else of the newest runs/<name>/* with
/// checkpoints, else starts afresh; a checkpoint folder or a run directory continues from it (refused when it does
/// not verify). Throws ConfigError or DataError saying which.
ResumePlan plan_resume(const Experiment& exp, const std::string& out_dir, const std::string& resume);

/// The newest checkpoint of `run_dir` that verifies, with a warning when newer ones do not; nullopt when the run has
/// none. Throws DataError when it has checkpoints and none verifies.
std::optional<CheckpointInfo> newest_good_of_run(const std::string& run_dir, const CheckpointConfig& cfg);
/// The same for a run that must have one (a resume, a rollback, weights to evaluate): none is a DataError too.
CheckpointInfo require_newest_good_of_run(const std::string& run_dir, const CheckpointConfig& cfg);

/// Loads the checkpoint into the model and optimizer and returns its progress, its position kept in samples when
/// the checkpoint was written by another number of ranks than `world`. A checkpoint of another optimizer than
/// `optimizer_type` is refused (DataError) before anything is loaded.
TrainProgress resume_progress(const CheckpointInfo& from, Model& model, Optimizer& optimizer,
                              OptimizerType optimizer_type, int world);

/// The log lines of a resume from `from` to progress `p`: what differs from the checkpoint (the config, against
/// `resolved_config`; the number of ranks, against `world`), and where the run goes on.
void log_resume(const CheckpointInfo& from, const TrainProgress& p, const std::string& resolved_config, int world,
                int64_t batch);

/// Names the top-level sections in which two resolved configs differ ("(unreadable)" when one is not YAML).
std::string config_differences(const std::string& a, const std::string& b);

/// Copies the tensors of a safetensors file into the model's parameters and buffers. A file that does not match
/// (a missing or unexpected name, a different shape or dtype) is refused with every difference listed.
void load_weights(Model& model, const std::string& path);
/// load_weights for `eval` and `generate`: a tensor holding NaN or Inf is refused too (DataError naming the file,
/// the tensor and its first such element), since nothing computed from it means anything: the loss would be NaN
/// beside an accuracy that argmax over NaN logits makes up.
void load_finite_weights(Model& model, const std::string& path);

/// The weights file `path` names (`gputrain eval --checkpoint`): a safetensors file as it is, a checkpoint folder's
/// model.safetensors, or a run directory's final weights, else its newest good checkpoint's. A checkpoint's weights
/// (its folder, or the model.safetensors in it) are verified first (DataError when they do not). Throws ConfigError
/// for a folder that holds neither, naming the path as `what` ("--checkpoint", "train.init_from").
std::string weights_file(const std::string& path, const CheckpointConfig& cfg,
                         const std::string& what = "--checkpoint");

}  // namespace gt
