// Data-parallel gradient averaging: parameters are grouped into buckets (dist.bucket_mb) in the order the backward
// pass finishes them, and each bucket is all-reduced on a communication thread as soon as its last gradient is
// complete, so communication overlaps the rest of the backward pass (as PyTorch's DDP does). With a communicator on
// device buffers (NCCL) the buckets live on the GPU and the all-reduce runs on a stream of its own, ordered against
// the compute stream by events alone (llm.c's scheme): no thread and no host synchronisation.
#pragma once

#include "core/noncopyable.h"
#include "layers/layer.h"
#include "ops/stream.h"
#include "parallel/comm.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace gt {

class Model;
class Profiler;

/// How GradSync groups the parameters into buckets: buckets[b] holds the parameters of consecutive nodes, from the
/// last node to the first (the order backward finishes them); node_bucket[i] is node i's bucket, -1 without
/// parameters. ZeRO (parallel/zero.h) shards by the same buckets, so that a bucket's reduce-scatter hands each rank
/// exactly the gradients it updates.
struct BucketPlan {
  std::vector<std::vector<Param*>> buckets;
  std::vector<int> node_bucket;
  /// dist.zero 3 (plan_units): the units of weights, numbered as the buckets. node_unit[i] is the unit of node i's
  /// parameters, frozen ones too (-1: it has none), and frozen[u] unit u's frozen parameters (train.freeze), which
  /// are sharded and gathered with the unit but have no gradient: a unit of frozen parameters alone has an empty
  /// bucket. Empty at the other stages.
  std::vector<int> node_unit;
  std::vector<std::vector<Param*>> frozen;
};
BucketPlan plan_buckets(const std::vector<std::vector<Param*>>& params_by_node, double bucket_mb);
/// The elements of each bucket plan_buckets makes, from each node's parameter count alone (the same cut): `gputrain
/// check` sizes ZeRO-2's gradient buckets with it without building the parameters.
std::vector<int64_t> bucket_sizes(const std::vector<int64_t>& params_per_node, double bucket_mb);

/// dist.zero 3's units over `params_by_node` (every parameter of each node, frozen ones too: Model::
/// all_params_by_node): with dist.shard_unit block, the nodes with parameters cut where `node_block` (each node's
/// pass of a top-level `repeat:` block, -1 outside any) changes, from the last node to the first: a transformer's
/// blocks one unit each, and the runs of nodes between them (the embeddings, the head) one each. With no block at all
/// (or `node_block` all -1: shard_unit bucket) plan_buckets' cut of the same counts. Gathered, used and freed as one
/// (parallel/zero.h); the buckets hold each unit's parameters that learn, BucketPlan::frozen the others.
BucketPlan plan_units(const std::vector<std::vector<Param*>>& params_by_node, const std::vector<int>& node_block,
                      double bucket_mb);
/// Each node's unit in plan_units' cut (BucketPlan::node_unit: -1 without parameters), from each node's parameter
/// count alone, frozen ones included: `gputrain check` sizes stage 3 with it without building the parameters.
std::vector<int> node_units(const std::vector<int64_t>& params_per_node, const std::vector<int>& node_block,
                            double bucket_mb);
/// The elements of each unit plan_units makes, from each node's parameter count alone, frozen ones included
/// (bucket_sizes' counterpart).
std::vector<int64_t> unit_sizes(const std::vector<int64_t>& params_per_node, const std::vector<int>& node_block,
                                double bucket_mb);

/// ZeRO's cut of a bucket of `elems` gradient elements over `world` ranks: padded to chunk · world elements, rank r
/// owning [r · chunk, min((r + 1) · chunk, elems)).
inline size_t zero_chunk(size_t elems, int world) {
  return (elems + static_cast<size_t>(world) - 1) / static_cast<size_t>(world);
}

