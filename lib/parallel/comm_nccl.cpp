// The NCCL communicator: collectives on device buffers, queued on a CUDA stream. Rank 0 of a bootstrap communicator
// (MPI, TCP or threads) makes the NCCL id and broadcasts it. NCCL calls return before the data moves, so a watchdog
// thread follows each collective through an event recorded after it: one that is not done within dist.timeout_s, or
// an error NCCL reports, makes it log which collective it waited in, abort the NCCL communicator (its kernels stop
// spinning) and end the run through the bootstrap, exit 3.
#include "core/error.h"
#include "parallel/comm.h"
#include "log/logging.h"
#include "ops/cuda_context.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

// Every NCCL call is checked: a failure names the call, file:line and NCCL's own message.
#define GT_CHECK_NCCL(call)                                                                                            \
  do {                                                                                                                 \
    const ncclResult_t gt_nccl_ = (call);                                                                              \
    if (gt_nccl_ != ncclSuccess)                                                                                       \
      throw ::gt::Error(::gt::ErrorKind::distributed, ::fmt::format("{}:{}: {} failed: {}", __FILE__, __LINE__, #call, \
                                                                    ncclGetErrorString(gt_nccl_)));                    \
  } while (0)

namespace gt {
namespace {

class NcclComm final : public Communicator {
 public:
  NcclComm(Communicator& bootstrap, int device, double timeout_s)
      : m_bootstrap(bootstrap),
        m_rank(bootstrap.rank()),
        m_size(bootstrap.size()),
        m_device(device),
        m_timeout(timeout_s) {
    ncclUniqueId id{};
    if (m_rank == 0) GT_CHECK_NCCL(ncclGetUniqueId(&id));
    m_bootstrap.broadcast(&id, sizeof id, 0, "the NCCL id");
    GT_CHECK_CUDA(cudaSetDevice(m_device));
    m_stream = static_cast<cudaStream_t>(cuda::compute_stream(m_device));
    m_watchdog = std::thread([this] { watchdog(); });
    {
      // ncclCommInitRank blocks until every rank has joined: the watchdog keeps its deadline too.
      const Watch w(*this, "the NCCL set-up", "all ranks joining");
      ncclComm_t comm = nullptr;
      const ncclResult_t r = ncclCommInitRank(&comm, m_size, id, m_rank);
      {
        std::lock_guard<std::mutex> lock(m_mutex);  // the watchdog reads it
        m_comm = comm;
      }
      if (r != ncclSuccess) {
        stop_watchdog();
        throw Error(ErrorKind::distributed, fmt::format("rank {}: NCCL could not set up the communicator on "
                                                        "cuda:{}: {}",
                                                        m_rank, m_device, ncclGetErrorString(r)));
      }
    }
  }
  // Reached on success only (a failing rank calls abort): the queued collectives finish before the comm goes.
  ~NcclComm() override {
    if (cudaSetDevice(m_device) == cudaSuccess) cudaStreamSynchronize(m_stream);
    stop_watchdog();
    for (const Pending& p : m_pending) cudaEventDestroy(p.done);
    if (m_comm) ncclCommDestroy(m_comm);
  }

  int rank() const override { return m_rank; }
  int size() const override { return m_size; }
  std::string name() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  void set_stream(void* stream) override {
    m_stream = static_cast<cudaStream_t>(stream ? stream : cuda::compute_stream(m_device));
  }

  void allreduce_sum(float* data, size_t n, const char* what) override {
    queued("allreduce", what, [&] { return ncclAllReduce(data, data, n, ncclFloat32, ncclSum, m_comm, m_stream); });
  }
  void allreduce_sum(double* data, size_t n, const char* what) override {
    queued("allreduce", what, [&] { return ncclAllReduce(data, data, n, ncclFloat64, ncclSum, m_comm, m_stream); });
  }
  void allgather(const float* send, float* recv, size_t n, const char* what) override {
    queued("allgather", what, [&] { return ncclAllGather(send, recv, n, ncclFloat32, m_comm, m_stream); });
  }
  void allgather(const double* send, double* recv, size_t n, const char* what) override {
    queued("allgather", what, [&] { return ncclAllGather(send, recv, n, ncclFloat64, m_comm, m_stream); });
  }
  void reduce_scatter_sum(const float* send, float* recv, size_t n, const char* what) override {
    queued("reduce-scatter", what,
           [&] { return ncclReduceScatter(send, recv, n, ncclFloat32, ncclSum, m_comm, m_stream); });
  }
  void reduce_scatter_sum(const double* send, double* recv, size_t n, const char* what) override {
    queued("reduce-scatter", what,
           [&] { return ncclReduceScatter(send, recv, n, ncclFloat64, ncclSum, m_comm, m_stream); });
  }
  void broadcast(void* data, size_t bytes, int root, const char* what) override {
    queued("broadcast", what, [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, m_comm, m_stream); });
  }

