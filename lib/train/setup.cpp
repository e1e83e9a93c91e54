// Setting a run up: device, data, model, ranks, resume plan and optimizer, in the order their checks must come.
#include "train/setup.h"

#include "core/parallel.h"
#include "dist/comm.h"
#include "log/logging.h"
#include "ops/devices.h"
#include "train/loss.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <thread>

namespace gt {

LoadedData load_data(const Experiment& exp) {
  LoadedData d;
  data_format(exp.data.format).load(exp.data, exp.seed, d.train, d.test);
  if (d.test.size() > 0) {
    if (d.test.input_shape() != d.train.input_shape() || d.test.target_shape() != d.train.target_shape() ||
        (d.test.num_classes > 0) != (d.train.num_classes > 0))
      throw DataError(fmt::format("{}: test samples are {} → {} but training samples are {} → {}", d.test.source,
                                  d.test.input_shape().str(), d.test.target_shape().str(), d.train.input_shape().str(),
                                  d.train.target_shape().str()));
    d.test.num_classes = d.train.num_classes = std::max(d.train.num_classes, d.test.num_classes);
  }
  return d;
}

void broadcast_string(Communicator& comm, std::string& text, const char* what) {
  uint64_t n = text.size();
  comm.broadcast(&n, sizeof n, 0, what);
  text.resize(n);
  comm.broadcast(text.data(), n, 0, what);
}

RunSetup::RunSetup(const Experiment& exp, const RunOptions& opts, const WorkerPlacement& where) {
  threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency());
  set_num_threads(threads);
  device = resolve_device(where.device, device_reason);

  // Everything that can be wrong with the config is found before the run directory exists.
  if (!where.data) m_own_data = load_data(exp);
  m_data = where.data ? where.data : &*m_own_data;
  model = Model::build(exp.root["model"], train().input_shape(), DType::f32, device, exp.seed);
  model.check_batch(exp.data.batch_size, exp.root["data"]["batch_size"]);
  const ConfigNode loss_where = exp.root.has("loss") ? exp.root["loss"] : exp.root["model"]["layers"];
  check_loss_fits(exp.loss, model.output_shape(), train(), loss_where, &test());
  if (exp.data.augment.any() && train().input_shape().rank() != 3)
    exp.root["data"]["augment"].fail(fmt::format("augmentation works on [channels, height, width] images; the "
                                                 "samples are {}", train().input_shape().str()));
  {
    YAML::Emitter em;
    em << gt::resolved_config(exp, model.resolved_layers());  // (the member of the same name is its text)
    resolved_config = std::string(em.c_str()) + "\n";
  }
  m_local_comm = make_local_comm();
  comm = opts.comm ? opts.comm : m_local_comm.get();
  lead = comm->rank() == 0;
  world = comm->size();
  if (exp.dist.sync_batchnorm && world > 1) {  // batch norm over the global batch
    Communicator& ranks = *comm;
    model.set_sync([&ranks](double* data, size_t n) { ranks.allreduce_sum(data, n, "batch norm's sums"); });
  }
  // Rank 0 picks the checkpoint and the run directory; the others load the same one (a shared file system).
  if (lead) plan = plan_resume(exp, opts.out_dir, opts.resume);
  if (world > 1) {
    std::string from = plan.from ? plan.from->dir : std::string();
    broadcast_string(*comm, from, "the checkpoint to resume from");
    if (!lead && !from.empty()) plan.from = read_checkpoint(from);
  }
  batch = exp.data.batch_size;
  model.allocate(batch);
  optimizer = make_optimizer(exp.optimizer, model.params());
  // Loaded (and refused when it does not fit) before the run directory is touched.
  if (plan.from) progress = resume_progress(*plan.from, model, *optimizer, exp.optimizer.type, world);
}

StepPlan plan_steps(const Experiment& exp, const Loader& loader, const Dataset& train, int world) {
  StepPlan s;
  s.batch = loader.batch_size();
  s.accumulate = exp.train.accumulate;
  s.epochs = exp.train.epochs;
  s.micro_per_epoch = loader.batches_per_epoch();
  if (s.micro_per_epoch == 0)
    throw DataError(fmt::format("{}: {} training samples are fewer than one global batch ({} ranks × batch {})",
                                train.source, train.size(), world, s.batch));
  s.per_epoch = (s.micro_per_epoch + s.accumulate - 1) / s.accumulate;
  s.total_steps = mul_sizes(s.per_epoch, s.epochs, "steps");
  if (exp.train.max_steps > 0) s.total_steps = std::min(s.total_steps, exp.train.max_steps);
  return s;
}

void log_run_start(const Experiment& exp, const RunSetup& setup, const StepPlan& plan, const std::string& run_dir,
                   int local_rank) {
  const int world = setup.world;
  const int64_t batch = plan.batch, accumulate = plan.accumulate;
  const Dataset &train = setup.train(), &test = setup.test();
  spdlog::info("gputrain {}: run {} → {}", GPUTRAIN_VERSION, exp.name, run_dir);
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  spdlog::info("{}device {} ({}), {} CPU thread(s), host {}",
               world > 1 ? fmt::format("rank {} of {} (local rank {}, {}), ", setup.comm->rank(), world, local_rank,
                                       setup.comm->name())
                         : std::string(),
               setup.device.str(), setup.device_reason, setup.threads, host);
  spdlog::info("data: {} training samples of {}{}, batch {}{}{}{}, {} steps per epoch{}", train.size(),
               train.input_shape().str(),
               test.size() ? fmt::format(", {} test samples", test.size()) : std::string(), batch,
               world > 1 ? " per rank" : "", accumulate > 1 ? fmt::format(" × {} accumulated", accumulate) : std::string(),
               world > 1 || accumulate > 1 ? fmt::format(" = global batch {}", batch * accumulate * world)
                                           : std::string(),
               plan.per_epoch,
               world > 1 ? fmt::format(" ({} samples of each epoch's order dropped so every rank takes the same "
                                       "number of full batches)",
                                       train.size() - plan.micro_per_epoch * batch * world)
                         : std::string());
  spdlog::info("model: {} layers, {} parameters; loss {}; optimizer {} lr {}; schedule {}", setup.model.nodes().size(),
               setup.model.param_count(), to_string(exp.loss.type), to_string(exp.optimizer.type), exp.optimizer.lr,
               to_string(exp.scheduler.type));
}

}  // namespace gt