class GradSync : NonCopyable {
 public:
  /// `params_by_node[i]` are node i's parameters; buckets follow the nodes from last to first. `overlap`: all-reduce
  /// on a communication thread during backward; otherwise every bucket in `finish`, on the calling thread (better
  /// when every core already computes: the thread would only take cycles from the backward pass). When
  /// comm.device_buffers(), the gradients must be f32 on one CUDA device: each bucket is queued on a side stream as
  /// it completes (overlap) or all in `finish`, and `finish` returns once the compute stream waits for them.
  ///
  /// `chunks` (dist.zero: 2): one f32 tensor per bucket of zero_chunk(its elements, ranks) elements
  /// (ZeroOptimizer::grad_chunks), on the gradients' device. On device buffers each bucket is reduce-scattered on the
  /// side stream into its chunk, which `finish` averages on the compute stream, and each parameter's grad is a view of
  /// its bucket's buffer (padded to chunk · ranks, zeroed): with `overlap` and one micro-batch per step
  /// (`micro_batches`, train.accumulate), a slot of a small ring that node_begin takes when the backward pass first
  /// writes into the bucket, once the compute stream waits for that slot's last reduce-scatter (an event on the side
  /// stream), and that goes back to the ring when the bucket's reduce-scatter is queued; slots are added when every
  /// slot is taken (a tied layer's owner stays whole through the pass) and grow to the largest bucket they held.
  /// Otherwise (all buckets launched in finish, or micro-batches that add into every bucket) the buckets are
  /// allocated here for the whole run. On the host
  /// each bucket is reduce-scattered into its chunk, which is averaged in place, instead of all-reduced, and the
  /// gradients live in the buckets (gradient-as-bucket-view, as DDP's option): a parameter's grad is a view of its
  /// bucket's flat buffer, which node_begin allocates (zeroed) when the backward pass first writes into it and which is
  /// freed once its reduce-scatter is done. Outside the backward pass every parameter's grad is undefined (the
  /// constructor frees them): this rank's averaged chunks are all it holds. In the armed pass at most two buckets are
  /// whole at once (node_begin waits for the communication thread before it allocates a third; without overlap each is
  /// reduce-scattered as soon as it is complete, on the calling thread); the unarmed passes before it
  /// (train.accumulate) keep every bucket they write whole until the armed pass reduce-scatters it.
  GradSync(Communicator& comm, const std::vector<std::vector<Param*>>& params_by_node, double bucket_mb,
           bool overlap = true, std::vector<Tensor> chunks = {}, int64_t micro_batches = 1)
      : GradSync(comm, plan_buckets(params_by_node, bucket_mb), overlap, std::move(chunks), micro_batches) {}
  /// The same over buckets cut beforehand (dist.zero 3's units: plan_units).
  GradSync(Communicator& comm, BucketPlan plan, bool overlap = true, std::vector<Tensor> chunks = {},
           int64_t micro_batches = 1);
  ~GradSync();

  /// Times every bucket's all-reduce (on the communication thread's lane) and the wait for them in finish().
  void set_profiler(Profiler* p) { m_profiler = p; }
  /// Arms the next backward pass: its gradients are averaged as they complete.
  void arm() { m_armed = true; }
  /// Called before a backward writes node `i`'s parameter gradients (before node i's own, and before that of a layer
  /// tied to its weight). With chunks it allocates node i's bucket if it is not whole yet; otherwise nothing.
  void node_begin(size_t i);
  /// Called when node `i`'s backward has run (its parameter gradients are final for this step).
  void node_done(size_t i);
  /// Waits until every bucket is averaged. Call after the armed backward pass.
  void finish();
  /// Runs `job` (a collective: the same jobs in the same order on every rank) on the communication thread, after
  /// the buckets and jobs queued before it, and returns when it is queued: the future is ready once it has run (its
  /// exception, if any, comes out of get()). Without the thread (no overlap, device buffers) it runs now. dist.zero 3
  /// gathers units of weights this way, ahead of the layers that read them, in one order with the reduce-scatters.
  std::future<void> post(std::function<void()> job);
  /// Whether post() runs jobs beside the caller (the communication thread is there).
  bool runs_beside() const { return m_thread.joinable(); }

