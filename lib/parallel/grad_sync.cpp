// Bucketed gradient averaging on a communication thread, or on a CUDA side stream for device communicators.
#include "parallel/grad_sync.h"

#include "core/error.h"
#include "ops/optim.h"
#include "profile/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>

namespace gt {
namespace {
const std::string kAllReduce = "all-reduce", kWaitType = "after backward";
std::string bucket_name(size_t b) { return "bucket " + std::to_string(b); }
}  // namespace

namespace {

// Each node's bucket from its parameter count (< 0: the node has no parameters, and no bucket: -1): the cut
// plan_buckets and bucket_sizes share.
std::vector<int> bucket_of_nodes(const std::vector<int64_t>& params_per_node, double bucket_mb) {
  // Like DDP, the first bucket (the last layers, done first) is capped at 1 MB so that communication starts early
  // even when the whole model would fit one bucket.
  const auto limit = static_cast<size_t>(bucket_mb * 1e6 / sizeof(float));
  const auto first_limit = std::min(limit, static_cast<size_t>(1e6 / sizeof(float)));
  std::vector<int> out(params_per_node.size(), -1);
  int buckets = 0;
  size_t fill = 0;
  for (size_t i = params_per_node.size(); i-- > 0;) {  // the order backward finishes them
    if (params_per_node[i] < 0) continue;
    const auto n = static_cast<size_t>(params_per_node[i]);
    // A node's parameters share a bucket; a node that would take a bucket past its size starts the next one.
    if (buckets == 0 || (fill > 0 && fill + n > (buckets == 1 ? first_limit : limit))) {
      ++buckets;
      fill = 0;
    }
    fill += n;
    out[i] = buckets - 1;
  }
  return out;
}

// Each node's unit from its parameter count and block (plan_units' cut), or bucket_of_nodes' cut without blocks.
std::vector<int> unit_of_nodes(const std::vector<int64_t>& params_per_node, const std::vector<int>& node_block,
                               double bucket_mb) {
  GT_CHECK(node_block.size() == params_per_node.size(), "{} block ids for {} nodes", node_block.size(),
           params_per_node.size());
  if (std::none_of(node_block.begin(), node_block.end(), [](int b) { return b >= 0; }))
    return bucket_of_nodes(params_per_node, bucket_mb);
  std::vector<int> out(params_per_node.size(), -1);
  int units = 0, key = 0;
  for (size_t i = params_per_node.size(); i-- > 0;) {
    if (params_per_node[i] < 0) continue;
    if (units == 0 || node_block[i] != key) ++units;
    key = node_block[i];
    out[i] = units - 1;
  }
  return out;
}

// The plan of a cut: each node's parameters, in the order backward finishes them, in its bucket.
BucketPlan plan_of(const std::vector<std::vector<Param*>>& params_by_node, std::vector<int> node_bucket) {
  BucketPlan plan;
  plan.node_bucket = std::move(node_bucket);
  for (size_t i = params_by_node.size(); i-- > 0;) {
    const int b = plan.node_bucket[i];
    if (b < 0) continue;
    if (plan.buckets.size() <= static_cast<size_t>(b)) plan.buckets.resize(static_cast<size_t>(b) + 1);
    for (Param* p : params_by_node[i]) plan.buckets[static_cast<size_t>(b)].push_back(p);
  }
  return plan;
}

std::vector<int64_t> counts_of(const std::vector<std::vector<Param*>>& params_by_node) {
  std::vector<int64_t> counts;
  for (const auto& params : params_by_node) {
    int64_t n = 0;
    for (Param* p : params) n += p->value.numel();
    counts.push_back(params.empty() ? -1 : n);
  }
  return counts;
}

// The elements of each bucket of a cut.
std::vector<int64_t> sizes_of(const std::vector<int64_t>& params_per_node, const std::vector<int>& node_bucket) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < node_bucket.size(); ++i) {
    if (node_bucket[i] < 0) continue;
    const auto b = static_cast<size_t>(node_bucket[i]);
    if (out.size() <= b) out.resize(b + 1, 0);
    out[b] += params_per_node[i];
  }
  return out;
}

