// What one training step of an experiment costs before it runs (`gputrain check`): FLOPs and memory per layer, the
// totals, and whether they fit the device the config would train on.
#pragma once

#include "core/device.h"
#include "core/dtype.h"
#include "core/json.h"
#include "core/shape.h"
#include "graph/model.h"
#include "ops/precision.h"
#include "train/experiment.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gt {

class Model;
struct Dataset;

/// One node of the graph at the configured batch size.
struct LayerFootprint {
  std::string name, type;
  Shape output;  ///< batched
  int64_t params = 0;
  int64_t trainable = 0;        ///< of params, those that learn (train.freeze)
  int64_t forward_flops = 0;    ///< the whole batch
  int64_t backward_flops = 0;   ///< 2 × forward with parameters, 1 × without, 0 when backward skips the node
  size_t param_bytes = 0;       ///< parameter values (the gradients, as large, are counted in the totals)
  size_t buffer_bytes = 0;      ///< saved with the model, not trained (batch-norm running statistics)
  size_t activation_bytes = 0;  ///< output, its gradient, a scratch gradient, what the layer keeps for backward
};

/// Everything one process holds on its device to train: each total is the sum of its rows where it has one.
struct Footprint {
  int64_t batch = 0;
  int64_t accumulate = 1;         ///< micro-batches per step: they reuse the same buffers
  int64_t tokens_per_sample = 0;  ///< token data: the block size (FLOPs per token are shown); 0 otherwise
  DType dtype = DType::f32;
  Recompute recompute = Recompute::none;  ///< train.recompute: the activations follow it (Model::buffer_plan)
  Shape input;                            ///< the model input, batched
  std::vector<LayerFootprint> layers;
  int64_t params = 0, forward_flops = 0, backward_flops = 0;
  int64_t trainable = 0;                  ///< parameters that learn: gradients and optimizer state exist for these only
  std::string optimizer;                  ///< "sgd", "adam", …
  int64_t optimizer_state_per_param = 0;  ///< state elements per parameter element (sgd with momentum 1, adam 2)
  size_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, buffer_bytes = 0, activation_bytes = 0;
  size_t batch_bytes = 0;      ///< the step's input, target and output-gradient tensors
  bool loss_in_place = false;  ///< the loss's gradient overwrites the output (Model::loss_writes_over_output)
  /// Elements of each gradient bucket data-parallel training makes (dist.bucket_mb, plan_buckets' cut), in the order
  /// backward completes them: what ZeRO-2 holds whole while the backward pass writes it.
  std::vector<int64_t> grad_buckets;
  /// dist.zero 3's units of parameters (dist.shard_unit: block, unit_sizes' cut — each pass of a top-level `repeat:`
  /// block and each run of layers between them, the bucket cut without blocks; bucket: grad_buckets), elements each,
  /// in the order backward completes them. They are stage 3's gradient buckets too.
  std::vector<int64_t> shard_units;
  /// Each unit's frozen parameter elements (train.freeze): sharded and gathered with the unit, no gradient or state.
  std::vector<int64_t> shard_unit_frozen;
  /// Layers whose learning weight a tied layer also writes (a GPT's embeddings): on a GPU each keeps a slot of
  /// GradSync's bucket ring through the backward pass, beside the two that take turns.
  int64_t tied_owners = 0;
  /// dist.overlap: on CPU ranks dist.zero 3 gathers the next unit while the current one computes (one unit more
  /// whole at a time).
  bool overlap = true;
  /// Stage 3 without accumulation: the units whose gradient buckets the backward pass holds whole at one moment
  /// (indices into shard_units), one set per node: its own unit, and a tied weight's owner's, begun by the tied layer
  /// and whole until the owner's backward.
  std::vector<std::vector<size_t>> shard_unit_grads_whole;
  /// train.precision, and under bf16/fp16 the copies of the weights the products read, made once per step and kept
  /// between steps: on the CPU rounded values in f32 for its f32 GEMM (ops/precision.h's half_weight, 4 bytes per
  /// element), on CUDA 16-bit elements (ops/cuda/half_scratch.h's half_weight, 2 bytes). 0 under fp32 and tf32.
  Precision precision = Precision::fp32;
  /// Model::set_activation_storage: under bf16/fp16 the outputs kept for backward are counted at 2 bytes an element
  /// (plus the f32 working buffers of the forward pass); their gradients and what layers keep stay f32. nullopt: f32.
  std::optional<HalfFormat> activation_storage;
  /// Model::set_activation_dtype: bf16/f16 when the layers' outputs and their gradients are held in 16 bits between
  /// layers (counted at 2 bytes an element, the model's output included); else the model's dtype.
  DType activation_dtype = DType::f32;
  size_t half_weight_bytes = 0;
  /// Of half_weight_bytes: the copies of each unit's weights (shard_units' order, frozen ones too), and those of the
  /// weights in no unit (none in a model built from layers: every parameter is in a unit).
  std::vector<size_t> shard_unit_half_bytes;
  size_t unsharded_half_bytes = 0;
  /// bf16 products on the CPU that round the weights as their kernels pack them, keeping no rounded copies
  /// (ops/cpu/bf16_gemm.h's cpu_bf16_rounds_in_pack).
  bool bf16_in_pack = false;
  bool on_cuda = false;  ///< the model's device is a GPU (its half products keep no weight copies either)
  size_t total_bytes = 0;
};

