// gputrain check, config schema, config print, devices and layers: what a config, a model and a machine are,
// without training.
#include "cli.h"

#include "config/schema.h"
#include "core/json.h"
#include "data/tokens.h"
#include "graph/model.h"
#include "layers/layer.h"
#include "ops/devices.h"
#include "optim/settings.h"
#include "train/config_schema.h"
#include "train/experiment.h"
#include "train/footprint.h"
#include "train/init_from.h"
#include "train/setup.h"
#include "train/step.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>

namespace gt::cli {
namespace {

// Per-rank memory at `world` ranks under each ZeRO stage, and what would fit when nothing does (`check --world-size`).
std::vector<RankShare> rank_shares_here(const Experiment& exp, const LoadedData& data, const Footprint& f,
                                        int64_t world, std::string& advice) {
  // One rank on one device of the kind the config asks for: the device's verdict, for any number of bytes.
  const MemoryFit base = fit_on_this_machine(0, exp.devices.empty() ? exp.device : exp.devices[0]);
  const auto judge = [&base](size_t bytes) {
    MemoryFit m = base;
    m.needed = bytes;
    if (base.fits) m.fits = bytes <= base.usable;
    return m;
  };
  const auto footprint_with = [&](Recompute mode, int64_t batch, int64_t accumulate) -> std::optional<Footprint> {
    Experiment e = exp;
    e.train.recompute = mode;
    e.data.batch_size = batch;
    e.train.accumulate = accumulate;
    Model m = Model::build(e.model, data.train.input_shape(), DType::f32, Device::cpu(), e.seed,
                           /*init_params=*/false);
    m.plan_for(planned_device(exp.devices.empty() ? exp.device : exp.devices[0]));
    if (!m.set_recompute(mode).empty()) return std::nullopt;
    apply_half_activations(e, m);
    return training_footprint(e, m, data.train);
  };
  std::vector<RankShare> shares = rank_shares(f, world, judge);
  advice = fit_advice(f, world, judge, footprint_with);
  // dist.offload beside them: the configured stage with its optimizer state on the host.
  shares.push_back(offload_share(f, shares.at(static_cast<size_t>(exp.dist.zero)), judge));
  return shares;
}

// Token data whose shards are not here: the shapes come from the config (a window of data.block_size tokens; the
// vocabulary from data.vocab_size, else the model's output), so a GPT is sized before its data is downloaded.
// Empty when the shards are there, or the format's shapes come from its files.
std::optional<LoadedData> token_shapes_without_shards(const Experiment& exp) {
  if (exp.data.format != DataFormat::tokens) return std::nullopt;
  for (const std::string& glob : {exp.data.train_tokens, exp.data.test_tokens})
    if (!glob.empty() && glob_files(glob).empty()) {
      const int64_t t = exp.data.block_size;
      int64_t vocab = exp.data.vocab_size;
      if (vocab == 0) {
        const Model m = Model::build(exp.model, Shape{t}, DType::f32, Device::cpu(), exp.seed, /*init_params=*/false);
        vocab = m.output_shape().rank() == 2 ? m.output_shape()[1] : 0;
      }
      LoadedData d;
      d.train.inputs = Tensor::empty(Shape{0, t}, DType::f32);
      d.train.targets = Tensor::empty(Shape{0, t}, DType::i32);
      d.train.num_classes = vocab;
      d.train.source = "the config (no shard matches " + glob + ")";
      spdlog::warn("check: no shard matches {}: sized from the config (windows of {} tokens, vocabulary {}{})", glob, t,
                   vocab, exp.data.vocab_size ? "" : ", the model's output: data.vocab_size is unset");
      return d;
    }
  return std::nullopt;
}

struct CheckArgs {
  ConfigArgs config;
  bool json = false;
  int64_t world = 0;
};

int check(CheckArgs& a) {
  a.config.resolve();
  if (a.json) quiet_log_for_machine_output();
  const ConfigNode root = load_config(a.config.file, a.config.sets);
  // Token configs are sized without their shards; other formats' shapes come from their files, checked as usual.
  Experiment exp = parse_experiment_without_data_files(root);
  std::optional<LoadedData> shapes = token_shapes_without_shards(exp);
  if (!shapes) exp = parse_experiment(root);
  const LoadedData data = shapes ? std::move(*shapes) : load_data(exp);
  Model model = checked_model(exp, data);
  // Sized as the run would train: a GPU's chains and 16-bit weight copies where the config's device is one.
  const std::string& requested = exp.devices.empty() ? exp.device : exp.devices[0];
  model.plan_for(planned_device(requested));
  // optimizer.param_groups matched as the run will match them (a pattern that matches none is exit 2 here).
  std::vector<std::string> names;
  std::vector<int64_t> numels;
  for (const auto& [name, numel] : model.trainable_sizes()) names.push_back(name), numels.push_back(numel);
  const std::vector<std::string> group_lines =
      exp.optimizer.param_groups.empty()
          ? std::vector<std::string>()
          : describe_param_groups(exp.optimizer, param_group_of(exp.optimizer, names), numels);
  // The weights a run would start from are found as train finds them (a missing path is exit 2 at the key); their
  // shapes are matched when the run loads them, as check creates no parameters.
  if (!exp.train.init_from.empty()) init_weights_file(exp);
  Footprint f = training_footprint(exp, model, data.train);
  if (shapes) f.tokens_per_sample = exp.data.block_size;
  // A device list holds one replica per device: each GPU must fit one; CPU workers share the host's memory.
  const size_t replicas_here = !exp.devices.empty() && exp.devices[0] == "cpu" ? exp.devices.size() : size_t{1};
  const MemoryFit fit = fit_on_this_machine(f.total_bytes * replicas_here, requested);
  std::string advice;
  const std::vector<RankShare> shares =
      a.world > 0 ? rank_shares_here(exp, data, f, a.world, advice) : std::vector<RankShare>();
  if (a.json) {
    JsonObject out = footprint_json(f, fit)
                         .add("config", a.config.file)
                         .add("train_samples", data.train.size())
                         .add("test_samples", data.test.size());
    if (a.world > 0) {
      add_rank_shares_json(out, shares, a.world, exp.dist.zero, exp.dist.offload == "optimizer");
      out.add("advice", advice);
    }
    fmt::print("{}\n", out.str());
    return 0;
  }
  if (shapes)
    fmt::print("{}: valid, sized from the config: {}; batch {}\n\n{}", a.config.file, data.train.source,
               exp.data.batch_size, footprint_report(f, fit, model.edges()));
  else
    fmt::print("{}: valid. {} training samples{}; batch {}\n\n{}", a.config.file, data.train.size(),
               data.test.size() ? fmt::format(", {} test samples", data.test.size()) : std::string(),
               exp.data.batch_size, footprint_report(f, fit, model.edges()));
  for (const std::string& line : group_lines) fmt::print("{}\n", line);
  if (a.world > 0)
    fmt::print("{}{}", rank_shares_report(shares, a.world, exp.dist.zero, exp.dist.offload == "optimizer"), advice);
  if (exp.train.cuda_graphs) {
    const int64_t dropped = data.train.size() % exp.data.batch_size;
    fmt::print(
        "\ntrain.cuda_graphs: on one GPU, the step is captured into a CUDA graph after {} warm-up steps and "
        "replayed; {}\n",
        StepLoop::kGraphWarmup,
        dropped ? fmt::format("the last {} samples of each epoch's order are dropped (a partial batch)", dropped)
                : std::string("every batch is full, none is dropped"));
  }
  return 0;
}

// The config as a run would take it: validated as `check` validates it (data, shapes, loss), then written as
// config.resolved.yaml holds it.
int config_print(ConfigArgs& a) {
  a.resolve();
  quiet_log_for_machine_output();
  const Experiment exp = parse_experiment(load_config(a.file, a.sets));
  const Model model = checked_model(exp, load_data(exp));
  fmt::print("{}", run_config_text(resolved_config_text(exp, model.resolved_layers())));
  return 0;
}

int devices() {
  const CpuInfo cpu = query_cpu();
  fmt::print(
      "cpu: {} — {} logical cores, {}\n     {}\n     f32 products: {}\n     bf16/fp16 instructions: {}\n"
      "     bf16 products: {}\n     other kernels: {}\n     3x3 convolutions: {}\n     fused chains: {}\n",
      cpu.model, cpu.cores, cpu.simd, cpu.blas, cpu.sgemm_path, cpu.half, cpu.bf16_path, cpu.kernel_isa, cpu.conv_algo,
      cpu.fusion);
  const CudaInfo cuda = query_cuda();
  if (!cuda.built) {
    fmt::print("cuda: not available: {}\n", cuda.problem);
    return 0;
  }
  const auto version = [](int v) { return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100); };
  fmt::print("cuda: driver {}, runtime {}, cuBLAS {}, cuDNN {}, NCCL {}\n",
             cuda.driver_version ? format_cuda_version(cuda.driver_version) : "not loaded",
             format_cuda_version(cuda.runtime_version), version(cuda.cublas_version), version(cuda.cudnn_version),
             version(cuda.nccl_version));
  if (cuda.devices.empty()) {
    fmt::print("cuda: no GPU usable here: {}. Training runs on the CPU.\n", cuda.problem);
    return 0;
  }
  for (const auto& d : cuda.devices) {
    std::string peers;
    for (int p : d.peers) peers += fmt::format("{}cuda:{}", peers.empty() ? "" : " ", p);
    fmt::print(
        "cuda:{}: {} — compute capability {}.{}, {} SMs at {} MHz, {:.1f} of {:.1f} GiB free, PCI {}, "
        "peer access: {}\n",
        d.index, d.name, d.cc_major, d.cc_minor, d.sm_count, d.clock_mhz,
        static_cast<double>(d.memory_free) / (1 << 30), static_cast<double>(d.memory_total) / (1 << 30), d.pci_bus_id,
        peers.empty() ? "none" : peers);
  }
  return 0;
}

}  // namespace