  void abort(int exit_code) override {
    spdlog::default_logger()->flush();
    // Stops this rank's NCCL kernels; the bootstrap (MPI_Abort, or closed sockets) ends the other ranks at once
    // instead of leaving them to their own timeouts.
    if (m_comm) ncclCommAbort(m_comm);
    m_bootstrap.abort(exit_code);
    ::_exit(exit_code);
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Pending {
    cudaEvent_t done;  ///< nullptr: a blocking call in progress on the host (the set-up)
    const char* op;
    const char* what;
    Clock::time_point since;
  };
  // A host call that blocks (the set-up): listed while it runs.
  struct Watch {
    Watch(NcclComm& c, const char* op, const char* what) : comm(c) {
      std::lock_guard<std::mutex> lock(comm.m_mutex);
      comm.m_pending.push_back({nullptr, op, what, Clock::now()});
    }
    ~Watch() {
      std::lock_guard<std::mutex> lock(comm.m_mutex);
      for (auto it = comm.m_pending.begin(); it != comm.m_pending.end(); ++it)
        if (!it->done) {
          comm.m_pending.erase(it);
          break;
        }
    }
    NcclComm& comm;
  };

  // Queues one collective and an event after it, for the watchdog.
  template <typename Call>
  void queued(const char* op, const char* what, Call call) {
    GT_CHECK_CUDA(cudaSetDevice(m_device));
    const ncclResult_t r = call();
    if (r != ncclSuccess) fail(op, what, fmt::format("NCCL: {}", ncclGetErrorString(r)));
    cudaEvent_t done = nullptr;
    GT_CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    GT_CHECK_CUDA(cudaEventRecord(done, m_stream));
    std::lock_guard<std::mutex> lock(m_mutex);
    m_pending.push_back({done, op, what, Clock::now()});
  }

  void watchdog() {
    cudaSetDevice(m_device);
    std::unique_lock<std::mutex> lock(m_mutex);
    while (!m_quit) {
      m_cv.wait_for(lock, std::chrono::milliseconds(100));
      // Collectives complete in the order they were queued on one stream; with two streams (GradSync's and the
      // compute stream) any of them may be done first.
      for (auto it = m_pending.begin(); it != m_pending.end();) {
        if (it->done && cudaEventQuery(it->done) == cudaSuccess) {
          cudaEventDestroy(it->done);
          it = m_pending.erase(it);
        } else {
          ++it;
        }
      }
      if (m_comm) {
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(m_comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress &&
            !m_pending.empty()) {
          const Pending p = m_pending.front();
          lock.unlock();
          fail(p.op, p.what, fmt::format("NCCL: {}", ncclGetErrorString(async)));
        }
      }
      for (const Pending& p : m_pending) {
        if (std::chrono::duration<double>(Clock::now() - p.since).count() <= m_timeout) continue;
        spdlog::error(no_answer_message(m_rank, m_timeout, p.op, p.what, silent_ranks(m_rank, m_size)));
        lock.unlock();
        abort(3);
      }
    }
  }

  [[noreturn]] void fail(const char* op, const char* what, const std::string& why) {
    spdlog::error("rank {}: {} of {} failed on cuda:{}: {}", m_rank, op, what, m_device, why);
    abort(3);
    ::_exit(3);
  }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_quit = true;
    }
    m_cv.notify_all();
    if (m_watchdog.joinable()) m_watchdog.join();
  }

  Communicator& m_bootstrap;
  int m_rank, m_size, m_device;
  double m_timeout;
  ncclComm_t m_comm = nullptr;
  cudaStream_t m_stream = nullptr;
  std::mutex m_mutex;
  std::condition_variable m_cv;
  std::deque<Pending> m_pending;  ///< collectives queued and not yet seen done, oldest first
  bool m_quit = false;
  std::thread m_watchdog;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_comm(Communicator& bootstrap, int cuda_device, double timeout_s) {
  return std::make_unique<NcclComm>(bootstrap, cuda_device, timeout_s);
}

}  // namespace gt
