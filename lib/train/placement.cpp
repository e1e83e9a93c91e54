// Where a run's workers go: one per device of a `device:` list, as threads of this process, or this process as one
// rank of a launcher's job, on the device its local rank picks.
#include "log/logging.h"
#include "ops/devices.h"
#include "parallel/comm.h"
#include "parallel/workers.h"
#include "train/run_dir.h"
#include "train/setup.h"
#include "train/signals.h"
#include "train/trainer.h"

#include <algorithm>
#include <thread>

namespace gt {
namespace {

// One process, several devices: one worker thread per device, each the same train_worker as a rank of an mpirun,
// meeting in thread communicators. The data is loaded once and shared (read only); rank 0 writes the run directory.
RunSummary run_workers(const Experiment& exp, const RunOptions& opts) {
  const int n = static_cast<int>(exp.devices.size());
  const LoadedData data = load_data(exp);
  const std::vector<std::unique_ptr<Communicator>> comms = make_thread_comms(n, exp.dist.timeout_s);
  const int threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency());
  WorkerPlacement shared;
  shared.data = &data;
  shared.threaded = true;
  for (const std::string& d : exp.devices)
    if (d.rfind("cuda:", 0) == 0) shared.process_gpus.push_back(std::stoi(d.substr(5)));
  RunSummary result;
  run_worker_threads(comms, std::min(exp.dist.timeout_s, 10.0), [&](int rank) {
    RunOptions o = opts;
    o.comm = comms[static_cast<size_t>(rank)].get();
    o.local_rank = rank;
    o.threads = std::max(1, threads / n);  // the cores are shared out
    WorkerPlacement w = shared;
    w.device = exp.devices[static_cast<size_t>(rank)];
    RunSummary s = train_worker(exp, o, w);
    if (rank == 0) result = std::move(s);
  });
  return result;
}

}  // namespace

RunSummary run_training(const Experiment& exp, const RunOptions& opts) {
  // --resume auto --out DIR of a run that has ended for good: nothing to do, and nothing is written (a scheduler's
  // requeue of a finished task ends at once).
  if (opts.resume == "auto" && !opts.out_dir.empty() && run_is_complete(opts.out_dir)) {
    spdlog::info("{}: the run is complete ({}); nothing to resume, nothing written", opts.out_dir,
                 run_exit_reason(opts.out_dir));
    RunSummary done;
    done.run_dir = opts.out_dir;
    return done;
  }
  if (exp.data.format == DataFormat::tokens && exp.data.train_tokens.empty())
    exp.at.data.fail("tokens: training needs data.train: {path: GLOB} (this config names test shards only)");
  // From before any work (data, model, run directory) to the end: a signal at any moment stops the run the
  // documented way, never by the default action. (`gputrain train` holds them from its start already.)
  const StopHandlers handlers;
  const int world = opts.comm ? opts.comm->size() : 1;
  if (!exp.devices.empty() && world == 1) return run_workers(exp, opts);  // also a list of one: the same path
  WorkerPlacement where;
  where.device = exp.device;
  if (!exp.devices.empty()) {  // under a launcher, rank r of a node takes the device at its local rank
    if (opts.local_rank >= static_cast<int>(exp.devices.size()))
      throw Error(ErrorKind::distributed,
                  fmt::format("device {}: local rank {} has no device in the list of {}",
                              exp.devices.size() == 1 ? exp.devices[0] : "list", opts.local_rank, exp.devices.size()));
    where.device = exp.devices[static_cast<size_t>(opts.local_rank)];
  } else if (world > 1 && exp.device == "cuda") {
    where.device = fmt::format("cuda:{}", opts.local_rank);  // one GPU per rank of a node
  } else if (world > 1 && exp.device == "auto") {
    std::string reason;
    if (resolve_device("auto", reason).is_cuda()) where.device = fmt::format("cuda:{}", opts.local_rank);
  }
  return train_worker(exp, opts, where);
}

}  // namespace gt
