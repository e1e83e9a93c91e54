// Setting a run up: device, data, model, ranks, resume plan and optimizer, in the order their checks must come.
#include "train/setup.h"

#include "core/backend.h"
#include "core/checked.h"
#include "core/env.h"
#include "core/limits.h"
#include "core/ownership.h"
#include "core/parallel.h"
#include "core/quote.h"
#include "log/logging.h"
#include "ops/cpu/bf16_gemm.h"
#include "ops/devices.h"
#include "optim/offload.h"
#include "parallel/comm.h"
#include "parallel/zero.h"
#include "train/evaluation.h"
#include "train/loss.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string_view>
#include <thread>

namespace gt {
namespace fs = std::filesystem;

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

std::string rank_agreement_text(const std::string& resolved_config, Model& model) {
  std::string text;
  // The config without `device`, the one field ranks may be given differently (each takes its own GPU).
  try {
    YAML::Node cfg = YAML::Load(resolved_config);
    if (cfg.IsMap()) cfg.remove("device");
    YAML::Emitter em;
    em << cfg;
    text = std::string(em.c_str()) + "\n";
  } catch (const YAML::Exception&) {
    text = resolved_config;
  }
  text += "# parameter layout\n";
  for (const auto& [name, t] : model.state_tensors())
    text += fmt::format("{}: {} {}\n", name, dtype_name(t->dtype()), t->shape().str());
  return text;
}

void check_ranks_agree(Communicator& comm, const std::string& text) {
  if (comm.size() == 1) return;
  // A hash first (8 bytes each way); the whole text only when some rank differs, to name the first difference.
  const uint32_t mine =
      static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const unsigned char*>(text.data()), text.size()));
  uint32_t lead = mine;
  comm.broadcast(&lead, sizeof lead, 0, "the ranks' config hash");
  double differ[1] = {lead != mine ? 1.0 : 0.0};
  comm.allreduce_sum(differ, 1, "the ranks' config comparison");
  if (differ[0] == 0) return;
  std::string lead_text = text;
  broadcast_string(comm, lead_text, "rank 0's config");
  if (lead_text == text)
    throw Error(ErrorKind::distributed,
                fmt::format("{} rank(s) were started with another config or model than this one (rank 0): every rank "
                            "must run the same experiment (see their messages)",
                            static_cast<int64_t>(differ[0])));
  std::istringstream a(lead_text), b(text);
  std::string la, lb;
  int line = 1;
  bool in_layout = false;
  for (; std::getline(a, la) && std::getline(b, lb); ++line) {
    if (la == "# parameter layout") in_layout = true;
    if (la != lb) break;
  }
  if (la == lb) la = lb = "(the end)";  // one text is a prefix of the other
  throw Error(ErrorKind::distributed,
              fmt::format("rank {}: started with another {} than rank 0; the first difference, at line {}: rank 0 has "
                          "\"{}\", this rank \"{}\" (every rank must run the same experiment)",
                          comm.rank(), in_layout ? "model (parameter layout)" : "config", line, la, lb));
}

BucketPlan zero_plan(Model& model, const DistConfig& dist) {
  if (dist.zero < 3) return plan_buckets(model.params_by_node(), dist.bucket_mb);
  std::vector<int> blocks;  // (all -1 for shard_unit bucket: plan_units then cuts by dist.bucket_mb)
  for (const GraphNode& n : model.nodes()) blocks.push_back(dist.shard_unit == "block" ? n.block : -1);
  return plan_units(model.all_params_by_node(), blocks, dist.bucket_mb);
}

