// The one-rank communicator, and the choice of communicator for builds without MPI.
#include "core/error.h"
#include "dist/comm.h"

namespace gt {
namespace {

class LocalComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }
  void allreduce_sum(float*, size_t, const char*) override {}
  void allreduce_sum(double*, size_t, const char*) override {}
  void broadcast(void*, size_t, int, const char*) override {}
  void abort(int) override {}
};

}  // namespace

std::unique_ptr<Communicator> make_local_comm() { return std::make_unique<LocalComm>(); }

#ifndef GT_WITH_MPI
bool mpi_available() { return false; }
std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double) {
  if (launch.world == 1) return make_local_comm();
  throw Error(fmt::format("{} started {} ranks, but this gputrain was built without MPI (install libopenmpi-dev and "
                          "rebuild)",
                          launch.launcher, launch.world));
}
#endif

}  // namespace gt
