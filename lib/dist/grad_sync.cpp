// Bucketed gradient averaging on a communication thread, or on a CUDA side stream for device communicators.
#include "dist/grad_sync.h"

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

BucketPlan plan_buckets(const std::vector<std::vector<Param*>>& params_by_node, double bucket_mb) {
  // Like DDP, the first bucket (the last layers, done first) is capped at 1 MB so that communication starts early
  // even when the whole model would fit one bucket.
  const auto limit = static_cast<size_t>(bucket_mb * 1e6 / sizeof(float));
  const auto first_limit = std::min(limit, static_cast<size_t>(1e6 / sizeof(float)));
  BucketPlan plan;
  plan.node_bucket.assign(params_by_node.size(), -1);
  size_t fill = 0;
  for (size_t i = params_by_node.size(); i-- > 0;) {  // the order backward finishes them
    if (params_by_node[i].empty()) continue;
    size_t n = 0;
    for (Param* p : params_by_node[i]) n += static_cast<size_t>(p->grad.numel());
    // A node's parameters share a bucket; a node that would take a bucket past its size starts the next one.
    if (plan.buckets.empty() || (fill > 0 && fill + n > (plan.buckets.size() == 1 ? first_limit : limit))) {
      plan.buckets.emplace_back();
      fill = 0;
    }
    for (Param* p : params_by_node[i]) plan.buckets.back().push_back(p);
    fill += n;
    plan.node_bucket[i] = static_cast<int>(plan.buckets.size() - 1);
  }
  return plan;
}