void check_same_batches(const Experiment& exp, const CheckpointInfo& from) {
  // The position is a count of micro-batches, and the step count, the schedule, every_steps and max_steps all count
  // optimizer steps: under another batch size or accumulation they would name other samples (batch 64 after 16 ends
  // the run at once, 8 repeats samples, 32 skips them). Refused, rather than a run that silently is not the same.
  auto refuse = [&](const ConfigNode& where, int64_t now, int64_t then) {
    where.fail(
        fmt::format("is {}, but checkpoint {} was written with {}: its position and step count are in those "
                    "batches, so the run cannot continue exactly; resume with {}, or start a new run",
                    now, from.dir, then, then));
  };
  if (from.batch_size != exp.data.batch_size) refuse(exp.at.batch_size, exp.data.batch_size, from.batch_size);
  if (from.accumulate != exp.train.accumulate) refuse(exp.at.accumulate, exp.train.accumulate, from.accumulate);
}

Shape model_input_shape(const Experiment& exp) {
  if (exp.data.format == DataFormat::synthetic) return Shape(exp.data.synthetic.input_shape);
  if (exp.data.format == DataFormat::tokens) return Shape{exp.data.block_size};  // no shard needs to be read
  return load_data(exp).train.input_shape();
}

void apply_freeze(const Experiment& exp, Model& model) {
  std::vector<std::string> patterns = exp.train.freeze;
  if (model.has_lora()) {
    // Only the adapters learn, and what also_train names (a new head): every other parameter is frozen.
    std::vector<std::string> except = {"*lora_A", "*lora_B"};
    if (exp.model.lora)
      except.insert(except.end(), exp.model.lora->also_train.begin(), exp.model.lora->also_train.end());
    std::vector<std::string> all = {"*"};
    all.insert(all.end(), patterns.begin(), patterns.end());
    model.set_frozen(all, except);
    return;
  }
  if (patterns.empty()) return;
  const std::vector<int64_t> hits = model.set_frozen(patterns);
  std::string example;  // the first parameter's name, to show how they are spelt
  for (const GraphNode& n : model.nodes())
    if (example.empty() && !n.layer->param_shapes().empty()) example = n.name + "." + n.layer->param_shapes()[0].first;
  for (size_t i = 0; i < patterns.size(); ++i)
    if (hits[i] == 0)
      exp.at.freeze.at(i).fail(
          fmt::format("{} matches none of the model's parameters (named like {}; `gputrain check` lists them)",
                      quote_if_needed(patterns[i]), example));
  if (model.trainable_count() == 0)
    exp.at.freeze.fail("freezes every parameter: nothing would learn (evaluate the weights with `gputrain eval`)");
}

void apply_recompute(const Experiment& exp, Model& model) {
  const std::string why = model.set_recompute(exp.train.recompute);
  if (!why.empty()) exp.at.recompute.fail(fmt::format("is {}, but {}", to_string(exp.train.recompute), why));
  apply_half_activations(exp, model);
}

bool half_activations_between_layers(const Model& model) {
  const std::optional<size_t> choice = env_choice("GPUTRAIN_HALF_ACTIVATIONS", {"on", "off"});
  const bool wanted = choice ? *choice == 0 : model.device().is_cuda();
  return wanted && model.half_activations_unsupported().empty();
}

void apply_half_activations(const Experiment& exp, Model& model) {
  if (model.dtype() != DType::f32) return;
  const std::optional<HalfFormat> format = half_format(exp.train.precision);
  if (format && half_activations_between_layers(model))
    model.set_activation_dtype(half_dtype(*format));
  else
    model.set_activation_storage(format);  // bf16/fp16 keep the activations for backward in half
}

namespace {

// What train.cuda_graphs needs of the run that the config alone does not show (experiment.cpp checks the rest): a
// GPU found, one rank, and no layer that draws from the host's step number.
void check_cuda_graphs_run(const Experiment& exp, Device device, const std::string& device_reason, int world,
                           const Model& model) {
  if (!exp.train.cuda_graphs) return;
  const ConfigNode& key = exp.at.cuda_graphs;
  if (!device.is_cuda())
    key.fail(fmt::format("CUDA graphs need a GPU, and this run is on {} ({})", device.str(), device_reason));
  if (world > 1)
    key.fail(
        fmt::format("CUDA graphs capture one rank's step; this run has {} ranks (the NCCL all-reduce of several "
                    "is not captured yet): run one process, or cuda_graphs: false",
                    world));
  check_graph_layers(exp, model);
}

}  // namespace

