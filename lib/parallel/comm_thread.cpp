// Collectives between the worker threads of one process (`device: [0, 1, …]`): they meet in shared memory at a
// barrier. Sums are taken in rank order by every rank alike, so every replica gets bit-identical results, and the
// same ones whatever the thread timing.
#include "core/error.h"
#include "parallel/comm.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

namespace gt {
namespace {

// What the workers share: a reusable barrier that knows who has not arrived, the pointers published for the current
// collective, and one scratch buffer for the reduced values.
class ThreadGroup {
 public:
  ThreadGroup(int n, double timeout_s)
      : m_n(n), m_timeout(timeout_s), m_ptrs(static_cast<size_t>(n)), m_arrived(static_cast<size_t>(n), false) {}

  int size() const { return m_n; }

  /// Waits until every rank has arrived. Throws when a rank failed (abort) or the wait outlives the time-out.
  void barrier(int rank, const char* op, const char* what) {
    std::unique_lock<std::mutex> lock(m_mutex);
    check_failed(rank, op, what);
    const uint64_t gen = m_generation;
    m_arrived[static_cast<size_t>(rank)] = true;
    if (++m_count == m_n) {
      m_count = 0;
      std::fill(m_arrived.begin(), m_arrived.end(), false);
      ++m_generation;
      m_cv.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(m_timeout);
    while (m_generation == gen) {
      check_failed(rank, op, what);
      if (m_cv.wait_until(lock, deadline) == std::cv_status::timeout && m_generation == gen) {
        std::string missing;
        for (int r = 0; r < m_n; ++r)
          if (!m_arrived[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        // The others must not wait for this one either.
        m_failed = rank;
        m_cv.notify_all();
        throw Error(ErrorKind::distributed, no_answer_message(rank, m_timeout, op, what, "rank " + missing));
      }
    }
  }

  void abort(int rank) {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (m_failed < 0) m_failed = rank;
    m_cv.notify_all();
  }

  void publish(int rank, void* p) { m_ptrs[static_cast<size_t>(rank)] = p; }
  void* ptr(int rank) const { return m_ptrs[static_cast<size_t>(rank)]; }
  /// The scratch buffer; every rank asks for the same size between two barriers, the first one resizes it.
  template <class T>
  T* scratch(size_t n) {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (m_scratch.size() < n * sizeof(T)) m_scratch.resize(n * sizeof(T));
    return reinterpret_cast<T*>(m_scratch.data());
  }

 private:
  void check_failed(int rank, const char* op, const char* what) const {
    if (m_failed >= 0 && m_failed != rank)
      throw PeerFailure(fmt::format("rank {}: stopped waiting in {} of {}: rank {} failed", rank, op, what, m_failed));
  }

  const int m_n;
  const double m_timeout;
  std::mutex m_mutex;
  std::condition_variable m_cv;
  std::vector<void*> m_ptrs;
  std::vector<bool> m_arrived;
  std::vector<unsigned char> m_scratch;  // 8-byte aligned by the allocator
  int m_count = 0, m_failed = -1;
  uint64_t m_generation = 0;
};

class ThreadComm final : public TypedCommunicator<ThreadComm> {
 public:
  ThreadComm(std::shared_ptr<ThreadGroup> group, int rank) : m_group(std::move(group)), m_rank(rank) {}
  int rank() const override { return m_rank; }
  int size() const override { return m_group->size(); }
  std::string name() const override { return "threads"; }
  void broadcast(void* data, size_t bytes, int root, const char* what) override {
    ThreadGroup& g = *m_group;
    g.publish(m_rank, data);
    g.barrier(m_rank, "broadcast", what);
    if (m_rank != root && bytes > 0) std::memcpy(data, g.ptr(root), bytes);
    g.barrier(m_rank, "broadcast", what);  // the root's buffer stays untouched until every copy is done
  }
  // The process goes on (the other workers' collectives throw): the caller reports the failure.
  void abort(int) override { m_group->abort(m_rank); }

 private:
  friend class TypedCommunicator<ThreadComm>;

  // Each rank sums its slice of the vector over all ranks (in rank order) into the scratch buffer, then every rank
  // copies the whole result: the work is split, the order of additions is fixed.
  template <class T>
  void allreduce(T* data, size_t n, const char* what) {
    ThreadGroup& g = *m_group;
    const auto world = static_cast<size_t>(g.size());
    T* sum = g.scratch<T>(n);
    g.publish(m_rank, data);
    g.barrier(m_rank, "allreduce", what);
    const size_t begin = n * static_cast<size_t>(m_rank) / world, end = n * static_cast<size_t>(m_rank + 1) / world;
    for (size_t k = begin; k < end; ++k) {
      T s = static_cast<const T*>(g.ptr(0))[k];
      for (size_t r = 1; r < world; ++r) s += static_cast<const T*>(g.ptr(static_cast<int>(r)))[k];
      sum[k] = s;
    }
    g.barrier(m_rank, "allreduce", what);
    std::memcpy(data, sum, n * sizeof(T));
    g.barrier(m_rank, "allreduce", what);  // the scratch buffer is free again
  }

  // Every rank copies every rank's chunk straight from its buffer: no scratch needed.
  template <class T>
  void gather(const T* send, T* recv, size_t n, const char* what) {
    ThreadGroup& g = *m_group;
    g.publish(m_rank, const_cast<T*>(send));
    g.barrier(m_rank, "allgather", what);
    for (int r = 0; r < g.size(); ++r)
      if (n > 0) std::memcpy(recv + static_cast<size_t>(r) * n, g.ptr(r), n * sizeof(T));
    g.barrier(m_rank, "allgather", what);  // every send buffer stays untouched until all copies are done
  }

  // Rank r sums chunk r over all ranks in rank order, as allreduce() sums each element: the same bits as allreduce_sum.
  template <class T>
  void reduce_scatter(const T* send, T* recv, size_t n, const char* what) {
    ThreadGroup& g = *m_group;
    g.publish(m_rank, const_cast<T*>(send));
    g.barrier(m_rank, "reduce-scatter", what);
    const size_t base = static_cast<size_t>(m_rank) * n;
    for (size_t k = 0; k < n; ++k) {
      T s = static_cast<const T*>(g.ptr(0))[base + k];
      for (int r = 1; r < g.size(); ++r) s += static_cast<const T*>(g.ptr(r))[base + k];
      recv[k] = s;
    }
    g.barrier(m_rank, "reduce-scatter", what);
  }

  std::shared_ptr<ThreadGroup> m_group;
  int m_rank;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_comms(int n, double timeout_s) {
  GT_CHECK(n >= 1, "{} worker threads", n);
  auto group = std::make_shared<ThreadGroup>(n, timeout_s);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<ThreadComm>(group, r));
  return comms;
}

}  // namespace gt