// A node without parameter elements has no bucket in a count-only cut (nor a gradient to count).
std::vector<int64_t> positive_counts(const std::vector<int64_t>& params_per_node) {
  std::vector<int64_t> counts;
  for (int64_t n : params_per_node) counts.push_back(n > 0 ? n : -1);
  return counts;
}

// A parameter's gradient, or its value where the gradient is freed already (dist.zero 2 and 3 free them before the
// sharded optimizer allocates its state): the two share shape, dtype and device.
const Tensor& grad_or_value(const Param& p) { return p.grad.defined() ? p.grad : p.value; }

}  // namespace

BucketPlan plan_units(const std::vector<std::vector<Param*>>& params_by_node, const std::vector<int>& node_block,
                      double bucket_mb) {
  BucketPlan plan;
  plan.node_unit = unit_of_nodes(counts_of(params_by_node), node_block, bucket_mb);
  const auto units = static_cast<size_t>(*std::max_element(plan.node_unit.begin(), plan.node_unit.end()) + 1);
  plan.buckets.resize(units);
  plan.frozen.resize(units);
  plan.node_bucket.assign(params_by_node.size(), -1);
  for (size_t i = params_by_node.size(); i-- > 0;) {
    const int u = plan.node_unit[i];
    if (u < 0) continue;
    for (Param* p : params_by_node[i]) {
      (p->trains() ? plan.buckets : plan.frozen)[static_cast<size_t>(u)].push_back(p);
      if (p->trains()) plan.node_bucket[i] = u;  // its backward writes into the bucket, and says when it is done
    }
  }
  return plan;
}

std::vector<int> node_units(const std::vector<int64_t>& params_per_node, const std::vector<int>& node_block,
                            double bucket_mb) {
  return unit_of_nodes(positive_counts(params_per_node), node_block, bucket_mb);
}

std::vector<int64_t> unit_sizes(const std::vector<int64_t>& params_per_node, const std::vector<int>& node_block,
                                double bucket_mb) {
  return sizes_of(params_per_node, unit_of_nodes(positive_counts(params_per_node), node_block, bucket_mb));
}

BucketPlan plan_buckets(const std::vector<std::vector<Param*>>& params_by_node, double bucket_mb) {
  return plan_of(params_by_node, bucket_of_nodes(counts_of(params_by_node), bucket_mb));
}

std::vector<int64_t> bucket_sizes(const std::vector<int64_t>& params_per_node, double bucket_mb) {
  return sizes_of(params_per_node, bucket_of_nodes(positive_counts(params_per_node), bucket_mb));
}