void check_graph_layers(const Experiment& exp, const Model& model) {
  if (!exp.train.cuda_graphs) return;
  for (const GraphNode& node : model.nodes())
    if (node.layer->keyed_by_step())
      exp.at.cuda_graphs.fail(
          fmt::format("layer {} ({}) draws its dropout masks from the step number the host passes each step, which "
                      "a captured graph would freeze: set its dropout to 0, or cuda_graphs: false",
                      node.name, node.type));
}

RunSetup::RunSetup(const Experiment& exp, const RunOptions& opts, const WorkerPlacement& where) {
  threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency());
  set_num_threads(threads);
  device = resolve_device(where.device, device_reason);
  // Everything that can be wrong with the config is found before the run directory exists.
  if (!where.data) m_own_data = load_data(exp);
  m_data = where.data ? where.data : &*m_own_data;
  model = Model::build(exp.model, train().input_shape(), DType::f32, device, exp.seed);
  model.check_batch(exp.data.batch_size, exp.at.batch_size);
  apply_freeze(exp, model);
  apply_recompute(exp, model);
  check_loss_fits(exp.loss, model.output_shape(), train(), exp.at.loss, &test());
  if (exp.data.augment.any() && train().input_shape().rank() != 3)
    exp.at.augment.fail(
        fmt::format("augmentation works on [channels, height, width] images; the "
                    "samples are {}",
                    train().input_shape().str()));
  check_tta(exp, train().input_shape());
  resolved_config = resolved_config_text(exp, model.resolved_layers());
  m_local_comm = make_local_comm();
  comm = opts.comm ? opts.comm : m_local_comm.get();
  lead = comm->rank() == 0;
  world = comm->size();
  check_cuda_graphs_run(exp, device, device_reason, world, model);
  // Ranks of different experiments would exchange buffers of different sizes (a garbage loss, a truncated message):
  // they compare what they were started with before any other collective.
  check_ranks_agree(*comm, rank_agreement_text(resolved_config, model));
  if (exp.dist.sync_batchnorm && world > 1) {  // batch norm over the global batch
    Communicator& ranks = *comm;
    model.set_sync([&ranks](double* data, size_t n) { ranks.allreduce_sum(data, n, "batch norm's sums"); });
  }
  // Rank 0 picks the checkpoint and the run directory; the others load the same one (a shared file system).
  if (lead) {
    // A run's folder is locked before it is looked at, so that a second run in it stops here, naming the first; a
    // folder that is not a run's is not touched (plan_resume refuses it, naming what it holds).
    std::error_code ec;
    if (!opts.out_dir.empty()) {
      const FolderOwnership o = folder_ownership(opts.out_dir);
      if (o.state == FolderOwnership::State::owned && o.owner == Owner::run) run_lock.acquire(opts.out_dir);
    }
    plan = plan_resume(exp, opts.out_dir, opts.resume);
    if (!plan.run_dir.empty() && fs::is_directory(plan.run_dir, ec)) run_lock.acquire(plan.run_dir);
  }
  if (world > 1) {
    std::string from = plan.from ? plan.from->dir : std::string();
    broadcast_string(*comm, from, "the checkpoint to resume from");
    if (!lead && !from.empty()) plan.from = read_checkpoint(from);
  }
  // train.init_from: a new run's weights, before the optimizer copies anything of them (its master weights) and the
  // first step's broadcast; rank 0 picks the file, as it picks a checkpoint, and every rank loads it. A resume's
  // checkpoint holds the weights: the file may be gone by then.
  if (!plan.from && !exp.train.init_from.empty()) {
    std::string file = lead ? init_weights_file(exp) : std::string();
    if (world > 1) broadcast_string(*comm, file, "train.init_from's weights");
    init = load_init_weights(exp, file, model);
  }
  batch = exp.data.batch_size;
  model.allocate(batch);
  // On GPUs the device buffers travel through NCCL, bootstrapped over the host communicator (MPI, TCP or the worker
  // threads'), which keeps the host-side collectives. Made here, before the optimizer: dist.zero's collectives use it.
  if (world > 1 && device.is_cuda()) nccl = make_nccl_comm(*comm, device.index, exp.dist.timeout_s);
  // optimizer.param_groups: each parameter's group, by its full name (a pattern that matches none fails here, exit 2).
  std::vector<std::string> names;
  std::vector<int64_t> numels;
  for (const auto& [name, param] : model.named_params()) names.push_back(name), numels.push_back(param->value.numel());
  const std::vector<int> groups = param_group_of(exp.optimizer, names);
  param_group_lines = describe_param_groups(exp.optimizer, groups, numels);
  const Offload offload = exp.dist.offload != "optimizer" ? Offload::none
                          : exp.dist.offload_delay        ? Offload::delayed
                                                          : Offload::exact;
  // Named in an out-of-memory error (the optimizer's own labels name each parameter's state; dist.zero 2 and 3 also
  // hold their gradient shards here).
  const AllocLabel label(exp.dist.zero > 0 && world > 1
                             ? fmt::format("the optimizer state and gradient shards (dist.zero {})", exp.dist.zero)
                             : std::string("the optimizer state"));
  const std::vector<std::pair<std::string, Param*>> named = model.named_params();
  const ParamNames full_names(named);  // (each parameter's state named by its full name)
  if (exp.dist.zero > 0 && world > 1) {
    // The sharded update, the gradient reduce-scatter and the weight all-gather: on host buffers over the host
    // communicator, on device buffers over NCCL (queued on the compute stream, no host sync). From stage 2 the whole
    // gradients exist only while a backward pass writes them (GradSync): the model's are freed before the shards are
    // allocated, so that the set-up never holds both.
    if (exp.dist.zero >= 2)
      for (Param* p : model.params()) p->grad = Tensor();
    auto zero = std::make_unique<ZeroOptimizer>(exp.optimizer, model.params(), zero_plan(model, exp.dist),
                                                nccl ? *nccl : *comm, exp.dist.zero, groups, offload);
    spdlog::info("dist.zero {}: optimizer state {:.2f} MB on rank 0 instead of {:.2f} MB", exp.dist.zero,
                 static_cast<double>(zero->shard_state_elements()) * 4e-6,
                 static_cast<double>(zero->full_state_elements()) * 4e-6);
    optimizer = std::move(zero);
  } else if (offload != Offload::none) {
    optimizer = std::make_unique<OffloadOptimizer>(exp.optimizer, model.params(), groups, offload == Offload::delayed);
  } else {
    optimizer = make_optimizer(exp.optimizer, model.params(), groups);
  }
  if (const auto* host = dynamic_cast<const OffloadOptimizer*>(optimizer.get()))
    spdlog::info("dist.offload: optimizer state and master weights in {:.2f} MB of host memory, updated on the CPU",
                 static_cast<double>(host->host_bytes()) / 1e6);
  // Loaded (and refused when it does not fit) before the run directory is touched.
  if (plan.from) check_same_batches(exp, *plan.from);
  if (plan.from) progress = resume_progress(*plan.from, model, *optimizer, exp.optimizer.type, world);
  // The loss scale starts at train.loss_scale's init, and a resumed run goes on with its checkpoint's (a fixed scale
  // is the config's; a checkpoint of a run without a scaler starts one afresh).
  if (exp.train.loss_scaling() && (!exp.train.loss_scale.hyper.dynamic || !(progress.loss_scale > 0))) {
    progress.loss_scale = exp.train.loss_scale.init;
    progress.scale_growth_tracker = 0;
  }
  if (!exp.train.loss_scaling()) progress.loss_scale = 0;
}