  size_t buckets() const { return m_buckets.size(); }
  int64_t bytes_per_step() const { return m_bytes; }
  /// Seconds spent in all-reduce on the communication thread, and seconds `finish` waited for it (the part not
  /// hidden behind the backward pass), summed since construction. Zero on device buffers: the host never waits
  /// there, so it cannot time the device's work.
  double comm_seconds() const { return m_comm_seconds; }
  double exposed_seconds() const { return m_exposed_seconds; }

 private:
  struct Bucket {
    std::vector<Param*> params;
    std::vector<float> flat;    ///< all-reduce: a copy of the gradients, then their sums
    std::vector<Shape> shapes;  ///< chunks: the parameters' shapes (their grads are views of `grads` or undefined)
    Tensor grads;               ///< chunks: the flat gradients, padded to chunk · ranks, while whole
    Tensor device_flat;         ///< on device buffers: the bucket, f32 on the gradients' device
    size_t nodes = 0;           ///< nodes whose parameters it holds
    size_t pending = 0;         ///< of those, done in this backward pass
  };
  void worker();
  void reduce(size_t b);  ///< all-reduces bucket b and writes the averages back, or reduce-scatters it (chunks)
  void scatter(size_t b, float scale);  ///< chunks: reduce-scatters bucket b, averages its chunk, frees the bucket
  void launch_device(size_t b);  ///< device buffers: flattens bucket b and queues its all-reduce on the side stream
  void take_slot(size_t b);      ///< the device ring: a slot for bucket b, zeroed, its parameters' grads views of it
  void finish_device();

  Communicator& m_comm;
  std::vector<Bucket> m_buckets;
  std::vector<int> m_bucket_of_node;  ///< -1: no parameters
  size_t m_active = 0;                ///< buckets with a gradient (a unit of frozen weights alone has none)
  std::vector<Tensor> m_chunks;       ///< dist.zero 2: this rank's averaged chunk of each bucket
  bool m_armed = false, m_overlap = true;
  bool m_device = false;               ///< the communicator takes device buffers
  std::unique_ptr<SideStream> m_side;  ///< device buffers: where the all-reduce runs
  /// Device buffers with chunks, overlap and one micro-batch: the ring of bucket buffers, and each bucket's slot (-1:
  /// none now). A slot is free once its bucket's reduce-scatter is queued; `done` is recorded on the side stream
  /// after it.
  struct Slot {
    Tensor buffer;
    StreamEvent done;
    bool taken = false;
    uint64_t given_back = 0;  ///< when it last went back to the ring (m_given_back's count then)
  };
  bool m_ring = false;
  uint64_t m_given_back = 0;
  std::vector<std::unique_ptr<Slot>> m_slots;
  std::vector<int> m_slot_of;
  Tensor m_scale;  ///< device buffers: 1 / ranks, f64 on the device, for scale_by
  int64_t m_bytes = 0;
  double m_comm_seconds = 0, m_exposed_seconds = 0;

  std::mutex m_mutex;
  std::condition_variable m_cv;
  /// What the communication thread runs, in order: a bucket's all-reduce or reduce-scatter, or a posted job.
  struct Job {
    size_t bucket = 0;
    std::function<void()> run;  ///< set: a posted job (its future carries how it ended)
  };
  std::deque<Job> m_queue;
  size_t m_done = 0, m_launched = 0;
  size_t m_whole = 0;  ///< chunks: buckets allocated now
  bool m_stop = false;
  std::exception_ptr m_error;
  Profiler* m_profiler = nullptr;  ///< the first failure of the communication thread, rethrown by finish()
  std::thread m_thread;
};

}  // namespace gt