GradSync::GradSync(Communicator& comm, BucketPlan plan, bool overlap, std::vector<Tensor> chunks, int64_t micro_batches)
    : m_comm(comm), m_chunks(std::move(chunks)), m_overlap(overlap), m_device(comm.device_buffers()) {
  m_ring = m_device && !m_chunks.empty() && overlap && micro_batches == 1;
  m_bucket_of_node = std::move(plan.node_bucket);
  std::optional<Device> device;
  for (auto& params : plan.buckets) {
    for (Param* p : params) {
      if (m_device) {
        const Tensor& g = grad_or_value(*p);
        if (!device) device = g.device();
        GT_CHECK(g.dtype() == DType::f32 && g.device().is_cuda() && g.device() == *device,
                 "gradient sync over {} covers f32 gradients on one CUDA device", comm.name());
      } else {
        GT_CHECK(grad_or_value(*p).dtype() == DType::f32 && grad_or_value(*p).device().is_cpu(),
                 "gradient sync covers f32 CPU gradients");
      }
    }
    m_buckets.emplace_back();
    m_buckets.back().params = std::move(params);
  }
  for (size_t i = 0; i < m_bucket_of_node.size(); ++i)
    if (m_bucket_of_node[i] >= 0) ++m_buckets[static_cast<size_t>(m_bucket_of_node[i])].nodes;
  for (const Bucket& b : m_buckets) m_active += b.nodes > 0 ? 1 : 0;
  GT_CHECK(m_chunks.empty() || m_chunks.size() == m_buckets.size(), "{} gradient chunks for {} buckets",
           m_chunks.size(), m_buckets.size());
  for (size_t k = 0; k < m_buckets.size(); ++k) {
    Bucket& b = m_buckets[k];
    size_t n = 0;
    for (Param* p : b.params) n += static_cast<size_t>(grad_or_value(*p).numel());
    if (!m_chunks.empty()) {
      const Tensor& c = m_chunks[k];
      const Device want = m_device && device ? *device : Device::cpu();
      GT_CHECK(c.dtype() == DType::f32 && c.device() == want &&
                   static_cast<size_t>(c.numel()) == zero_chunk(n, comm.size()),
               "bucket {}'s gradient chunk has {} elements on {}, not ⌈{} / {}⌉ on {}", k, c.numel(), c.device().str(),
               n, comm.size(), want.str());
    }
    if (m_ring) {
      // From here the gradients exist only while the backward pass writes them (take_slot).
      for (Param* p : b.params) {
        b.shapes.push_back(grad_or_value(*p).shape());
        p->grad = Tensor();
      }
    } else if (m_device && !m_chunks.empty()) {
      // Gradient-as-bucket-view on the device: the parameters' gradients become views of the bucket, padded to
      // chunk · ranks and zeroed once (the padding is reduce-scattered too and must add nothing), so the bucket is
      // the gradients themselves, allocated here for the whole run: no flattening copy, and no second copy of them.
      const size_t chunk = zero_chunk(n, comm.size());
      b.device_flat =
          Tensor::zeros(Shape{static_cast<int64_t>(chunk * static_cast<size_t>(comm.size()))}, DType::f32, *device);
      int64_t offset = 0;
      for (Param* p : b.params) {
        const Shape shape = grad_or_value(*p).shape();
        if (p->grad.defined()) b.device_flat.slice0(offset, shape.numel()).copy_from(p->grad);
        p->grad = b.device_flat.slice0(offset, shape.numel()).view(shape);
        offset += shape.numel();
      }
    } else if (m_device) {
      b.device_flat = Tensor::empty(Shape{static_cast<int64_t>(n)}, DType::f32, *device);
    } else if (!m_chunks.empty()) {
      // From here the gradients exist only while the backward pass writes them (node_begin).
      for (Param* p : b.params) {
        b.shapes.push_back(grad_or_value(*p).shape());
        p->grad = Tensor();
      }
    } else {
      b.flat.resize(n);
    }
    m_bytes += static_cast<int64_t>(n * sizeof(float));
  }
  m_slot_of.assign(m_buckets.size(), -1);
  if (m_device && device) {
    m_side = std::make_unique<SideStream>(*device);
    Tensor scale = Tensor::empty(Shape{1}, DType::f64);
    scale.data<double>()[0] = 1.0 / comm.size();
    m_scale = Tensor::empty(Shape{1}, DType::f64, *device);
    m_scale.copy_from(scale);
  }
  // On device buffers the side stream overlaps the backward pass: no thread needed.
  if (m_overlap && !m_device) m_thread = std::thread([this] { worker(); });
}

GradSync::~GradSync() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stop = true;
  }
  m_cv.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

