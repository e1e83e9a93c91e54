// One process, several devices: a worker thread per device, meeting in thread communicators, where one worker's
// failure ends them all.
#pragma once

#include "parallel/comm.h"

#include <functional>
#include <memory>
#include <vector>

namespace gt {

/// Runs work(rank) on one thread per communicator of `comms` (make_thread_comms), each thread logging as its rank,
/// and returns when all have returned. A worker that throws aborts its communicator, so the collectives of the others
/// throw PeerFailure instead of waiting; once every worker has stopped, the first failure that is not a PeerFailure
/// is rethrown (else the first one). A worker still running `grace_s` seconds after a failure is stuck and cannot be
/// joined: the failures are logged and the process ends with exit 3, as mpirun ends the ranks of a failed job.
void run_worker_threads(const std::vector<std::unique_ptr<Communicator>>& comms, double grace_s,
                        const std::function<void(int rank)>& work);

}  // namespace gt
