// Collectives between the ranks of a data-parallel run, behind one interface: local (one rank), MPI (the CPU
// collectives, Open MPI from Debian), TCP (CPU collectives under torchrun, no MPI needed) and NCCL (GPU buffers). Every call names what it is for, so a time-out can say where it waited.
#pragma once

#include "dist/launch.h"

#include <cstddef>
#include <memory>
#include <string>

namespace gt {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  /// Sums `n` values over all ranks, in place. Every rank must call it with the same n, in the same order.
  virtual void allreduce_sum(float* data, size_t n, const char* what) = 0;
  virtual void allreduce_sum(double* data, size_t n, const char* what) = 0;
  /// Copies `bytes` from `root` to every other rank.
  virtual void broadcast(void* data, size_t bytes, int root, const char* what) = 0;
  /// After a failure on this rank: ends every rank at once with `exit_code` (the others may be waiting in a
  /// collective that this rank will never reach). Returns only for a single rank.
  virtual void abort(int exit_code) = 0;
};

/// One rank: every collective is the identity.
std::unique_ptr<Communicator> make_local_comm();

/// The communicator for this launch: local for one rank, TCP under torchrun, MPI otherwise. A rank that does not
/// answer within `timeout_s` makes the others fail with exit 3, naming the collective they waited in. Throws gt::Error
/// when the launch needs MPI and this build has none.
std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double timeout_s);

/// MPI over MPI_COMM_WORLD; throws gt::Error in builds without MPI.
std::unique_ptr<Communicator> make_mpi_comm(const LaunchInfo& launch, double timeout_s);

/// TCP through rank 0 at launch.master_addr : launch.master_port + kTcpPortOffset (tcp_store.h), for any launcher
/// that sets MASTER_ADDR and MASTER_PORT. Every rank connects within `timeout_s` or the rendezvous throws (exit 3).
std::unique_ptr<Communicator> make_tcp_comm(const LaunchInfo& launch, double timeout_s);

/// Whether this build has the MPI communicator.
bool mpi_available();

}  // namespace gt