void GradSync::node_begin(size_t i) {
  if (m_chunks.empty() || m_bucket_of_node[i] < 0) return;
  if (m_device) {  // (without the ring, device buckets are whole for the run)
    if (m_ring) take_slot(static_cast<size_t>(m_bucket_of_node[i]));
    return;
  }
  Bucket& bucket = m_buckets[static_cast<size_t>(m_bucket_of_node[i])];
  if (bucket.grads.defined()) return;  // whole already (this pass, or an earlier micro-batch of the step)
  {
    std::unique_lock<std::mutex> lock(m_mutex);
    // Two whole buckets at most while the communication thread has work: one being reduce-scattered, one being
    // written. Waiting costs little, as the thread is the step's critical path then anyway.
    if (m_armed && m_overlap) m_cv.wait(lock, [this] { return m_whole < 2 || m_done == m_launched; });
    ++m_whole;
  }
  size_t n = 0;
  for (const Shape& shape : bucket.shapes) n += static_cast<size_t>(shape.numel());
  const size_t chunk = zero_chunk(n, m_comm.size());
  // Zeroed: the padding past the last parameter is reduce-scattered too, and must add nothing. Mapped, so that the
  // pages go back to the system when it is freed: malloc would keep a freed bucket resident, and the saving with it.
  bucket.grads =
      Tensor::mapped_zeros(Shape{static_cast<int64_t>(chunk * static_cast<size_t>(m_comm.size()))}, DType::f32);
  int64_t offset = 0;
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    const Shape& shape = bucket.shapes[k];
    bucket.params[k]->grad = bucket.grads.slice0(offset, shape.numel()).view(shape);
    offset += shape.numel();
  }
}

void GradSync::node_done(size_t i) {
  // Without overlap, buckets are all-reduced in finish; reduce-scattered host ones (chunks) as they complete, below,
  // so that each is freed before the next is written (device buckets are whole for the run: in finish too).
  if (!m_armed || (!m_overlap && (m_chunks.empty() || m_device)) || m_bucket_of_node[i] < 0) return;
  const auto b = static_cast<size_t>(m_bucket_of_node[i]);
  if (++m_buckets[b].pending < m_buckets[b].nodes) return;
  m_buckets[b].pending = 0;
  if (m_device) {
    launch_device(b);
    return;
  }
  if (!m_overlap) {  // chunks: on this thread at once, so that the bucket is freed before the next one is written
    const auto t0 = std::chrono::steady_clock::now();
    reduce(b);
    const auto t1 = std::chrono::steady_clock::now();
    if (m_profiler) m_profiler->record(kAllReduce, bucket_name(b), "bucket", t0, t1, 0, Profiler::kMain);
    const double dt = std::chrono::duration<double>(t1 - t0).count();
    m_exposed_seconds += dt;
    m_comm_seconds += dt;
    ++m_launched;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_queue.push_back({b, nullptr});
    ++m_launched;
  }
  m_cv.notify_all();
}

void GradSync::finish() {
  if (!m_armed) return;
  m_armed = false;
  if (m_device) {
    finish_device();
    return;
  }
  if (!m_overlap && !m_chunks.empty()) {  // reduce-scattered in node_done
    GT_CHECK(m_launched == m_active, "{} of {} gradient buckets were complete after backward", m_launched, m_active);
    m_launched = 0;
    return;
  }
  if (!m_overlap) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t b = 0; b < m_buckets.size(); ++b) {
      if (m_buckets[b].nodes == 0) continue;  // no gradient in it
      const auto b0 = std::chrono::steady_clock::now();
      reduce(b);
      if (m_profiler)
        m_profiler->record(kAllReduce, bucket_name(b), "bucket", b0, std::chrono::steady_clock::now(), 0,
                           Profiler::kMain);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m_exposed_seconds += dt;
    m_comm_seconds += dt;
    return;
  }
  GT_CHECK(m_launched == m_active, "{} of {} gradient buckets were complete after backward", m_launched, m_active);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(m_mutex);
  m_cv.wait(lock, [this] { return m_done == m_active; });
  m_done = m_launched = 0;
  if (m_profiler)
    m_profiler->record(kAllReduce, kWaitType, "wait", t0, std::chrono::steady_clock::now(), 0, Profiler::kMain);
  if (m_error) std::rethrow_exception(std::exchange(m_error, nullptr));
  m_exposed_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GradSync::reduce(size_t b) {
  const float scale = 1.0f / static_cast<float>(m_comm.size());
  if (!m_chunks.empty()) {
    scatter(b, scale);
    return;
  }
  Bucket& bucket = m_buckets[b];
  float* flat = bucket.flat.data();
  for (Param* p : bucket.params) {
    std::memcpy(flat, p->grad.data<float>(), static_cast<size_t>(p->grad.numel()) * sizeof(float));
    flat += p->grad.numel();
  }
  m_comm.allreduce_sum(bucket.flat.data(), bucket.flat.size(), "the gradients");
  flat = bucket.flat.data();
  for (Param* p : bucket.params) {
    float* g = p->grad.data<float>();
    for (int64_t k = 0; k < p->grad.numel(); ++k) g[k] = flat[k] * scale;
    flat += p->grad.numel();
  }
}

