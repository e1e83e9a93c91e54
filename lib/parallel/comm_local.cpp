// The one-rank communicator, and the choice of communicator for a launch.
#include "core/error.h"
#include "parallel/comm.h"

#include <cstring>

namespace gt {
namespace {

class LocalComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }
  void allreduce_sum(float*, size_t, const char*) override {}
  void allreduce_sum(double*, size_t, const char*) override {}
  void allgather(const float* send, float* recv, size_t n, const char*) override { copy(send, recv, n); }
  void allgather(const double* send, double* recv, size_t n, const char*) override { copy(send, recv, n); }
  void reduce_scatter_sum(const float* send, float* recv, size_t n, const char*) override { copy(send, recv, n); }
  void reduce_scatter_sum(const double* send, double* recv, size_t n, const char*) override { copy(send, recv, n); }
  void broadcast(void*, size_t, int, const char*) override {}
  void abort(int) override {}

 private:
  template <class T>
  static void copy(const T* send, T* recv, size_t n) {
    if (n > 0) std::memcpy(recv, send, n * sizeof(T));
  }
};

}  // namespace

std::unique_ptr<Communicator> make_local_comm() { return std::make_unique<LocalComm>(); }

std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double timeout_s) {
  if (launch.world == 1) return make_local_comm();
  // torchrun sets no MPI variables, and a Slurm step without PMI/PMIx gives Open MPI nothing to join: MPI_Init
  // would make a world of one, so their ranks meet over TCP instead.
  if (launch.tcp) return make_tcp_comm(launch, timeout_s);
  return make_mpi_comm(launch, timeout_s);
}

#ifndef GT_WITH_CUDA
std::unique_ptr<Communicator> make_nccl_comm(Communicator&, int, double) {
  throw Error(
      "this gputrain was built without the CUDA backend, so without NCCL: multi-process training on GPUs "
      "needs a build with CUDA (and libnccl-dev)");
}
#endif

#ifndef GT_WITH_MPI
bool mpi_available() { return false; }
std::unique_ptr<Communicator> make_mpi_comm(const LaunchInfo& launch, double) {
  throw Error(ErrorKind::distributed,
              fmt::format("{}, but this gputrain was built without MPI (install libopenmpi-dev and rebuild, or "
                          "launch with torchrun, which needs no MPI)",
                          launch_claim(launch)));
}
#endif

}  // namespace gt
