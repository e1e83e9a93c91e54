// A training run's set-up: its device, data, model, communicator, resume plan and optimizer, and how its data is cut
// into steps; everything that can be wrong with the config is found here, before the run directory exists.
#pragma once

#include "core/noncopyable.h"
#include "data/dataset.h"
#include "graph/model.h"
#include "optim/optimizer.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"
#include "parallel/settings.h"
#include "train/init_from.h"
#include "train/resume.h"
#include "train/run_dir.h"
#include "train/trainer.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gt {

/// The data the experiment names: the train split, and the test split when there is one (else empty).
struct LoadedData {
  Dataset train, test;
};
/// Loads them; a test split whose samples do not match the training samples' shapes is a DataError.
LoadedData load_data(const Experiment& exp);
/// The per-sample input the model is built for: synthetic data and token windows say it without reading a file;
/// other formats load the data.
Shape model_input_shape(const Experiment& exp);

/// How one worker is placed: its device, and what the workers of one process share.
struct WorkerPlacement {
  std::string device;                ///< as resolve_device takes it
  const LoadedData* data = nullptr;  ///< loaded once for all workers of a process; nullptr: load it here
  std::vector<int> process_gpus;     ///< every GPU this process drives (the sampler's targets)
  bool threaded = false;             ///< one of several worker threads (the harness owns the signal handlers)
};

/// One worker's run, from its set-up to its summary (trainer.cpp): a rank under a launcher, or one of the worker
/// threads of a `device:` list (placement.cpp's run_training places them).
RunSummary train_worker(const Experiment& exp, const RunOptions& opts, const WorkerPlacement& where);

/// train.freeze on `model` (Model::set_frozen), before apply_recompute: a pattern that matches no parameter, or
/// patterns that leave none to learn, are a ConfigError at train.freeze.
void apply_freeze(const Experiment& exp, Model& model);
/// Sets train.recompute on `model` (Model::set_recompute); a mode the model cannot honour is a ConfigError at
/// train.recompute that says why. Then apply_half_activations: both decide what allocate allocates.
void apply_recompute(const Experiment& exp, Model& model);
/// Under train.precision bf16/fp16 (f32 models): the layers' outputs and gradients held in that format between
/// layers (Model::set_activation_dtype) where half_activations_between_layers says so, else the outputs kept for
/// backward in it (Model::set_activation_storage).
void apply_half_activations(const Experiment& exp, Model& model);
/// GPUTRAIN_HALF_ACTIVATIONS: `on` holds a bf16/fp16 run's activations in 16 bits between layers wherever every layer
/// takes them (on the CPU too, through f32 ops: the GPU's layout, checked where no GPU is), `off` keeps them f32 with
/// 16-bit copies for backward; unset or `auto`: on for a model on a GPU, off on the CPU (whose bf16 semantics stay
/// those of f32 activations). Any other value is an Error.
bool half_activations_between_layers(const Model& model);
/// train.cuda_graphs: refuses (ConfigError naming the key) a layer that draws from the host's step number (dropout),
/// which a captured graph would freeze. RunSetup and `gputrain check` call it; nothing when the key is off.
void check_graph_layers(const Experiment& exp, const Model& model);

/// Copies rank 0's `text` to every rank (a collective); `what` names it in a time-out.
void broadcast_string(Communicator& comm, std::string& text, const char* what);

/// What ranks must agree on: the resolved config without `device`, then one line per parameter and buffer (name,
/// dtype, shape).
std::string rank_agreement_text(const std::string& resolved_config, Model& model);
/// Compares `text` (rank_agreement_text) across the ranks, a collective: by hash, then, when some rank differs, line
/// by line against rank 0's. Throws a distributed Error (exit 3) on every rank when any differs; a differing rank
/// names the first differing line.
void check_ranks_agree(Communicator& comm, const std::string& text);