GradSync::GradSync(Communicator& comm, const std::vector<std::vector<Param*>>& params_by_node, double bucket_mb,
                   bool overlap, bool scatter)
    : m_comm(comm), m_overlap(overlap), m_scatter(scatter), m_device(comm.device_buffers()) {
  GT_CHECK(!(m_scatter && m_device), "reduce-scattered gradients (dist.zero: 2) need a host communicator, not {}",
           comm.name());
  BucketPlan plan = plan_buckets(params_by_node, bucket_mb);
  m_bucket_of_node = std::move(plan.node_bucket);
  std::optional<Device> device;
  for (auto& params : plan.buckets) {
    for (Param* p : params) {
      if (m_device) {
        if (!device) device = p->grad.device();
        GT_CHECK(p->grad.dtype() == DType::f32 && p->grad.device().is_cuda() && p->grad.device() == *device,
                 "gradient sync over {} covers f32 gradients on one CUDA device", comm.name());
      } else {
        GT_CHECK(p->grad.dtype() == DType::f32 && p->grad.device().is_cpu(), "gradient sync covers f32 CPU gradients");
      }
    }
    m_buckets.emplace_back();
    m_buckets.back().params = std::move(params);
  }
  for (size_t i = 0; i < m_bucket_of_node.size(); ++i)
    if (m_bucket_of_node[i] >= 0) ++m_buckets[static_cast<size_t>(m_bucket_of_node[i])].nodes;
  for (Bucket& b : m_buckets) {
    size_t n = 0;
    for (Param* p : b.params) n += static_cast<size_t>(p->grad.numel());
    if (m_device)
      b.device_flat = Tensor::empty(Shape{static_cast<int64_t>(n)}, DType::f32, *device);
    else if (m_scatter)  // padded to whole chunks; the padding stays zero
      b.flat.resize(zero_chunk(n, comm.size()) * static_cast<size_t>(comm.size())),
          b.chunk.resize(b.flat.size() / static_cast<size_t>(comm.size()));
    else
      b.flat.resize(n);
    m_bytes += static_cast<int64_t>(n * sizeof(float));
  }
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

void GradSync::node_done(size_t i) {
  if (!m_armed || !m_overlap || m_bucket_of_node[i] < 0) return;
  const auto b = static_cast<size_t>(m_bucket_of_node[i]);
  if (++m_buckets[b].pending < m_buckets[b].nodes) return;
  m_buckets[b].pending = 0;
  if (m_device) {
    launch_device(b);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_queue.push_back(b);
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
  if (!m_overlap) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t b = 0; b < m_buckets.size(); ++b) {
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
  GT_CHECK(m_launched == m_buckets.size(), "{} of {} gradient buckets were complete after backward", m_launched,
           m_buckets.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(m_mutex);
  m_cv.wait(lock, [this] { return m_done == m_buckets.size(); });
  m_done = m_launched = 0;
  if (m_profiler)
    m_profiler->record(kAllReduce, kWaitType, "wait", t0, std::chrono::steady_clock::now(), 0, Profiler::kMain);
  if (m_error) std::rethrow_exception(std::exchange(m_error, nullptr));
  m_exposed_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GradSync::reduce(size_t b) {
  const float scale = 1.0f / static_cast<float>(m_comm.size());
  Bucket& bucket = m_buckets[b];
  float* flat = bucket.flat.data();
  for (Param* p : bucket.params) {
    std::memcpy(flat, p->grad.data<float>(), static_cast<size_t>(p->grad.numel()) * sizeof(float));
    flat += p->grad.numel();
  }
  if (m_scatter) {
    scatter_back(bucket, scale);
    return;
  }
  m_comm.allreduce_sum(bucket.flat.data(), bucket.flat.size(), "the gradients");
  flat = bucket.flat.data();
  for (Param* p : bucket.params) {
    float* g = p->grad.data<float>();
    for (int64_t k = 0; k < p->grad.numel(); ++k) g[k] = flat[k] * scale;
    flat += p->grad.numel();
  }
}

void GradSync::scatter_back(Bucket& bucket, float scale) {
  const size_t chunk = bucket.chunk.size(), begin = chunk * static_cast<size_t>(m_comm.rank()), end = begin + chunk;
  m_comm.reduce_scatter_sum(bucket.flat.data(), bucket.chunk.data(), chunk, "the gradients");
  // Only the elements of this rank's chunk are averaged; each parameter overlapping it takes its part.
  size_t offset = 0;
  for (Param* p : bucket.params) {
    const auto n = static_cast<size_t>(p->grad.numel());
    const size_t lo = std::max(offset, begin), hi = std::min(offset + n, end);
    float* g = p->grad.data<float>();
    for (size_t k = lo; k < hi; ++k) g[k - offset] = bucket.chunk[k - begin] * scale;
    offset += n;
  }
}

void GradSync::launch_device(size_t b) {
  // The copies queue on the compute stream behind the backward kernels that wrote the gradients; the side stream
  // starts the all-reduce once they are done, while the compute stream goes on with the backward pass.
  Bucket& bucket = m_buckets[b];
  int64_t offset = 0;
  for (Param* p : bucket.params) {
    bucket.device_flat.slice0(offset, p->grad.numel()).copy_from(p->grad);  // copy_from matches by element count
    offset += p->grad.numel();
  }
  m_side->wait_for_compute();
  m_comm.set_stream(m_side->handle());
  m_comm.allreduce_sum(bucket.device_flat.data<float>(), static_cast<size_t>(bucket.device_flat.numel()),
                       "the gradients");
  m_comm.set_stream(nullptr);
  ++m_launched;
}

void GradSync::finish_device() {
  if (!m_overlap)
    for (size_t b = 0; b < m_buckets.size(); ++b) launch_device(b);
  GT_CHECK(m_launched == m_buckets.size(), "{} of {} gradient buckets were complete after backward", m_launched,
           m_buckets.size());
  m_launched = 0;
  // From here the compute stream (the optimizer step) runs after every bucket's all-reduce; the host goes on.
  if (m_side) m_side->join_compute();
  for (Bucket& bucket : m_buckets) {
    ops::scale_by(bucket.device_flat, m_scale);
    int64_t offset = 0;
    for (Param* p : bucket.params) {
      p->grad.copy_from(bucket.device_flat.slice0(offset, p->grad.numel()));
      offset += p->grad.numel();
    }
  }
}

void GradSync::worker() {
  for (;;) {
    size_t b = 0;
    {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_cv.wait(lock, [this] { return m_stop || !m_queue.empty(); });
      if (m_queue.empty()) return;
      b = m_queue.front();
      m_queue.pop_front();
    }
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