void GradSync::scatter(size_t b, float scale) {
  Bucket& bucket = m_buckets[b];
  Tensor& chunk = m_chunks[b];
  GT_CHECK(bucket.grads.defined(), "gradient bucket {} is complete but no backward wrote into it", b);
  m_comm.reduce_scatter_sum(bucket.grads.data<float>(), chunk.data<float>(), static_cast<size_t>(chunk.numel()),
                            "the gradients");
  float* c = chunk.data<float>();
  for (int64_t k = 0; k < chunk.numel(); ++k) c[k] *= scale;
  // Freed: the parameters' views go, then the buffer (the last reference to the storage).
  for (Param* p : bucket.params) p->grad = Tensor();
  bucket.grads = Tensor();
  std::lock_guard<std::mutex> lock(m_mutex);
  --m_whole;
}

void GradSync::take_slot(size_t b) {
  if (m_slot_of[b] >= 0) return;  // whole already in this pass
  Bucket& bucket = m_buckets[b];
  size_t n = 0;
  for (const Shape& shape : bucket.shapes) n += static_cast<size_t>(shape.numel());
  const auto padded = static_cast<int64_t>(zero_chunk(n, m_comm.size()) * static_cast<size_t>(m_comm.size()));
  // The free slot given back longest ago. Not the one the last bucket just gave back, whose reduce-scatter has only
  // been queued (the compute stream would wait for it, and the backward would no longer overlap it): a slot is added
  // then, up to two more than are taken, so two slots take turns beside those a pass keeps (a tied layer's owner).
  size_t s = m_slots.size(), taken = 0;
  for (size_t k = 0; k < m_slots.size(); ++k) {
    taken += m_slots[k]->taken ? 1 : 0;
    if (!m_slots[k]->taken && (s == m_slots.size() || m_slots[k]->given_back < m_slots[s]->given_back)) s = k;
  }
  if (s == m_slots.size() || (m_slots[s]->given_back == m_given_back && m_slots.size() < taken + 2)) {
    m_slots.push_back(std::make_unique<Slot>());
    s = m_slots.size() - 1;
  }
  Slot& slot = *m_slots[s];
  // The compute stream's work from here (the zeroing, the backward's writes) runs after the slot's last
  // reduce-scatter; a buffer too small is given back to the caching allocator only then, so whatever the compute
  // stream is handed next is free of the side stream's reads as well.
  m_side->compute_wait(slot.done);
  if (slot.buffer.numel() < padded) slot.buffer = Tensor::empty(Shape{padded}, DType::f32, m_chunks[b].device());
  bucket.device_flat = slot.buffer.slice0(0, padded);
  bucket.device_flat.zero_();  // the padding is reduce-scattered too, and must add nothing
  int64_t offset = 0;
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    const Shape& shape = bucket.shapes[k];
    bucket.params[k]->grad = bucket.device_flat.slice0(offset, shape.numel()).view(shape);
    offset += shape.numel();
  }
  slot.taken = true;
  m_slot_of[b] = static_cast<int>(s);
}

