// Collectives between the ranks of a data-parallel run, behind one interface: local (one rank) and MPI (the CPU
// collectives, Open MPI from Debian). Every call names what it is for, so a time-out can say where it waited.
#pragma once

#include "core/error.h"
#include "dist/launch.h"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace gt {

/// What a collective throws on a worker thread when another worker of the process failed: the other failure is
/// the one to report.
class PeerFailure : public Error {
 public:
  explicit PeerFailure(const std::string& message) : Error(ErrorKind::distributed, message) {}
};

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

/// The communicator for this launch: local for one rank, MPI otherwise. A rank that does not answer within
/// `timeout_s` makes the others fail with exit 3, naming the collective they waited in. Throws gt::Error when the
/// launch needs MPI and this build has none.
std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double timeout_s);

/// `n` communicators for the worker threads of one process (`device: [0, 1, …]`: one worker per device), meeting in
/// shared memory. A worker that fails calls abort(): the collectives of the others then throw ErrorKind::distributed
/// naming it. A collective that waits longer than `timeout_s` throws, naming the ranks that did not arrive.
std::vector<std::unique_ptr<Communicator>> make_thread_comms(int n, double timeout_s);

/// Whether this build has the MPI communicator.
bool mpi_available();

}  // namespace gt
