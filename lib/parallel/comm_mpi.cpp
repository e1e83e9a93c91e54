// The MPI communicator. A watchdog thread turns a collective that outlives dist.timeout_s (a rank died or hangs)
// into a message and exit 3 instead of a silent hang; MPI_Abort then ends the other ranks.
#include "core/error.h"
#include "parallel/comm.h"
#include "log/logging.h"

// The C API only: Open MPI and MPICH would otherwise pull in their deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace gt {
namespace {

class MpiComm final : public Communicator {
 public:
  MpiComm(const LaunchInfo& launch, double timeout_s) : m_timeout(timeout_s) {
    // The process manager's variables as the launcher left them: a singleton MPI_Init sets PMIX_NAMESPACE itself.
    std::map<std::string, std::string> before;
    for (const char* name : {"PMIX_NAMESPACE", "PMI_FD", "PMI_PORT"})
      if (const char* v = std::getenv(name)) before[name] = v;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // The gradient thread and the training loop both call MPI (never at the same time: SERIALIZED would do, but
      // MULTIPLE costs nothing extra in Open MPI's shared-memory transport).
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      if (provided < MPI_THREAD_SERIALIZED) throw Error("MPI: the library cannot be called from a second thread");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &m_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &m_size);
    // Launcher variables without the launcher's process manager (copied by hand, srun without --mpi=pmix): MPI
    // made a world of this process alone, and the run cannot work.
    if (m_rank != launch.rank || m_size != launch.world)
      throw Error(ErrorKind::distributed, mpi_launch_problem(launch, m_rank, m_size, [&before](const char* name) {
                    const auto it = before.find(name);
                    return it == before.end() ? nullptr : it->second.c_str();
                  }));
    m_watchdog = std::thread([this] { watchdog(); });
  }
  // Reached on success only: a failing rank calls abort() instead, since MPI_Finalize waits for the other ranks.
  ~MpiComm() override {
    {
      std::lock_guard<std::mutex> lock(m_watch_mutex);
      m_quit = true;
    }
    m_watch_cv.notify_all();
    m_watchdog.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  void abort(int exit_code) override {
    spdlog::default_logger()->flush();
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    ::_exit(exit_code);
  }

  int rank() const override { return m_rank; }
  int size() const override { return m_size; }
  std::string name() const override { return "mpi"; }

  void allreduce_sum(float* data, size_t n, const char* what) override {
    const Watch w(*this, "allreduce", what);
    MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  void allreduce_sum(double* data, size_t n, const char* what) override {
    const Watch w(*this, "allreduce", what);
    MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  }
  void allgather(const float* send, float* recv, size_t n, const char* what) override {
    const Watch w(*this, "allgather", what);
    MPI_Allgather(send, static_cast<int>(n), MPI_FLOAT, recv, static_cast<int>(n), MPI_FLOAT, MPI_COMM_WORLD);
  }
  void allgather(const double* send, double* recv, size_t n, const char* what) override {
    const Watch w(*this, "allgather", what);
    MPI_Allgather(send, static_cast<int>(n), MPI_DOUBLE, recv, static_cast<int>(n), MPI_DOUBLE, MPI_COMM_WORLD);
  }
  void reduce_scatter_sum(const float* send, float* recv, size_t n, const char* what) override {
    const Watch w(*this, "reduce-scatter", what);
    MPI_Reduce_scatter_block(send, recv, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  void reduce_scatter_sum(const double* send, double* recv, size_t n, const char* what) override {
    const Watch w(*this, "reduce-scatter", what);
    MPI_Reduce_scatter_block(send, recv, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  }
  void broadcast(void* data, size_t bytes, int root, const char* what) override {
    const Watch w(*this, "broadcast", what);
    MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
  }

 private:
  using Clock = std::chrono::steady_clock;

  // Marks this thread as inside a collective for the watchdog. Blocking collectives are several times faster than
  // polled non-blocking ones in Open MPI's shared-memory transport, so the deadline is kept by a second thread.
  struct Watch {
    Watch(MpiComm& c, const char* op, const char* what) : comm(c) {
      std::lock_guard<std::mutex> lock(comm.m_watch_mutex);
      comm.m_waits.push_back({op, what, Clock::now()});
    }
    ~Watch() {
      std::lock_guard<std::mutex> lock(comm.m_watch_mutex);
      comm.m_waits.pop_back();
    }
    MpiComm& comm;
  };
  struct Wait {
    const char* op;
    const char* what;
    Clock::time_point since;
  };

  void watchdog() {
    std::unique_lock<std::mutex> lock(m_watch_mutex);
    while (!m_quit) {
      m_watch_cv.wait_for(lock, std::chrono::milliseconds(100));
      for (const Wait& w : m_waits) {
        if (std::chrono::duration<double>(Clock::now() - w.since).count() <= m_timeout) continue;
        spdlog::error(no_answer_message(m_rank, m_timeout, w.op, w.what, silent_ranks(m_rank, m_size)));
        spdlog::default_logger()->flush();
        MPI_Abort(MPI_COMM_WORLD, 3);
        ::_exit(3);
      }
    }
  }

  std::mutex m_watch_mutex;
  std::condition_variable m_watch_cv;
  std::vector<Wait> m_waits;  ///< the collectives in progress (training loop and gradient thread)
  bool m_quit = false;
  std::thread m_watchdog;
  int m_rank = 0, m_size = 1;
  double m_timeout;
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> make_mpi_comm(const LaunchInfo& launch, double timeout_s) {
  return std::make_unique<MpiComm>(launch, timeout_s);
}

}  // namespace gt