/// How dist.zero shards `model`'s parameters: the gradient buckets of dist.bucket_mb, or under dist.zero 3 with
/// dist.shard_unit block, its units (plan_units). The optimizer and the gradient sync cut by the same plan.
BucketPlan zero_plan(Model& model, const DistConfig& dist);

/// Throws ConfigError (at data.batch_size or train.accumulate) when `from` was written with other batches than the
/// experiment's: a resume must continue the same sequence of samples and steps.
void check_same_batches(const Experiment& exp, const CheckpointInfo& from);

/// One worker's run as far as it goes before it writes anything: the device, the data, the model (checked against
/// the loss, its buffers allocated for the batch), the ranks, the checkpoint it resumes from (rank 0 chooses; the
/// others load the same one), the optimizer and the progress to continue from. Throws gt::Error for anything wrong.
class RunSetup : NonCopyable {
 public:
  RunSetup(const Experiment& exp, const RunOptions& opts, const WorkerPlacement& where);

  const Dataset& train() const { return m_data->train; }
  const Dataset& test() const { return m_data->test; }

  int threads = 0;  ///< CPU threads of this worker
  Device device;
  std::string device_reason;  ///< why this device, for the log
  int64_t batch = 0;          ///< samples per micro-batch on each rank (data.batch_size)
  Model model;
  std::string resolved_config;   ///< config.resolved.yaml's text
  Communicator* comm = nullptr;  ///< the ranks (a local one when the run has one process)
  int world = 1;
  bool lead = true;  ///< rank 0: it alone writes the run directory
  ResumePlan plan;
  RunDirLock run_lock;  ///< rank 0: the run directory, once it exists, is this run's alone
  /// CUDA ranks (world > 1): NCCL over `comm`, which carries the gradients, the initial state, the step's device
  /// sums and dist.zero's collectives. Declared before the optimizer, which may hold it: destroyed after it.
  std::unique_ptr<Communicator> nccl;
  std::unique_ptr<Optimizer> optimizer;
  TrainProgress progress;  ///< where the run starts: the checkpoint's, else step 0
  InitWeights init;        ///< train.init_from's weights, loaded into a new run (a resume reads its checkpoint's)
  std::vector<std::string> param_group_lines;  ///< optimizer.param_groups: what each group holds, for the log

 private:
  std::optional<LoadedData> m_own_data;
  const LoadedData* m_data = nullptr;
  std::unique_ptr<Communicator> m_local_comm;
};

/// How a run is cut into optimizer steps, fixed once its loader is sharded.
struct StepPlan {
  int64_t batch = 0;            ///< samples per micro-batch on each rank
  int64_t accumulate = 1;       ///< micro-batches per optimizer step (train.accumulate)
  int64_t epochs = 0;           ///< train.epochs
  int64_t micro_per_epoch = 0;  ///< micro-batches each rank takes per epoch
  int64_t per_epoch = 0;        ///< optimizer steps per epoch
  int64_t total_steps = 0;      ///< of the run: the epochs' steps, cut by train.max_steps
};
/// The plan for `loader` (sharded over `world` ranks). Throws DataError when an epoch has no full global batch.
StepPlan plan_steps(const Experiment& exp, const Loader& loader, const Dataset& train, int world);

/// The run's opening log lines: where it writes, the device, the data and its batches, the model.
void log_run_start(const Experiment& exp, const RunSetup& setup, const StepPlan& plan, const std::string& run_dir,
                   int local_rank);
/// What train.precision means on `device`, logged once at the start: an info line for tf32 and for bf16/fp16 on CUDA,
/// and for bf16/fp16 on the CPU one warning that the products run by conversion, naming the instruction set the CPU
/// lacks.
void log_precision(Precision precision, Device device);
/// Under bf16/fp16: whether the model holds its activations in 16 bits between layers (an info line), and a warning
/// when GPUTRAIN_HALF_ACTIVATIONS=on asked for it and a layer does not take them.
void log_half_activations(const Model& model);

}  // namespace gt
