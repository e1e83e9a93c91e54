// Collectives between the ranks of a data-parallel run, behind one interface: local (one rank), MPI (the CPU
// collectives, Open MPI from Debian), TCP (CPU collectives under torchrun, no MPI needed) and NCCL (GPU buffers).
// Every call names what it is for, so a time-out can say where it waited.
#pragma once

#include "core/error.h"
#include "parallel/launch.h"

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

/// What every communicator says when a collective waited in vain: "rank 2: no answer for 300 s in all-reduce of
/// gradients: rank 0 failed or stopped responding (dist.timeout_s)". `silent` names who: "rank 0", "ranks 1, 3", or
/// silent_ranks' words when the communicator cannot tell.
std::string no_answer_message(int rank, double seconds, const char* op, const std::string& what,
                              const std::string& silent);
/// The silent ranks as a rank of `size` names them without knowing which: "rank 1" of two, else "one of the other
/// n ranks".
std::string silent_ranks(int rank, int size);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  /// Sums `n` values over all ranks, in place. Every rank must call it with the same n, in the same order.
  virtual void allreduce_sum(float* data, size_t n, const char* what) = 0;
  virtual void allreduce_sum(double* data, size_t n, const char* what) = 0;
  /// Every rank contributes `n` values from `send`; every rank receives all size()·n values in `recv`, rank r's at
  /// [r·n, (r+1)·n). Every rank calls it with the same n. `send` and `recv` must not overlap. Callers whose data does
  /// not divide by the rank count pad it (parallel/zero.h pads each gradient bucket to a multiple of the rank count).
  virtual void allgather(const float* send, float* recv, size_t n, const char* what) = 0;
  virtual void allgather(const double* send, double* recv, size_t n, const char* what) = 0;
  /// Sums size()·n values from `send` over all ranks; rank r receives elements [r·n, (r+1)·n) of the sum in `recv`
  /// (n values). Each element is summed in the order allreduce_sum sums it on the same communicator (rank order on
  /// threads and TCP), so a reduce-scatter and an all-reduce of the same buffers agree bit for bit there; MPI and
  /// NCCL choose their own orders (exact for two ranks, whose sum commutes). `send` and `recv` must not overlap.
  virtual void reduce_scatter_sum(const float* send, float* recv, size_t n, const char* what) = 0;
  virtual void reduce_scatter_sum(const double* send, double* recv, size_t n, const char* what) = 0;
  /// Copies `bytes` from `root` to every other rank.
  virtual void broadcast(void* data, size_t bytes, int root, const char* what) = 0;
  /// True when the collectives take device pointers (NCCL): they queue the collective on the stream of
  /// set_stream and return before it has run; the buffers must stay untouched until that stream has passed it.
  virtual bool device_buffers() const { return false; }
  /// Device communicators: the CUDA stream (a cudaStream_t) the following collectives queue on; nullptr, the
  /// default, is the device's compute stream (gt::cuda::compute_stream). Host communicators ignore it.
  virtual void set_stream(void* stream) { (void)stream; }
  /// After a failure on this rank: ends every rank at once with `exit_code` (the others may be waiting in a
  /// collective that this rank will never reach). Returns only for a single rank.
  virtual void abort(int exit_code) = 0;
};

/// A communicator whose collectives are one template over the element type: `Impl` defines allreduce, gather and
/// reduce_scatter for T = float and double (private ones befriend this class), and this writes the six overrides
/// that forward to them.
template <class Impl>
class TypedCommunicator : public Communicator {
 public:
  void allreduce_sum(float* data, size_t n, const char* what) final { impl().allreduce(data, n, what); }
  void allreduce_sum(double* data, size_t n, const char* what) final { impl().allreduce(data, n, what); }
  void allgather(const float* send, float* recv, size_t n, const char* what) final {
    impl().gather(send, recv, n, what);
  }
  void allgather(const double* send, double* recv, size_t n, const char* what) final {
    impl().gather(send, recv, n, what);
  }
  void reduce_scatter_sum(const float* send, float* recv, size_t n, const char* what) final {
    impl().reduce_scatter(send, recv, n, what);
  }
  void reduce_scatter_sum(const double* send, double* recv, size_t n, const char* what) final {
    impl().reduce_scatter(send, recv, n, what);
  }

 private:
  Impl& impl() { return static_cast<Impl&>(*this); }
};

/// One rank: every collective is the identity.
std::unique_ptr<Communicator> make_local_comm();

/// The communicator for this launch: local for one rank, TCP under torchrun, MPI otherwise. A rank that does not
/// answer within `timeout_s` makes the others fail with exit 3, naming the collective they waited in. Throws gt::Error
/// when the launch needs MPI and this build has none.
std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double timeout_s);

/// `n` communicators for the worker threads of one process (`device: [0, 1, …]`: one worker per device), meeting in
/// shared memory. A worker that fails calls abort(): the collectives of the others then throw ErrorKind::distributed
/// naming it. A collective that waits longer than `timeout_s` throws, naming the ranks that did not arrive.
std::vector<std::unique_ptr<Communicator>> make_thread_comms(int n, double timeout_s);

/// MPI over MPI_COMM_WORLD; throws gt::Error in builds without MPI.
std::unique_ptr<Communicator> make_mpi_comm(const LaunchInfo& launch, double timeout_s);

/// TCP through rank 0 at launch.master_addr : launch.master_port + kTcpPortOffset (tcp_store.h), for any launcher
/// that sets MASTER_ADDR and MASTER_PORT. Every rank connects within `timeout_s` or the rendezvous throws (exit 3).
std::unique_ptr<Communicator> make_tcp_comm(const LaunchInfo& launch, double timeout_s);

/// NCCL on CUDA device `cuda_device`, over the ranks of `bootstrap` (MPI, TCP or threads): its rank 0 makes the
/// NCCL id and broadcasts it through `bootstrap`, which must outlive the result (abort() ends the other ranks through
/// it). Collectives take device buffers (device_buffers() is true). One that does not complete within `timeout_s`,
/// or an error NCCL reports, ends the rank with exit 3, like the MPI and TCP watchdogs. Throws gt::Error in builds
/// without the CUDA backend.
std::unique_ptr<Communicator> make_nccl_comm(Communicator& bootstrap, int cuda_device, double timeout_s);

/// Whether this build has the MPI communicator.
bool mpi_available();

}  // namespace gt
