// The MPI communicator. Collectives are started non-blocking and polled, so that a rank that died or hangs turns
// into a time-out with a message (and exit 3) instead of a silent hang; MPI_Abort then ends the other ranks.
#include "core/error.h"
#include "dist/comm.h"
#include "log/logging.h"

// The C API only: Open MPI and MPICH would otherwise pull in their deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace gt {
namespace {

class MpiComm final : public Communicator {
 public:
  MpiComm(const LaunchInfo& launch, double timeout_s) : m_timeout(timeout_s) {
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
    if (m_rank != launch.rank || m_size != launch.world)
      throw Error(fmt::format("MPI says rank {} of {}, but the launcher's variables say rank {} of {} ({}): was "
                              "gputrain started by {} without MPI?",
                              m_rank, m_size, launch.rank, launch.world, launch.source, launch.launcher));
  }
  // Reached on success only: a failing rank calls abort() instead, since MPI_Finalize waits for the other ranks.
  ~MpiComm() override {
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
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
    wait(req, "allreduce", what);
  }
  void allreduce_sum(double* data, size_t n, const char* what) override {
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &req);
    wait(req, "allreduce", what);
  }
  void broadcast(void* data, size_t bytes, int root, const char* what) override {
    MPI_Request req;
    MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req);
    wait(req, "broadcast", what);
  }

 private:
  // Polls until done: spinning briefly (collectives are usually quick), then sleeping 50 µs between polls so a
  // waiting rank leaves the cores to the others.
  void wait(MPI_Request& req, const char* op, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      if (polls > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if ((polls & 255) == 0 &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > m_timeout) {
        const std::string others =
            m_size == 2 ? fmt::format("rank {}", 1 - m_rank) : fmt::format("one of the other {} ranks", m_size - 1);
        spdlog::error("rank {}: no answer for {:.0f} s in {} of {}: {} failed or stopped responding (dist.timeout_s)",
                      m_rank, m_timeout, op, what, others);
        spdlog::default_logger()->flush();
        MPI_Abort(MPI_COMM_WORLD, 3);
        ::_exit(3);
      }
    }
  }

  int m_rank = 0, m_size = 1;
  double m_timeout;
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double timeout_s) {
  if (launch.world == 1) return make_local_comm();
  if (launch.launcher == "torchrun")
    throw Error("torchrun started this rank, but gputrain's CPU collectives need MPI: launch with mpirun or srun "
                "(torchrun works once the NCCL path trains on GPUs)");
  return std::make_unique<MpiComm>(launch, timeout_s);
}

}  // namespace gt