StepPlan plan_steps(const Experiment& exp, const Loader& loader, const Dataset& train, int world) {
  StepPlan s;
  s.batch = loader.batch_size();
  s.accumulate = exp.train.accumulate;
  s.epochs = exp.train.epochs;
  s.micro_per_epoch = loader.batches_per_epoch();
  // train.cuda_graphs replays one batch shape: one rank's last partial batch is dropped (several ranks drop theirs
  // anyway).
  if (exp.train.cuda_graphs && world == 1) s.micro_per_epoch = loader.size() / s.batch;
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
  spdlog::info(
      "data: {} training samples of {}{}, batch {}{}{}{}, {} steps per epoch{}", train.size(),
      train.input_shape().str(), test.size() ? fmt::format(", {} test samples", test.size()) : std::string(), batch,
      world > 1 ? " per rank" : "", accumulate > 1 ? fmt::format(" × {} accumulated", accumulate) : std::string(),
      world > 1 || accumulate > 1 ? fmt::format(" = global batch {}", batch * accumulate * world) : std::string(),
      plan.per_epoch,
      world > 1 ? fmt::format(" ({} samples of each epoch's order dropped so every rank takes the same "
                              "number of full batches)",
                              train.size() - plan.micro_per_epoch * batch * world)
                : std::string());
  // Which limit ends the run, when both could: the steps of train.epochs, or train.max_steps.
  const int64_t epoch_steps = checked_mul(plan.per_epoch, plan.epochs).value_or(INT64_MAX);
  if (exp.train.max_steps > 0 && exp.train.epochs == limits::kEpochs.max)
    spdlog::info("steps: {} (train.max_steps; train.epochs lifted)", plan.total_steps);
  else if (exp.train.max_steps > 0)
    spdlog::info("steps: {} — {} ends the run first (train.epochs {} × {} steps = {}, train.max_steps {})",
                 plan.total_steps, epoch_steps <= exp.train.max_steps ? "train.epochs" : "train.max_steps", plan.epochs,
                 plan.per_epoch, epoch_steps, exp.train.max_steps);
  if (train.tokens)  // a sample is a window: say what it is cut from
    spdlog::info("tokens: {} in {} (windows of {} + 1, vocabulary {}){}", train.tokens->tokens(),
                 train.tokens->describe(), train.tokens->block_size(), train.tokens->vocab_size(),
                 test.tokens ? fmt::format("; test: {} in {}{}", test.tokens->tokens(), test.tokens->describe(),
                                           exp.train.eval_tokens > 0
                                               ? fmt::format(", evaluated up to {} tokens", exp.train.eval_tokens)
                                               : std::string())
                             : std::string());
  const int64_t trainable = setup.model.trainable_count(), total = setup.model.param_count();
  spdlog::info(
      "model: {} layers, {} parameters{}; loss {}; optimizer {} lr {}; schedule {}", setup.model.nodes().size(), total,
      trainable < total ? fmt::format(" ({} trainable{})", trainable,
                                      setup.model.has_lora() ? ": the LoRA adapters" : ", train.freeze")
                        : std::string(),
      to_string(exp.loss.type), to_string(exp.optimizer.type), exp.optimizer.lr, to_string(exp.scheduler.type));
  if (setup.lead)
    for (const std::string& line : setup.param_group_lines) spdlog::info("{}", line);
  if (setup.lead) log_precision(exp.train.precision, setup.device);
  if (setup.lead && half_format(exp.train.precision)) log_half_activations(setup.model);
  if (setup.lead) log_init_weights(setup.init);  // the ranks share the config: one line is enough
}

