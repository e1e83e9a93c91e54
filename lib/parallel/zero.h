// ZeRO stages 1 to 3 (dist.zero): each rank keeps optimizer state for its shard of the parameters alone and updates
// only that shard; stages 1 and 2 all-gather the new weights after every step, stage 3 keeps only its shard of them
// and gathers each unit of parameters right before a pass uses it.
#pragma once

#include "optim/offload.h"
#include "optim/optimizer.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"

#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gt {

/// An optimizer over the shard of `params` (the model's, in Model::params() order; parameter i in group groups[i],
/// which each of its slices keeps: empty, all in the default group) that this rank of `comm` owns:
/// chunk r of every bucket of `plan` (zero_chunk), the cut GradSync's reduce-scatter hands out. The update is
/// elementwise, so each element gets exactly the value the unsharded optimizer would give it. `stage` 1: the
/// gradients are all-reduced whole and the norm is taken over them as without ZeRO; 2: this rank holds only its shard
/// of the gradients, in grad_chunks(), which GradSync reduce-scatters into (the parameters' own gradients exist only
/// during the backward pass), and the squared norm is the sum of the ranks' partial sums.
/// Checkpoints: each rank writes its own shard (shard_pieces(), train/checkpoint.h), and a load of a sharded
/// checkpoint fills state_ranges() from the byte ranges it needs; a zero 0 checkpoint is loaded whole into state()
/// and shard_state() keeps this rank's part. So a checkpoint resumes at any world size and stage.
///
/// Stage 3 (as stage 2, and): the buckets of `plan` are the units of parameters (plan_units), and this rank holds
/// only its chunk of each unit's weights (value_shards(), the update's master weights). Once shard_values() has run,
/// a sharded parameter's value is undefined except while its unit is gathered: use_node(i), called by the model
/// right before node i's forward, recomputed forward or backward reads its parameters, all-gathers node i's unit into
/// a buffer of its own (chunk · ranks elements; the parameters' values become views of it), and keeps at most
/// kResidentUnits units whole, the ones used last: the unit before goes as a pass moves on to the next, and the last
/// ones of the forward pass are still there when the backward pass starts. release_values() frees every gathered
/// unit (after each backward pass: the update changes the shards). gather_values() makes every parameter whole for
/// what reads the weights outside a training pass (an evaluation, a checkpoint's model file, the final weights),
/// until release_values(). The collectives come in the same order on every rank (the passes are the same): on the
/// calling thread, or with set_prefetch on GradSync's communication thread, in one queue with its reduce-scatters,
/// the next unit's gather queued as soon as the current one is in use. Without prefetch the training thread also
/// reduce-scatters the gradient buckets (GradSync without overlap).
///
/// Devices: the parameters may live on the CPU or on one CUDA device; every buffer here (state, gradient chunks,
/// the all-gather's buffers, the partial norms) lives beside them, and the copies between them are the device's.
/// With a communicator on device buffers (NCCL) the collectives queue on the compute stream (the communicator's
/// default stream), in order with the update's kernels: the step never waits for the device. Device parameters over
/// a host communicator (worker threads, MPI, TCP) go through host copies of the chunks, which wait for the device:
/// correct, but a sync per collective, so the training run uses NCCL on GPUs (train/setup.cpp).
class ZeroOptimizer final : public Optimizer {
 public:
  /// `offload` (dist.offload: optimizer): the update of this rank's slices runs on the host (OffloadOptimizer), the
  /// state and masters of the shard kept there.
  ZeroOptimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params, const BucketPlan& plan,
                Communicator& comm, int stage, const std::vector<int>& groups = {}, Offload offload = Offload::none);

  using Optimizer::stage_hyper;
  using Optimizer::step;
  void step(std::span<const double> lrs, const Tensor& stats, double max_norm) override;
  // (train.cuda_graphs refuses several ranks; these keep the inner optimizer's hyperparameters where step puts them.)
  void hyper_on_device() override { m_inner->hyper_on_device(); }
  void set_capturing(bool on) override { m_inner->set_capturing(on); }
  void stage_hyper(std::span<const double> lrs) override {
    m_inner->set_steps_taken(m_steps);
    m_inner->stage_hyper(lrs);
  }
  void grad_norm_sq(Tensor& out, Tensor& per_param) override;
  std::vector<std::pair<std::string, Tensor*>> state() override;
  bool sharded() const override { return true; }
  void gather_state() override;
  void shard_state() override;
  std::vector<StateRange> state_ranges() override;

  /// This rank's shard of the state in the order of a checkpoint's shard file: for each bucket, for each buffer,
  /// the rank's slices (its chunk of the bucket without the padding). Views, nothing copied.
  std::vector<const Tensor*> shard_pieces();
  /// The state buffers' names ("exp_avg", …), the buckets (parameter indices) and elements per rank of each.
  const std::vector<std::string>& buffers() const { return m_buffers; }
  std::vector<std::vector<size_t>> bucket_params() const;
  std::vector<size_t> bucket_chunks() const;
  int stage() const { return m_stage; }
  /// Stage 2: this rank's averaged chunk of each bucket's gradients (zero_chunk elements, padding last), which
  /// GradSync's reduce-scatter writes and the update reads (views of them are the shard's gradients). Empty at stage 1.
  const std::vector<Tensor>& grad_chunks() const { return m_grad_chunks; }

  /// Stage 3: copies the whole parameters' values into this rank's shards and frees them (the model's initial or
  /// loaded weights, which every rank holds at that moment), frozen ones too.
  void shard_values();
  /// The inner optimizer's delayed update applied to this rank's slices and, below stage 3 (which gathers from the
  /// shards as it needs them), the new weights all-gathered: a collective when an update was under way, and it is on
  /// every rank at once.
  bool settle() override;
  /// shard_values, then the inner optimizer's copies (dist.offload's masters) taken from the slices it updates.
  void take_weights() override {
    shard_values();
    m_inner->take_weights();
  }
  /// Stage 3: node `node`'s unit whole (all-gathered unless it is already), the others as above. Nothing at stages
  /// 1 and 2, for a node without sharded parameters, and while gather_values() holds everything whole.
  void use_node(size_t node);
  /// Stage 3: every unit whole until release_values().
  void gather_values();
  /// Stage 3: every gathered unit freed (the shards stay).
  void release_values();
  /// Stage 3: this rank's chunk of each unit's weights (zero_chunk elements, padding last). Empty at stages 1 and 2.
  const std::vector<Tensor>& value_shards() const { return m_value_shards; }
  /// Units a stage 3 pass keeps whole at most (use_node): a node's own and a tied layer's owner; with prefetch, one
  /// more being gathered.
  static constexpr size_t kResidentUnits = 2;
  /// Stage 3 on CPU ranks: the gathers run on `sync`'s communication thread (GradSync::post), in one order with its
  /// reduce-scatters, and use_node queues the next unit's gather (in the direction the pass goes) as soon as it has
  /// the current one, so that it runs while the current unit's layers compute (FSDP's prefetch). nullptr: every
  /// gather on the calling thread, when it is needed.
  void set_prefetch(GradSync* sync) { m_prefetch = sync && sync->runs_beside() && m_device.is_cpu() ? sync : nullptr; }
  /// Elements of parameter i (Model::params() order), whether or not its value is whole now.
  int64_t param_numel(size_t i) const { return m_shapes[i].numel(); }

  /// The state elements this rank holds between checkpoints (about 1/N of the unsharded optimizer's).
  int64_t shard_state_elements();
  /// The state elements of the unsharded optimizer (what zero 0 holds on every rank).
  int64_t full_state_elements() const;

 private:
  // Elements [offset, offset + count) of parameter `param`, at `at` in this rank's chunk of bucket `bucket`.
  struct Slice {
    size_t bucket, param;
    int64_t offset, count;
    size_t at;
  };
  struct Bucket {
    std::vector<size_t> params;  ///< indices into m_params, in bucket order
    size_t chunk = 0;            ///< elements per rank (the bucket padded to chunk · ranks)
    size_t first_slice = 0, end_slice = 0;
  };
  /// All-gathers one tensor per parameter over every bucket: `mine(j)` is slice j's part (this rank's), `whole(i)`
  /// parameter i's full tensor, which receives every rank's part.
  template <class Mine, class Whole>
  void gather(const char* what, Mine mine, Whole whole);

  /// Stage 2 on a device: adds the ranks' partial squared norms (m_total, m_per_slice) into `out` and `per_param`.
  void device_norm_sums(Tensor& out, Tensor& per_param);
  /// Stage 3's units from `plan` (node_unit, the frozen parameters' shards); returns the largest frozen chunk (the
  /// host copies of a staged all-gather must hold it too).
  size_t plan_units_of(const BucketPlan& plan);
  /// All-gathers the slices' new weights into the whole parameters (stages 1 and 2, after an update).
  void gather_weights();
  /// Runs the all-gather of `n` elements of `send` into `recv` (n per rank), staged through the host when needed.
  void allgather(const Tensor& send, Tensor& recv, size_t n, const char* what);
  /// Stage 3: gathers unit b into a buffer of its own and points its parameters' values at it; frees it again. The
  /// gather's collective part (fill_unit: the buffers filled) may run on the communication thread; attach_unit (the
  /// parameters' views) runs on the training thread, whose product scope it renews.
  void gather_unit(size_t b);
  void fill_unit(size_t b);
  void attach_unit(size_t b);
  void release_unit(size_t b);

  Communicator& m_comm;
  int m_stage;
  Device m_device;        ///< the parameters' device
  bool m_staged = false;  ///< device parameters over a host communicator: collectives on host copies
  std::vector<Param*> m_params;
  std::vector<Shape> m_shapes;  ///< the parameters' shapes (stage 3 frees their values)
  std::vector<Bucket> m_buckets;
  std::vector<Slice> m_slices;
  std::vector<Param> m_slice_params;  ///< views of the parameters' values and gradients (stage 2: of the chunks)
  std::vector<Tensor> m_grad_chunks;  ///< stage 2: grad_chunks()
  std::unique_ptr<Optimizer> m_inner;
  std::vector<std::string> m_buffers;                  ///< the state buffers of one parameter: "exp_avg", …
  std::vector<std::pair<std::string, Tensor>> m_full;  ///< state(): the unsharded buffers, while needed
  Tensor m_send, m_recv;   ///< one chunk, and every rank's chunk of a bucket (m_device; stage 3: while gathering)
  size_t m_max_chunk = 0;  ///< the largest chunk (stage 3: of a unit's weights, frozen ones too)
  Tensor m_host_send, m_host_recv;  ///< m_staged: their host copies
  Tensor m_total, m_per_slice;      ///< stage 2: this rank's partial squared norms
  Tensor m_sums;  ///< stage 2 on a device: each parameter's partial sum, then the total (f64, summed over ranks)
  // Stage 3: the value shards, each node's unit (-1: none), the gathered units' buffers (undefined: not gathered),
  // the gathered ones from least to most recently used, and whether gather_values() holds them all. A unit's frozen
  // parameters (BucketPlan::frozen) have shards and gathered buffers of their own, cut the same way.
  std::vector<Tensor> m_value_shards;
  std::vector<int> m_node_unit;
  std::vector<Tensor> m_gathered;
  std::vector<std::vector<Param*>> m_frozen;
  std::vector<std::vector<Shape>> m_frozen_shapes;
  std::vector<Tensor> m_frozen_shards, m_frozen_gathered;
  std::vector<size_t> m_recent;
  bool m_all_whole = false;
  GradSync* m_prefetch = nullptr;             ///< set_prefetch
  std::vector<std::future<void>> m_pending;   ///< per unit: its prefetch's gather, until use_node takes it
  std::vector<bool> m_node_unit_has_weights;  ///< per unit: it holds a parameter (else nothing to gather)
  int m_last_unit = -1, m_direction = -1;     ///< the unit used last, and the way the pass goes (-1: forward)
};

/// The weights as the steps so far left them, for what reads them outside a training pass: the optimizer settled
/// (Optimizer::settle: dist.offload_delay's last update applied) and, under dist.zero 3, every parameter whole while
/// it lives (ZeroOptimizer::gather_values, then release_values). A collective: every rank makes one at the same
/// point.
class WholeWeights {
 public:
  explicit WholeWeights(Optimizer& optimizer) : m_zero(dynamic_cast<ZeroOptimizer*>(&optimizer)) {
    optimizer.settle();
    if (m_zero) m_zero->gather_values();
  }
  ~WholeWeights() {
    if (m_zero) m_zero->release_values();
  }
  WholeWeights(const WholeWeights&) = delete;
  WholeWeights& operator=(const WholeWeights&) = delete;

 private:
  ZeroOptimizer* m_zero;
};

}  // namespace gt