void GradSync::launch_device(size_t b) {
  // The copies queue on the compute stream behind the backward kernels that wrote the gradients; the side stream
  // starts the all-reduce once they are done, while the compute stream goes on with the backward pass.
  Bucket& bucket = m_buckets[b];
  GT_CHECK(bucket.device_flat.defined(), "gradient bucket {} is complete but no backward wrote into it", b);
  if (m_chunks.empty()) {  // (with chunks the gradients are views of the bucket already)
    int64_t offset = 0;
    for (Param* p : bucket.params) {
      bucket.device_flat.slice0(offset, p->grad.numel()).copy_from(p->grad);  // copy_from matches by element count
      offset += p->grad.numel();
    }
  }
  m_side->wait_for_compute();
  m_comm.set_stream(m_side->handle());
  if (m_chunks.empty())
    m_comm.allreduce_sum(bucket.device_flat.data<float>(), static_cast<size_t>(bucket.device_flat.numel()),
                         "the gradients");
  else  // dist.zero 2: this rank's chunk of the sums, into the optimizer's gradient chunk
    m_comm.reduce_scatter_sum(bucket.device_flat.data<float>(), m_chunks[b].data<float>(),
                              static_cast<size_t>(m_chunks[b].numel()), "the gradients");
  m_comm.set_stream(nullptr);
  ++m_launched;
  if (m_ring && m_slot_of[b] >= 0) {  // the slot goes back to the ring once its reduce-scatter has run
    Slot& slot = *m_slots[static_cast<size_t>(m_slot_of[b])];
    m_side->record(slot.done);
    slot.taken = false;
    slot.given_back = ++m_given_back;
    m_slot_of[b] = -1;
    for (Param* p : bucket.params) p->grad = Tensor();
    bucket.device_flat = Tensor();
  }
}

void GradSync::finish_device() {
  if (!m_overlap)
    for (size_t b = 0; b < m_buckets.size(); ++b)
      if (m_buckets[b].nodes > 0) launch_device(b);
  GT_CHECK(m_launched == m_active, "{} of {} gradient buckets were complete after backward", m_launched, m_active);
  m_launched = 0;
  // From here the compute stream (the optimizer step) runs after every bucket's all-reduce; the host goes on.
  if (m_side) m_side->join_compute();
  if (!m_chunks.empty()) {
    for (Tensor& chunk : m_chunks) ops::scale_by(chunk, m_scale);
    return;
  }
  for (Bucket& bucket : m_buckets) {
    ops::scale_by(bucket.device_flat, m_scale);
    int64_t offset = 0;
    for (Param* p : bucket.params) {
      p->grad.copy_from(bucket.device_flat.slice0(offset, p->grad.numel()));
      offset += p->grad.numel();
    }
  }
}

std::future<void> GradSync::post(std::function<void()> job) {
  auto task = std::make_shared<std::packaged_task<void()>>(std::move(job));
  std::future<void> done = task->get_future();
  if (!runs_beside()) {
    (*task)();
    return done;
  }
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_queue.push_back({0, [task] { (*task)(); }});
  }
  m_cv.notify_all();
  return done;
}

void GradSync::worker() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_cv.wait(lock, [this] { return m_stop || !m_queue.empty(); });
      if (m_queue.empty()) return;
      job = std::move(m_queue.front());
      m_queue.pop_front();
    }
    if (job.run) {  // a posted job: its packaged task keeps what it threw for the one waiting on it
      job.run();
      m_cv.notify_all();
      continue;
    }
    const size_t b = job.bucket;
    const auto t0 = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {  // a collective that throws (another worker failed, a time-out) reaches the training loop in finish()
      reduce(b);
    } catch (...) {
      error = std::current_exception();
    }
    if (m_profiler)
      m_profiler->record(kAllReduce, bucket_name(b), "bucket", t0, std::chrono::steady_clock::now(), 0,
                         Profiler::kComm);
    m_comm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      ++m_done;
      if (error && !m_error) m_error = error;
    }
    m_cv.notify_all();
  }
}

}  // namespace gt