void log_half_activations(const Model& model) {
  if (is_half(model.activation_dtype())) {
    spdlog::info(
        "activations: the layers' outputs and their gradients in {} between layers, the logits included "
        "(GPUTRAIN_HALF_ACTIVATIONS=off keeps them f32); parameters, their gradients and the optimizer's state {}",
        dtype_name(model.activation_dtype()), dtype_name(model.dtype()));
    return;
  }
  const std::optional<size_t> choice = env_choice("GPUTRAIN_HALF_ACTIVATIONS", {"on", "off"});
  if (model.device().is_cuda() && !choice && model.dtype() == DType::f32)
    spdlog::info("activations: f32 between layers with 16-bit copies for backward: {}",
                 model.half_activations_unsupported());
  const std::string why = model.dtype() == DType::f32 ? model.half_activations_unsupported()
                                                      : fmt::format("the model is {}", dtype_name(model.dtype()));
  if (choice == 0 && !why.empty())
    spdlog::warn(
        "GPUTRAIN_HALF_ACTIVATIONS=on: {}, so the activations stay {} between layers (kept for backward in "
        "16 bits where that saves memory)",
        why, dtype_name(model.dtype()));
}

void log_precision(Precision precision, Device device) {
  if (precision == Precision::tf32)
    spdlog::info(device.is_cuda() ? "precision tf32: f32 matrix products on TF32 tensor cores "
                                    "(cuBLASLt CUBLAS_COMPUTE_32F_FAST_TF32) and cuDNN convolutions on tensor cores"
                                  : "precision tf32: fp32 on the CPU (TF32 is a GPU tensor-core format)");
  if (!half_format(precision)) return;
  if (device.is_cuda()) {
    spdlog::info(
        "precision {}: matrix products of {} operands with fp32 accumulation (cuBLASLt CUBLAS_COMPUTE_32F, "
        "cuDNN's 16-bit convolutions with fp32 compute, attention's products on rounded operands); activations kept "
        "for backward in {} where that saves memory; the rest of the step stays fp32",
        to_string(precision), to_string(precision), to_string(precision));
    return;
  }
  const bool bf16 = precision == Precision::bf16;
  if (bf16 && cpu::cpu_bf16_path() == cpu::CpuBf16Path::native) {
    spdlog::info(
        "precision bf16: matrix products of dense layers and convolutions on the CPU's AVX-512 BF16 (vdpbf16ps; "
        "operands rounded to bf16 as they are packed, fp32 accumulation); attention's products round their operands "
        "and multiply in fp32; the rest of the step stays fp32 (GPUTRAIN_CPU_BF16=convert selects the conversion "
        "path)");
    return;
  }
  const CpuHalfSupport cpu = query_cpu_half();
  const char* env = std::getenv("GPUTRAIN_CPU_BF16");
  if (bf16 && cpu.avx512_bf16 && !cpu::cpu_native_bf16_pays() && !(env && std::string_view(env) == "convert")) {
    spdlog::info(
        "precision bf16: matrix products of dense layers and convolutions by {}, the exact products summed in fp32; "
        "this CPU has AVX-512 BF16, but vdpbf16ps runs no faster than fp32 FMAs on Intel CPUs (measured on a Xeon: "
        "half their rate; GPUTRAIN_CPU_BF16=native forces it); attention's products round their operands and "
        "multiply in fp32; the rest of the step stays fp32",
        cpu::describe(cpu::CpuBf16Path::conversion));
    return;
  }
  // One warning per run: without native half kernels every product converts its operands first.
  const bool native = bf16 ? cpu.avx512_bf16 : cpu.avx512_fp16;
  const char* isa = bf16 ? "AVX-512 BF16 (avx512_bf16)" : "AVX512-FP16 (avx512_fp16)";
  spdlog::warn(
      "precision {}: matrix products round their operands to {} (dense layers, convolutions, attention; each weight "
      "once per step) and multiply in fp32 (by conversion), slower than fp32: {}",
      to_string(precision), to_string(precision),
      !native ? fmt::format("this CPU has no {}", isa)
      : bf16  ? fmt::format("this CPU has {}, but GPUTRAIN_CPU_BF16=convert asks for the conversion path", isa)
              : fmt::format("this CPU has {}, but gputrain has no kernels for it yet", isa));
}

}  // namespace gt