/// The footprint of training `model` (built with or without its parameters) on batches of exp.data.batch_size
/// drawn from `train`, with the optimizer exp.optimizer names. Computed from shapes alone, so models far too big
/// for the machine are sized without being allocated: activations follow Model::buffer_plan (what allocate
/// allocates), workspace and parameters the layers' own counts, and the optimizer state is read from a real
/// optimizer built over a one-element stand-in parameter (its state is elementwise). The tests compare every
/// number with what building, allocating and running the model allocates.
Footprint training_footprint(const Experiment& exp, const Model& model, const Dataset& train);

/// How much memory a device offers a training run, and whether `needed` bytes fit in it.
struct MemoryFit {
  std::string device;        ///< "cpu", "cuda:0"
  std::optional<bool> fits;  ///< nullopt: this machine cannot tell (the device is not here)
  size_t needed = 0;
  size_t usable = 0;  ///< what a run may use (0 when unknown)
  size_t total = 0;   ///< the device's memory (CUDA) or MemAvailable (CPU)
  std::string basis;  ///< where `usable` comes from, in words; why the answer is unknown
};

/// CUDA keeps back 5 % of the device's memory + 512 MiB for the CUDA context, cuBLAS/cuDNN workspaces and the
/// caching allocator's rounding; the CPU's available memory is given as is.
size_t cuda_memory_margin(size_t device_total);
/// The verdict for `needed` bytes on `device` with `total` bytes (a GPU's memory, or the host's MemAvailable).
MemoryFit judge_fit(size_t needed, Device device, size_t total);
/// judge_fit against this machine: the device resolve_device picks for `requested` (exp.device), with a GPU's
/// total memory or, for the CPU, /proc/meminfo's MemAvailable (read after the data set is loaded, which training
/// holds as well). A device that cannot be used here gives an unknown verdict that says why.
MemoryFit fit_on_this_machine(size_t needed, const std::string& requested);
/// The kind of device a run of `requested` (exp.device, or a device list's first entry) trains on, for sizing it:
/// `cpu` the CPU, `cuda` and `cuda:N` that GPU whether or not this machine has it (a config for a GPU machine checked
/// on a laptop is sized as it will run there), `auto` what resolve_device picks here.
Device planned_device(const std::string& requested);

