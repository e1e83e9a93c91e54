// The worker-thread harness: one thread per device, failures carried to the other workers and back to the caller.
#include "parallel/workers.h"

#include "log/logging.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

namespace gt {

namespace {

// Thrown by a thread communicator's collective when another worker failed: not the failure to report.
bool is_peer_failure(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const PeerFailure&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

void run_worker_threads(const std::vector<std::unique_ptr<Communicator>>& comms, double grace_s,
                        const std::function<void(int rank)>& work) {
  const int n = static_cast<int>(comms.size());
  std::mutex mutex;
  std::condition_variable cv;
  int running = n;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> workers;
  for (int i = 0; i < n; ++i)
    workers.emplace_back([&, i] {
      set_thread_log_rank(i);
      try {
        work(i);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
        comms[static_cast<size_t>(i)]->abort(1);  // the others' collectives throw instead of waiting
      }
      std::lock_guard<std::mutex> lock(mutex);
      --running;
      cv.notify_all();
    });
  {
    // After a failure the others leave at their next collective (at once: it throws); one that is stuck cannot be
    // joined, so the process ends after the grace period.
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock,
            [&] { return running == 0 || std::any_of(errors.begin(), errors.end(), [](auto& e) { return !!e; }); });
    if (running > 0 && !cv.wait_for(lock, std::chrono::duration<double>(grace_s), [&] { return running == 0; })) {
      for (size_t i = 0; i < errors.size(); ++i)
        if (errors[i] && !is_peer_failure(errors[i])) try {
            std::rethrow_exception(errors[i]);
          } catch (const std::exception& e) {
            spdlog::error("{}", e.what());
          }
      spdlog::error("{} worker(s) did not stop within {:.0f} s of the failure", running, grace_s);
      spdlog::default_logger()->flush();
      std::_Exit(3);
    }
  }
  for (std::thread& t : workers) t.join();
  for (const auto& e : errors)  // the first worker's own failure, not the others' "rank r failed"
    if (e && !is_peer_failure(e)) std::rethrow_exception(e);
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace gt