void add_inspect_commands(CLI::App& app, Commands& commands) {
  auto [check_cmd, c] =
      commands.add_with<CheckArgs>(app, "check",
                                   "validate an experiment file and print, without training, each layer's FLOPs "
                                   "and memory, the totals, and whether they fit the device",
                                   check);
  add_config_args(check_cmd, c->config);
  check_cmd->add_flag("--json", c->json, "print one JSON object (layers, totals, fits) instead of the table");
  check_cmd
      ->add_option("--world-size", c->world,
                   "also size one rank of a data-parallel run at N ranks under ZeRO stages 0, 1 and 2, and say "
                   "what would fit when none does (--json: world_size, per_rank_bytes, zero_stages)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));

  CLI::App* config =
      commands.group(app, "config", "the config language: its JSON Schema, and a config as a run takes it");
  commands.add(*config, "schema",
               "print the JSON Schema (draft 2020-12) of experiment files, generated from the tables that validate "
               "them; editors complete and check a config that starts with `# yaml-language-server: $schema=FILE`",
               [](Context&) {
                 fmt::print("{}", config_json_schema());
                 return 0;
               });
  commands.add(*config, "reference",
               "print the config reference (Markdown): a table per section and variant with every key's type, "
               "default, range or choices and description, generated from the same tables",
               [](Context&) {
                 fmt::print("{}", section_markdown(experiment_section()));
                 return 0;
               });
  auto [print, p] = commands.add_with<ConfigArgs>(
      *config, "print",
      "print CONFIG after its --set overrides with every default filled in, as "
      "config.resolved.yaml holds it; validated as check validates it (exit 2 on a config "
      "error)",
      config_print);
  add_config_args(print, *p);

  commands.add(app, "devices", "list compute devices and the CUDA library versions found",
               [](Context&) { return devices(); });
  commands.add(app, "layers", "print the layer reference (Markdown), generated from the registry", [](Context&) {
    fmt::print("{}", layer_reference_markdown());
    return 0;
  });
}

}  // namespace gt::cli
