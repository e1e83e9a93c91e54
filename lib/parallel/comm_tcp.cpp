// The TCP communicator, for launchers without MPI (torchrun): a star through rank 0 over the sockets of the
// rendezvous. Rank 0 adds the other ranks' buffers to its own in rank order and sends the one result back, so every
// rank gets the same bits and a rerun gets them again. A peer that stops answering (dist.timeout_s) or whose
// connection ends makes this rank log which rank it waited for and exit 3; closing its own sockets then ends the
// ranks that wait on it in turn.
#include "core/error.h"
#include "log/logging.h"
#include "parallel/comm.h"
#include "parallel/tcp_store.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <vector>

namespace gt {
namespace {

class TcpComm final : public TypedCommunicator<TcpComm> {
 public:
  TcpComm(const LaunchInfo& launch, double timeout_s)
      : m_rank(launch.rank), m_size(launch.world), m_timeout(timeout_s) {
    if (launch.master_addr.empty() || launch.master_port <= 0)
      throw Error(ErrorKind::distributed,
                  fmt::format("{} started rank {} of {} without MASTER_ADDR and MASTER_PORT: the TCP rendezvous needs "
                              "both",
                              launch.launcher, launch.rank, launch.world));
    m_fds = tcp_rendezvous(launch.master_addr, launch.master_port + kTcpPortOffset, m_rank, m_size, timeout_s);
  }
  ~TcpComm() override { tcp_close_all(m_fds); }

  int rank() const override { return m_rank; }
  int size() const override { return m_size; }
  std::string name() const override { return "tcp"; }

  void broadcast(void* data, size_t bytes, int root, const char* what) override {
    const std::lock_guard<std::mutex> lock(m_mutex);
    if (m_rank == 0) {
      if (root != 0) recv(root, data, bytes, "broadcast", what);
      for (int r = 1; r < m_size; ++r)
        if (r != root) send(r, data, bytes, "broadcast", what);
    } else if (m_rank == root) {
      send(0, data, bytes, "broadcast", what);
    } else {
      recv(0, data, bytes, "broadcast", what);
    }
  }

  void abort(int exit_code) override {
    spdlog::default_logger()->flush();
    // The ranks waiting on this one see their connection end and exit 3 in turn.
    tcp_close_all(m_fds);
    ::_exit(exit_code);
  }

 private:
  friend class TypedCommunicator<TcpComm>;

  template <typename T>
  void allreduce(T* data, size_t n, const char* what) {
    const std::lock_guard<std::mutex> lock(m_mutex);
    const size_t bytes = n * sizeof(T);
    if (m_rank != 0) {
      send(0, data, bytes, "allreduce", what);
      recv(0, data, bytes, "allreduce", what);
      return;
    }
    m_scratch.resize(bytes);
    auto* other = reinterpret_cast<T*>(m_scratch.data());
    for (int r = 1; r < m_size; ++r) {  // rank order: the same sum on every run
      recv(r, other, bytes, "allreduce", what);
      for (size_t k = 0; k < n; ++k) data[k] += other[k];
    }
    for (int r = 1; r < m_size; ++r) send(r, data, bytes, "allreduce", what);
  }

  // Rank 0 collects every chunk in rank order and sends the whole result to each rank.
  template <typename T>
  void gather(const T* send, T* recv, size_t n, const char* what) {
    const std::lock_guard<std::mutex> lock(m_mutex);
    const size_t bytes = n * sizeof(T), all = bytes * static_cast<size_t>(m_size);
    if (m_rank != 0) {
      this->send(0, send, bytes, "allgather", what);
      this->recv(0, recv, all, "allgather", what);
      return;
    }
    if (n > 0) std::memcpy(recv, send, bytes);
    for (int r = 1; r < m_size; ++r) this->recv(r, recv + static_cast<size_t>(r) * n, bytes, "allgather", what);
    for (int r = 1; r < m_size; ++r) this->send(r, recv, all, "allgather", what);
  }

  // Rank 0 sums the whole buffers in rank order, as allreduce does (the same bits), and sends each rank its chunk.
  template <typename T>
  void reduce_scatter(const T* send, T* recv, size_t n, const char* what) {
    const std::lock_guard<std::mutex> lock(m_mutex);
    const size_t total = n * static_cast<size_t>(m_size), bytes = total * sizeof(T);
    if (m_rank != 0) {
      this->send(0, send, bytes, "reduce-scatter", what);
      this->recv(0, recv, n * sizeof(T), "reduce-scatter", what);
      return;
    }
    m_scratch.resize(2 * bytes);
    auto* sum = reinterpret_cast<T*>(m_scratch.data());
    auto* other = sum + total;
    if (total > 0) std::memcpy(sum, send, bytes);
    for (int r = 1; r < m_size; ++r) {
      this->recv(r, other, bytes, "reduce-scatter", what);
      for (size_t k = 0; k < total; ++k) sum[k] += other[k];
    }
    for (int r = 1; r < m_size; ++r)
      this->send(r, sum + static_cast<size_t>(r) * n, n * sizeof(T), "reduce-scatter", what);
    if (n > 0) std::memcpy(recv, sum, n * sizeof(T));
  }

  // The sockets index the peer rank: rank 0 holds one per rank, the others one to rank 0 (index 0).
  void send(int peer, const void* data, size_t bytes, const char* op, const char* what) {
    check(tcp_send(m_fds[static_cast<size_t>(peer)], data, bytes, wait_for(peer)), peer, op, what);
  }
  void recv(int peer, void* data, size_t bytes, const char* op, const char* what) {
    check(tcp_recv(m_fds[static_cast<size_t>(peer)], data, bytes, wait_for(peer)), peer, op, what);
  }
  // The other ranks give rank 0 two more seconds: when a third rank is stuck, rank 0 times out first and names it,
  // and they see rank 0 leave instead of blaming rank 0.
  double wait_for(int peer) const { return peer == 0 && m_size > 2 ? m_timeout + 2 : m_timeout; }

  // Called from the training loop and from GradSync's thread: logging and exiting here, rather than throwing, ends
  // the rank the same way from both (an exception would not leave the gradient thread).
  void check(TcpIo io, int peer, const char* op, const char* what) {
    if (io == TcpIo::ok) return;
    if (io == TcpIo::timed_out)
      spdlog::error(no_answer_message(m_rank, wait_for(peer), op, what, fmt::format("rank {}", peer)));
    else
      spdlog::error("rank {}: the connection to rank {} ended in {} of {}: rank {} failed or was stopped", m_rank, peer,
                    op, what, peer);
    abort(3);
  }

  int m_rank, m_size;
  double m_timeout;
  std::vector<int> m_fds;
  std::vector<char> m_scratch;  ///< rank 0: one other rank's buffer
  std::mutex m_mutex;           ///< one collective at a time (the training loop and the gradient thread share it)
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_comm(const LaunchInfo& launch, double timeout_s) {
  return std::make_unique<TcpComm>(launch, timeout_s);
}

}  // namespace gt
