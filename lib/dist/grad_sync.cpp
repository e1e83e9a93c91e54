// Bucketed gradient averaging on a communication thread.
#include "dist/grad_sync.h"

#include "core/error.h"
#include "profile/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <utility>

namespace gt {
namespace {
const std::string kAllReduce = "all-reduce", kWaitType = "after backward";
std::string bucket_name(size_t b) { return "bucket " + std::to_string(b); }
}  // namespace

GradSync::GradSync(Communicator& comm, const std::vector<std::vector<Param*>>& params_by_node, double bucket_mb,
                   bool overlap)
    : m_comm(comm), m_bucket_of_node(params_by_node.size(), -1), m_overlap(overlap) {
  // Like DDP, the first bucket (the last layers, done first) is capped at 1 MB so that communication starts early
  // even when the whole model would fit one bucket.
  const auto limit = static_cast<size_t>(bucket_mb * 1e6 / sizeof(float));
  const auto first_limit = std::min(limit, static_cast<size_t>(1e6 / sizeof(float)));
  size_t fill = 0;
  for (size_t i = params_by_node.size(); i-- > 0;) {  // the order backward finishes them
    if (params_by_node[i].empty()) continue;
    size_t n = 0;
    for (Param* p : params_by_node[i]) {
      GT_CHECK(p->grad.dtype() == DType::f32 && p->grad.device().is_cpu(), "gradient sync covers f32 CPU gradients");
      n += static_cast<size_t>(p->grad.numel());
    }
    // A node's parameters share a bucket; a node that would take a bucket past its size starts the next one.
    if (m_buckets.empty() || (fill > 0 && fill + n > (m_buckets.size() == 1 ? first_limit : limit))) {
      m_buckets.emplace_back();
      fill = 0;
    }
    Bucket& b = m_buckets.back();
    for (Param* p : params_by_node[i]) b.params.push_back(p);
    ++b.nodes;
    fill += n;
    m_bucket_of_node[i] = static_cast<int>(m_buckets.size() - 1);
  }
  for (Bucket& b : m_buckets) {
    size_t n = 0;
    for (Param* p : b.params) n += static_cast<size_t>(p->grad.numel());
    b.flat.resize(n);
    m_bytes += static_cast<int64_t>(n * sizeof(float));
  }
  if (m_overlap) m_thread = std::thread([this] { worker(); });
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
  m_comm.allreduce_sum(bucket.flat.data(), bucket.flat.size(), "the gradients");
  flat = bucket.flat.data();
  for (Param* p : bucket.params) {
    float* g = p->grad.data<float>();
    for (int64_t k = 0; k < p->grad.numel(); ++k) g[k] = flat[k] * scale;
    flat += p->grad.numel();
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