/// What one rank of a data-parallel run at `world` ranks holds under a ZeRO stage (dist.zero). Stage 0 keeps every
/// tensor on every rank. Stages 1 to 3 split the optimizer state: rank 0 (the fullest) keeps its chunk of every bucket,
/// ⌈bucket / world⌉ elements (zero_chunk; the last rank's part may be shorter), and ZeroOptimizer keeps a buffer pair
/// for all-gathering the weights (the largest chunk, and the largest bucket padded to chunk · world: gather_bytes; none
/// at stage 3, which gathers no weights after the step). Stage 2 also splits the gradients (GradSync with chunks,
/// parallel/grad_sync.h): a rank keeps its averaged chunk of every bucket, and a bucket is whole only while the
/// backward pass writes it, until its reduce-scatter: counted are the chunks plus the two largest buckets (padded; at
/// most two are whole at once), or plus every bucket with train.accumulate > 1 (the micro-batches before the last keep
/// what they write); on a GPU without accumulation, GradSync's ring: two slots and one per tied layer's owner, each up
/// to the largest bucket. Stage 3 cuts by its units (Footprint::shard_units), which are its gradient buckets too, and
/// also splits the weights, frozen ones too: a rank keeps its chunk of every unit, and while a pass runs at most
/// ZeroOptimizer::kResidentUnits units whole (buffers of chunk · world), and on CPU ranks with dist.overlap the next
/// one being gathered (units_in_pass), counted as the largest ones (exact when the largest follow each other in a
/// pass, as a repeat: block's passes do). Its gradient buckets: the chunks plus the largest of the sets
/// Footprint::shard_unit_grads_whole names, every unit with train.accumulate > 1, the ring's slots on a GPU. Under
/// bf16/fp16 its rounded weight copies are at most those of the kResidentUnits units with the largest copies plus
/// those of the weights in no unit: a gather starts a
/// new product scope (renew_product_scope), and a copy lives through the scope that reads it and the next
/// (ScopeCopies::sweep), while each scope's products read the unit it gathered. Evaluation, checkpoints and the final
/// weights make every unit whole for their duration (WholeWeights): that moment's weights are whole_weight_bytes, a
/// transient not in total_bytes. At one rank nothing is split (ZeroOptimizer is not used).
struct RankShare {
  int zero_stage = 0;
  size_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;  ///< this rank's
  size_t gather_bytes = 0;                                      ///< stages 1 to 3: ZeroOptimizer's all-gather buffers
  size_t whole_weight_bytes = 0;  ///< stage 3: the weights while every unit is whole (WholeWeights), not in the total
  size_t units_in_pass = 0;       ///< stage 3: the units whole at once in a pass, counted in param_bytes
  size_t update_elements = 0;     ///< the parameter elements this rank updates (its shard from stage 1 on)
  /// dist.offload: optimizer (offload_share): the optimizer state lives in host memory, with a master copy and a
  /// gradient copy of what the rank updates (host_bytes); the device holds no optimizer state.
  bool offload = false;
  size_t host_bytes = 0;
  size_t half_weight_bytes = 0;  ///< the rounded weight copies under bf16/fp16 (Footprint::half_weight_bytes at 0 to 2)
  size_t total_bytes = 0;        ///< with the buffers, activations and batch tensors, which every rank holds whole
  MemoryFit fit;
};
/// Stages 0 to 3 at `world` ranks (≥ 1); `judge` gives the verdict for one rank's bytes.
std::vector<RankShare> rank_shares(const Footprint& f, int64_t world, const std::function<MemoryFit(size_t)>& judge);
/// `stage` with dist.offload: optimizer (optim/offload.h): the optimizer state and master weights go to host memory
/// (host_bytes: state, masters and gradient copies of update_elements), so a GPU's total drops by the state; on the
/// CPU, where the host is the device, the copies come on top.
RankShare offload_share(const Footprint& f, const RankShare& stage, const std::function<MemoryFit(size_t)>& judge);
/// The four stages side by side, as `gputrain check --world-size N` prints them, the configured one (dist.zero)
/// marked.
std::string rank_shares_report(const std::vector<RankShare>& shares, int64_t world, int configured_stage,
                               bool configured_offload = false);
/// When no stage fits: what would, in lines ("" when one fits or nothing is known). `footprint_with` sizes the same
/// config with another recompute mode, micro-batch and accumulation (nullopt: that setting is refused, e.g. blocks
/// without a block). Tried: train.recompute: blocks; dist.offload: optimizer (where it takes memory off the device:
/// a GPU); halving the micro-batch while doubling train.accumulate (the same samples per step); more ranks
/// (doubling, up to 4096). Each is said with the first stage that fits (stage 3
/// holds the least where the weights outweigh two units and the all-gather buffers).
using FootprintWith = std::function<std::optional<Footprint>(Recompute, int64_t batch, int64_t accumulate)>;
std::string fit_advice(const Footprint& f, int64_t world, const std::function<MemoryFit(size_t)>& judge,
                       const FootprintWith& footprint_with);
/// The stages as JSON: {"world_size", "zero_stage" (dist.zero), "per_rank_bytes" (that stage's),
/// "zero_stages": [{stage, param_bytes, grad_bytes, optimizer_bytes, gather_bytes, half_weight_bytes, per_rank_bytes,
/// fits}, …, with "whole_weight_bytes" at stage 3]}.
void add_rank_shares_json(JsonObject& out, const std::vector<RankShare>& shares, int64_t world, int configured_stage,
                          bool configured_offload = false);

/// What the outputs kept for backward are stored in: "f32", "bf16" or "fp16" (`check --json`'s activation_dtype).
std::string activation_dtype(const Footprint& f);
/// "1.50 GiB", "320 B": binary units, three significant digits.
std::string format_bytes(size_t bytes);
/// The per-layer table, the graph's `edges` (Model::edges), the totals and the fit line `gputrain check` prints.
std::string footprint_report(const Footprint& f, const MemoryFit& fit, const std::string& edges);
/// "fits on cuda:0: yes (needs 1.20 GiB of 127 GiB usable: …)": yes, no or unknown after the colon.
std::string fit_line(const MemoryFit& fit);
/// The same as one JSON object (layers, totals, fit) for `gputrain check --json`.
JsonObject footprint_json(const Footprint& f, const MemoryFit& fit);

}  // namespace gt
