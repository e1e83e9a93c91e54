// gputrain: the command line. The only place that maps errors to exit codes.
#include "core/json.h"
#include "core/limits.h"
#include "core/ownership.h"
#include "core/quote.h"
#include "data/inspect.h"
#include "data/tokens.h"
#include "flag_checks.h"
#include "graph/model.h"
#include "io/safetensors.h"
#include "layers/layer.h"
#include "log/logging.h"
#include "log/report.h"
#include "ops/cpu_conv.h"
#include "ops/cpu_isa.h"
#include "ops/devices.h"
#include "ops/epilogue.h"
#include "parallel/comm.h"
#include "train/checkpoint.h"
#include "train/config_schema.h"
#include "train/evaluation.h"
#include "train/footprint.h"
#include "train/generate.h"
#include "train/llmc.h"
#include "train/loss.h"
#include "train/run_dir.h"
#include "train/runs.h"
#include "train/setup.h"
#include "train/signals.h"
#include "train/step.h"
#include "train/sweep.h"
#include "train/trainer.h"

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <charconv>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>

namespace {

constexpr const char* kExitCodes =
    "Exit codes: 0 completed; 1 runtime error (I/O, data, device); 2 config or usage error; 3 distributed failure or "
    "timeout; 4 training diverged (non-finite loss or gradient); 75 interrupted by SIGINT/SIGTERM/SIGUSR1 after "
    "writing a checkpoint (resumable: --resume auto); 130 a second Ctrl-C (the last complete checkpoint is kept).";

int exit_code_for(const gt::RunSummary& s) {
  if (s.exit_reason == gt::ExitReason::interrupted) return 75;
  if (s.exit_reason == gt::ExitReason::diverged) return 4;
  return 0;
}

// Commands whose stdout is YAML, JSON or CSV: the log goes to stderr, warnings and errors only, so stdout is only the
// machine output whatever the inputs are (an image folder's decode lines stay out; a bad file's warning goes to
// stderr, and what they report holds the numbers, bad_files).
void quiet_log_for_machine_output() {
  gt::log_console_to_stderr();
  spdlog::set_level(spdlog::level::warn);
}

int cmd_export(const std::string& from, const std::string& to) {
  namespace fs = std::filesystem;
  gt::refuse_output_file("--to", to, {from});
  std::string dir = from;
  if (!fs::exists(fs::path(from) / "state.json")) {  // a run directory: its newest checkpoint that verifies
    const auto found = gt::CheckpointStore(from, {}).newest_good();
    if (!found)
      throw gt::DataError(fmt::format("{}: no checkpoint that verifies (state.json) in it or its checkpoints/", from));
    dir = found->dir;
  }
  gt::refuse_output_file("--to", to, {(fs::path(dir) / "model.safetensors").string()});
  const gt::CheckpointInfo ckpt = gt::read_checkpoint(dir);  // sizes and checksums
  const auto tensors = gt::read_safetensors((fs::path(dir) / "model.safetensors").string());
  std::vector<std::pair<std::string, const gt::Tensor*>> list;
  for (const auto& [name, t] : tensors) list.emplace_back(name, &t);
  gt::write_safetensors(to, list,
                        {{"format", "pt"},
                         {"gputrain_version", GPUTRAIN_VERSION},
                         {"step", std::to_string(ckpt.progress.step)},
                         {"gputrain_config", ckpt.config}});
  fmt::print("{}: {} tensors of step {} → {}\n", dir, list.size(), ckpt.progress.step, to);
  return 0;
}

// The config a command reads, as people type it: CONFIG (an experiment file, or a run directory, whose
// config.resolved.yaml is read) or --config FILE, then overrides as --set KEY=VALUE or bare KEY=VALUE words (Hydra's
// way; +KEY=, ++KEY= and ~KEY too). resolve() turns the words into `file`, `sets` and `run_dir`.
struct ConfigArgs {
  std::vector<std::string> words;  ///< the positional words: CONFIG (unless --config), then overrides
  std::string flag_file;           ///< --config FILE
  std::string file;
  std::vector<std::string> sets;
  std::string run_dir;  ///< CONFIG named a run directory: its weights are the default --checkpoint
  void resolve();
};

bool is_override_word(const std::string& w) { return !w.empty() && (w[0] == '~' || w.find('=') != std::string::npos); }

void ConfigArgs::resolve() {
  namespace fs = std::filesystem;
  size_t first = 0;
  if (!flag_file.empty()) {
    file = flag_file;
  } else if (!words.empty() && !is_override_word(words[0])) {
    file = words[0];
    first = 1;
  } else {
    throw gt::ConfigError("a config is needed: CONFIG (an experiment file or a run directory) or --config FILE");
  }
  for (size_t i = first; i < words.size(); ++i) {
    // `--set KEY VALUE`: the value arrived as a word of its own.
    for (const std::string& s : sets)
      if (!is_override_word(s) && !is_override_word(words[i]))
        throw gt::ConfigError(fmt::format("--set {} {}: write --set {}={}", s, words[i], s, words[i]));
    if (!is_override_word(words[i]))
      throw gt::ConfigError(fmt::format("{}: not an override (KEY=VALUE, +KEY=VALUE, ++KEY=VALUE or ~KEY){}",
                                        gt::quote_value(words[i]),
                                        i == first && first == 0 ? "" : "; only one config may be given"));
    sets.push_back(words[i]);  // after the --set values, in the order typed
  }
  std::error_code ec;
  if (fs::is_directory(file, ec) && fs::exists(fs::path(file) / "config.resolved.yaml", ec)) {
    run_dir = file;
    file = (fs::path(file) / "config.resolved.yaml").string();
  }
}

void add_config_args(CLI::App* cmd, ConfigArgs& a) {
  cmd->add_option("config", a.words,
                  "CONFIG: an experiment YAML file, or a run directory (its config.resolved.yaml), then overrides "
                  "KEY=VALUE as --set takes them")
      ->type_name("CONFIG [KEY=VALUE...]")
      ->check(gt::cli::non_empty("an experiment YAML file or a run directory"));
  cmd->add_option("--config", a.flag_file, "the experiment file (instead of the first word)")
      ->type_name("FILE")
      ->check(gt::cli::non_empty("an experiment YAML file"));
  cmd->add_option("--set", a.sets,
                  "override a key: --set optimizer.lr=0.1 --set model.layers[1].out_features=1024; +KEY=VALUE adds a "
                  "key the config lacks, ++KEY=VALUE sets it either way, ~KEY removes one")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
}

struct RunsArgs {
  std::vector<std::string> dirs;
  std::string sort;
  bool desc = false, json = false, csv = false;
};

int cmd_runs(const RunsArgs& a) {
  if (a.json || a.csv) quiet_log_for_machine_output();
  std::vector<gt::RunInfo> runs = gt::find_runs(a.dirs);
  if (runs.empty()) {
    std::string where;
    for (const auto& d : a.dirs) where += (where.empty() ? "" : ", ") + d;
    fmt::print(stderr,
               "no run directories in {} (a run directory holds summary.json, config.resolved.yaml, metrics.jsonl or "
               "checkpoints/; runs are looked for in the folder, below it and one level further down)\n",
               where);
    return 1;
  }
  for (gt::RunInfo& r : runs) {
    gt::read_run(r);
    if (!r.problem.empty()) spdlog::warn("{}: {}", r.dir, r.problem);
  }
  gt::RunsTable table = gt::runs_table(runs);
  if (!a.sort.empty()) gt::sort_runs(table, a.sort, a.desc);
  fmt::print("{}", a.json ? gt::runs_jsonl(table) : a.csv ? gt::runs_csv(table) : gt::runs_text(table));
  return 0;
}

int cmd_devices() {
  const gt::CpuInfo cpu = gt::query_cpu();
  fmt::print(
      "cpu: {} — {} logical cores, {}\n     {}\n     f32 products: {}\n     bf16/fp16 instructions: {}\n"
      "     bf16 products: {}\n     other kernels: {}\n     3x3 convolutions: {}\n     fused chains: {}\n",
      cpu.model, cpu.cores, cpu.simd, cpu.blas, cpu.sgemm_path, cpu.half, cpu.bf16_path, cpu.kernel_isa, cpu.conv_algo,
      cpu.fusion);
  const gt::CudaInfo cuda = gt::query_cuda();
  if (!cuda.built) {
    fmt::print("cuda: not available: {}\n", cuda.problem);
    return 0;
  }
  fmt::print("cuda: driver {}, runtime {}, cuBLAS {}.{}.{}, cuDNN {}.{}.{}, NCCL {}.{}.{}\n",
             cuda.driver_version ? gt::format_cuda_version(cuda.driver_version) : "not loaded",
             gt::format_cuda_version(cuda.runtime_version), cuda.cublas_version / 10000,
             cuda.cublas_version / 100 % 100, cuda.cublas_version % 100, cuda.cudnn_version / 10000,
             cuda.cudnn_version / 100 % 100, cuda.cudnn_version % 100, cuda.nccl_version / 10000,
             cuda.nccl_version / 100 % 100, cuda.nccl_version % 100);
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

// The model `exp` describes, checked against its data (batch size, the loss against the output). Shapes only: no
// parameter is created, so a model too large for this machine is still sized, not allocated.
gt::Model checked_model(const gt::Experiment& exp, const gt::LoadedData& data) {
  gt::Model model = gt::Model::build(exp.root["model"], data.train.input_shape(), gt::DType::f32, gt::Device::cpu(),
                                     exp.seed, /*init_params=*/false);
  model.check_batch(exp.data.batch_size, exp.root["data"]["batch_size"]);
  gt::apply_recompute(exp, model);
  gt::check_graph_layers(exp, model);
  gt::check_loss_fits(exp.loss, model.output_shape(), data.train,
                      exp.root.has("loss") ? exp.root["loss"] : exp.root["model"]["layers"], &data.test);
  return model;
}

// Per-rank memory at `world` ranks under each ZeRO stage, and what would fit when nothing does (`check --world-size`).
std::vector<gt::RankShare> rank_shares_here(const gt::Experiment& exp, const gt::LoadedData& data,
                                            const gt::Footprint& f, int64_t world, std::string& advice) {
  // One rank on one device of the kind the config asks for: the device's verdict, for any number of bytes.
  const gt::MemoryFit base = gt::fit_on_this_machine(0, exp.devices.empty() ? exp.device : exp.devices[0]);
  const auto judge = [&base](size_t bytes) {
    gt::MemoryFit m = base;
    m.needed = bytes;
    if (base.fits) m.fits = bytes <= base.usable;
    return m;
  };
  const auto footprint_with = [&](gt::Recompute mode, int64_t batch,
                                  int64_t accumulate) -> std::optional<gt::Footprint> {
    gt::Experiment e = exp;
    e.train.recompute = mode;
    e.data.batch_size = batch;
    e.train.accumulate = accumulate;
    gt::Model m = gt::Model::build(e.root["model"], data.train.input_shape(), gt::DType::f32, gt::Device::cpu(), e.seed,
                                   /*init_params=*/false);
    if (!m.set_recompute(mode).empty()) return std::nullopt;
    m.set_activation_storage(gt::half_format(e.train.precision));
    return gt::training_footprint(e, m, data.train);
  };
  std::vector<gt::RankShare> shares = gt::rank_shares(f, world, judge);
  advice = gt::fit_advice(f, world, judge, footprint_with);
  return shares;
}

// Token data whose shards are not here: the shapes come from the config (a window of data.block_size tokens; the
// vocabulary from data.vocab_size, else the model's output), so a GPT is sized before its data is downloaded.
// Empty when the shards are there, or the format's shapes come from its files.
std::optional<gt::LoadedData> token_shapes_without_shards(const gt::Experiment& exp) {
  if (exp.data.format != gt::DataFormat::tokens) return std::nullopt;
  for (const std::string& glob : {exp.data.train_tokens, exp.data.test_tokens})
    if (!glob.empty() && gt::glob_files(glob).empty()) {
      const int64_t t = exp.data.block_size;
      int64_t vocab = exp.data.vocab_size;
      if (vocab == 0) {
        const gt::Model m = gt::Model::build(exp.root["model"], gt::Shape{t}, gt::DType::f32, gt::Device::cpu(),
                                             exp.seed, /*init_params=*/false);
        vocab = m.output_shape().rank() == 2 ? m.output_shape()[1] : 0;
      }
      gt::LoadedData d;
      d.train.inputs = gt::Tensor::empty(gt::Shape{0, t}, gt::DType::f32);
      d.train.targets = gt::Tensor::empty(gt::Shape{0, t}, gt::DType::i32);
      d.train.num_classes = vocab;
      d.train.source = "the config (no shard matches " + glob + ")";
      spdlog::warn("check: no shard matches {}: sized from the config (windows of {} tokens, vocabulary {}{})", glob, t,
                   vocab, exp.data.vocab_size ? "" : ", the model's output: data.vocab_size is unset");
      return d;
    }
  return std::nullopt;
}

int cmd_check(const ConfigArgs& a, bool json, int64_t world) {
  if (json) quiet_log_for_machine_output();
  const gt::ConfigNode root = gt::load_config(a.file, a.sets);
  // Token configs are sized without their shards; other formats' shapes come from their files, checked as usual.
  gt::Experiment exp = gt::parse_experiment_without_data_files(root);
  std::optional<gt::LoadedData> shapes = token_shapes_without_shards(exp);
  if (!shapes) exp = gt::parse_experiment(root);
  const gt::LoadedData data = shapes ? std::move(*shapes) : gt::load_data(exp);
  const gt::Model model = checked_model(exp, data);
  gt::Footprint f = gt::training_footprint(exp, model, data.train);
  if (shapes) f.tokens_per_sample = exp.data.block_size;
  // A device list holds one replica per device: each GPU must fit one; CPU workers share the host's memory.
  const size_t replicas_here = !exp.devices.empty() && exp.devices[0] == "cpu" ? exp.devices.size() : size_t{1};
  const gt::MemoryFit fit =
      gt::fit_on_this_machine(f.total_bytes * replicas_here, exp.devices.empty() ? exp.device : exp.devices[0]);
  std::string advice;
  const std::vector<gt::RankShare> shares =
      world > 0 ? rank_shares_here(exp, data, f, world, advice) : std::vector<gt::RankShare>();
  if (json) {
    gt::JsonObject out = gt::footprint_json(f, fit)
                             .add("config", a.file)
                             .add("train_samples", data.train.size())
                             .add("test_samples", data.test.size());
    if (world > 0) {
      gt::add_rank_shares_json(out, shares, world, exp.dist.zero);
      out.add("advice", advice);
    }
    fmt::print("{}\n", out.str());
    return 0;
  }
  if (shapes)
    fmt::print("{}: valid, sized from the config: {}; batch {}\n\n{}", a.file, data.train.source, exp.data.batch_size,
               gt::footprint_report(f, fit, model.edges()));
  else
    fmt::print("{}: valid. {} training samples{}; batch {}\n\n{}", a.file, data.train.size(),
               data.test.size() ? fmt::format(", {} test samples", data.test.size()) : std::string(),
               exp.data.batch_size, gt::footprint_report(f, fit, model.edges()));
  if (world > 0) fmt::print("{}{}", gt::rank_shares_report(shares, world, exp.dist.zero), advice);
  if (exp.train.cuda_graphs) {
    const int64_t dropped = data.train.size() % exp.data.batch_size;
    fmt::print(
        "\ntrain.cuda_graphs: on one GPU, the step is captured into a CUDA graph after {} warm-up steps and "
        "replayed; {}\n",
        gt::StepLoop::kGraphWarmup,
        dropped ? fmt::format("the last {} samples of each epoch's order are dropped (a partial batch)", dropped)
                : std::string("every batch is full, none is dropped"));
  }
  return 0;
}

// The config as a run would take it: validated as `check` validates it (data, shapes, loss), then written as
// config.resolved.yaml holds it.
int cmd_config_print(const ConfigArgs& a) {
  quiet_log_for_machine_output();
  const gt::Experiment exp = gt::parse_experiment(gt::load_config(a.file, a.sets));
  const gt::Model model = checked_model(exp, gt::load_data(exp));
  fmt::print("{}", gt::run_config_text(gt::resolved_config_text(exp, model.resolved_layers())));
  return 0;
}

// What `check` verifies, without its report: the config, the data, the model's shapes, the loss against the output.
// `gputrain sweep` runs it on every trial's overrides before starting any; trials that share a data section (and
// seed) share its loading, which is most of the time taken (Fashion-MNIST: ~1 s each).
class TrialChecker {
 public:
  void operator()(const std::string& file, const std::vector<std::string>& sets);

 private:
  std::map<std::string, gt::LoadedData> m_data;
};

void TrialChecker::operator()(const std::string& file, const std::vector<std::string>& sets) {
  const gt::Experiment exp = gt::parse_experiment(gt::load_config(file, sets));
  const std::string key = fmt::format("{}\n{}", exp.seed, YAML::Dump(exp.root["data"].yaml()));
  auto it = m_data.find(key);
  if (it == m_data.end()) it = m_data.emplace(key, gt::load_data(exp)).first;
  checked_model(exp, it->second);
}

struct SweepArgs {
  ConfigArgs config;
  std::vector<std::string> grid, random;
  int64_t trials = 0;
  uint64_t seed = 0;
  std::string devices;
  int parallel = 1;
  std::string metric = "test_loss", mode, early_stop, out, emit;
  int grace = 1;
  double eta = 3;
  bool resume = false;
};

int cmd_sweep(const SweepArgs& a) {
  namespace fs = std::filesystem;
  std::vector<gt::SweepAxis> grid, random;
  for (const std::string& g : a.grid) grid.push_back(gt::parse_grid_axis(g));
  for (const std::string& r : a.random) random.push_back(gt::parse_random_axis(r));
  gt::SweepOptions opts;
  if (!a.devices.empty()) {
    std::vector<std::string> listed;
    for (size_t from = 0;;) {
      const size_t comma = a.devices.find(',', from);
      listed.push_back(a.devices.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
    for (const std::string& d : listed) {
      int v = -1;
      const auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
      if (ec != std::errc() || end != d.data() + d.size() || v < 0 || v > 1023)
        throw gt::ConfigError(fmt::format("--devices {}: {} is not a device number (0, 1, …)",
                                          gt::quote_if_needed(a.devices), gt::quote_if_needed(d)));
      if (std::find(opts.devices.begin(), opts.devices.end(), v) != opts.devices.end())
        throw gt::ConfigError(
            fmt::format("--devices {}: device {} is listed twice", gt::quote_if_needed(a.devices), v));
      opts.devices.push_back(v);
    }
  }
  opts.parallel = a.parallel;
  opts.metric = a.metric;
  if (!a.mode.empty() && a.mode != "min" && a.mode != "max")
    throw gt::ConfigError(fmt::format("--mode {}: expected min or max", gt::quote_if_needed(a.mode)));
  opts.maximize = a.mode.empty() ? a.metric.find("accuracy") != std::string::npos : a.mode == "max";
  if (a.early_stop == "median")
    opts.early_stop.rule = gt::EarlyStopRule::median;
  else if (a.early_stop == "asha")
    opts.early_stop.rule = gt::EarlyStopRule::asha;
  else if (!a.early_stop.empty())
    throw gt::ConfigError(fmt::format("--early-stop {}: expected median or asha", gt::quote_if_needed(a.early_stop)));
  opts.early_stop.maximize = opts.maximize;
  opts.early_stop.grace = a.grace;
  opts.early_stop.eta = a.eta;
  opts.resume = a.resume;
  if (a.resume && a.out.empty()) throw gt::ConfigError("sweep --resume: name the sweep's folder with --out DIR");
  if (!a.emit.empty() && a.emit != "slurm")
    throw gt::ConfigError(fmt::format("--emit {}: expected slurm", gt::quote_if_needed(a.emit)));
  opts.out = a.out;
  if (opts.out.empty()) {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    opts.out = (fs::path("sweeps") / fmt::format("{}-{}", fs::path(a.config.file).stem().string(), stamp)).string();
  }
  // A resume may name CONFIG alone: the plan is then the one sweep.json records.
  gt::SweepPlan plan;
  if (a.resume && grid.empty() && random.empty()) {
    std::error_code ec;
    plan.config = fs::absolute(a.config.file, ec).lexically_normal().string();
  } else {
    plan = gt::plan_sweep(a.config.file, a.config.sets, grid, random, a.trials, a.seed);
  }
  if (!a.emit.empty()) {
    TrialChecker check_trial_config;
    for (const gt::SweepTrial& t : plan.trials) {
      std::vector<std::string> sets = plan.sets;
      for (const std::string& o : t.overrides()) sets.push_back(o);
      try {
        check_trial_config(plan.config, sets);
      } catch (const gt::Error& e) {
        throw gt::Error(e.kind(), fmt::format("trial {} ({}): {}", t.index, t.name, e.what()));
      }
    }
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    fmt::print("{}\n", gt::write_slurm_script(plan, opts.out,
                                              opts.devices.empty() ? a.parallel : static_cast<int>(opts.devices.size()),
                                              ec ? std::string("gputrain") : exe.string()));
    return 0;
  }
  TrialChecker check_trial_config;
  const gt::SweepResult r =
      gt::run_sweep(plan, opts, [&](const std::string& config, const std::vector<std::string>& sets) {
        check_trial_config(config, sets);
      });
  fmt::print("{}", r.table);
  fmt::print(stderr,
             "sweep {}: {} started, {} completed, {} stopped early, {} failed, {} interrupted, {} done before; "
             "sweep.csv, sweep.jsonl, report.html written\n",
             opts.out, r.started, r.completed, r.stopped_early, r.failed, r.interrupted, r.skipped);
  return r.exit_code;
}

int cmd_generate(ConfigArgs a, gt::GenerateOptions opts, const std::string& device, const std::string& seed) {
  if (!device.empty()) a.sets.push_back("device=" + device);
  gt::ConfigNode root = gt::load_config(a.file, a.sets);
  if (!seed.empty()) root = gt::apply_override(root, "seed=" + seed);  // checked as the config's seed is
  // Generation reads no data file (a token model's shapes are in the config): their paths are not checked.
  const gt::Experiment exp = gt::parse_experiment_without_data_files(root);
  opts.sampling.seed = exp.seed;
  const gt::GenerateSummary r = gt::generate_text(exp, opts, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  if (r.bytes && isatty(fileno(stdout))) std::fputc('\n', stdout);  // a terminal's prompt on a line of its own
  std::fflush(stdout);
  fmt::print(stderr, "generated {} tokens after a prompt of {} in {:.2f} s ({:.1f} tokens/s); window {} positions{}\n",
             r.new_tokens, r.prompt_tokens, r.seconds,
             r.seconds > 0 ? static_cast<double>(r.new_tokens) / r.seconds : 0.0, r.window,
             r.slides ? fmt::format(", slid {} times", r.slides) : std::string());
  return 0;
}

}  // namespace

// SIGINT, SIGTERM and SIGUSR1 are caught before any library initialiser runs: the executable's .preinit_array runs
// first of all, as soon as the dynamic loader has mapped and relocated the libraries (cuBLASLt's initialisers alone
// then take tens of milliseconds). A signal from there on is remembered and ends a training run the documented way
// (75, or 130); main gives every other command the default actions back. bench/signal_window.py measures what is left
// of the window (docs/files.md).
namespace {
void catch_stop_signals_early(int, char**, char**) { gt::install_stop_handlers(); }
}  // namespace
__attribute__((section(".preinit_array"),
               used)) static void (*const g_preinit_stop_handlers)(int, char**, char**) = catch_stop_signals_early;

int main(int argc, char** argv) {
  gt::init_logging();
  CLI::App app{"gputrain — train neural networks from YAML experiment files on the CPU and NVIDIA GPUs.\n" +
               std::string(kExitCodes)};
  app.set_version_flag("--version", std::string("gputrain ") + GPUTRAIN_VERSION);
  app.require_subcommand(1);

  ConfigArgs train_args;
  gt::RunOptions run;
  std::string device;
  std::string epochs, max_steps, seed, precision;  // passed on as --set values, so errors name the key they set
  bool quiet = false;
  auto* train = app.add_subcommand("train", "train a model from an experiment file");
  add_config_args(train, train_args);
  train->add_option("--out", run.out_dir, "run directory (default runs/<name>/<YYYYmmdd-HHMMSS>)")
      ->check(gt::cli::non_empty("a run directory"));
  train
      ->add_option("--resume", run.resume,
                   "auto: continue from the newest checkpoint that verifies in --out (default: the newest run of "
                   "this config's name), or start fresh if there is none; PATH: a checkpoint or run directory")
      ->type_name("auto|PATH")
      ->check(gt::cli::non_empty("auto or a checkpoint or run directory"));
  train->add_option("--device", device, "auto | cpu | cuda | cuda:N (overrides device:)");
  train->add_option("--epochs", epochs, "overrides train.epochs")->type_name("N");
  train
      ->add_option("--max-steps", max_steps,
                   "train N steps: sets train.max_steps and, without --epochs, lifts train.epochs (with both, the "
                   "first limit reached ends the run)")
      ->type_name("N");
  train->add_option("--seed", seed, "overrides seed")->type_name("N");
  train->add_option("--precision", precision, "fp32 | tf32 | bf16 | fp16 (overrides train.precision)");
  train->add_option("--threads", run.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 4096));
  train->add_flag("--quiet", quiet, "log warnings and errors only");
  train->add_flag_callback(
      "--no-progress", [&run] { run.progress = false; },
      "periodic log lines instead of the live progress bar on a terminal");
  bool profile = false;
  train->add_flag("--profile", profile,
                  "profile steps 5-24 (or train.profile: {start_step, steps}): trace.json and a per-layer table");
  train->footer(kExitCodes);

  ConfigArgs check_args;
  bool check_json = false;
  auto* check = app.add_subcommand("check",
                                   "validate an experiment file and print, without training, each layer's "
                                   "FLOPs and memory, the totals, and whether they fit the device");
  add_config_args(check, check_args);
  check->add_flag("--json", check_json, "print one JSON object (layers, totals, fits) instead of the table");
  int64_t check_world = 0;
  check
      ->add_option("--world-size", check_world,
                   "also size one rank of a data-parallel run at N ranks under ZeRO stages 0, 1 and 2, and say "
                   "what would fit when none does (--json: world_size, per_rank_bytes, zero_stages)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));

  ConfigArgs eval_args;
  std::string checkpoint;
  bool eval_json = false;
  int eval_threads = 0;
  auto* eval = app.add_subcommand("eval", "test-set loss and accuracy of saved weights (a run's model.safetensors)");
  add_config_args(eval, eval_args);
  eval->add_option("--checkpoint", checkpoint,
                   "weights: a .safetensors file, a checkpoint folder, or a run directory (its final weights, else its "
                   "newest good checkpoint); default: the run directory given as CONFIG")
      ->check(gt::cli::non_empty("weights: a .safetensors file, a checkpoint folder or a run directory"));
  eval->add_flag("--json", eval_json, "print one JSON object instead of a line");
  eval->add_option("--threads", eval_threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 4096));

  ConfigArgs gen_args;
  gt::GenerateOptions gen;
  std::string gen_device, gen_seed;
  auto* generate = app.add_subcommand("generate",
                                      "sample tokens from a token model's saved weights (text for a byte vocabulary), "
                                      "with a key/value cache");
  add_config_args(generate, gen_args);
  generate
      ->add_option("--checkpoint", gen.checkpoint,
                   "weights: a .safetensors file, a checkpoint folder, or a run directory (as eval takes them); "
                   "default: the run directory given as CONFIG")
      ->check(gt::cli::non_empty("weights: a .safetensors file, a checkpoint folder or a run directory"));
  generate
      ->add_option_function<std::string>(
          "--prompt",
          [&gen](const std::string& p) {
            gen.prompt = p;
            gen.has_prompt = true;
          },
          "the start: text (UTF-8 bytes) for a byte model (256 classes), else token ids separated by commas or "
          "spaces (default: a newline; <|endoftext|> 50256 for GPT-2 vocabularies, else token 0)")
      ->type_name("TEXT");
  generate->add_option("--tokens", gen.tokens, "new tokens to sample (default 256)")->check(CLI::Range(0, 1000000000));
  generate->add_option("--temperature", gen.sampling.temperature, "softmax temperature; 0 = greedy argmax (default 1)")
      ->check(CLI::Range(0.0, 1000.0));
  generate->add_option("--top-k", gen.sampling.top_k, "sample among the K most likely tokens only (default 0: all)")
      ->check(CLI::Range(0, 1000000000));
  generate->add_option("--seed", gen_seed, "the draws' seed (default: the config's seed)");
  generate->add_option("--device", gen_device, "auto | cpu | cuda | cuda:N (overrides device:)");
  generate->add_option("--threads", gen.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 4096));
  generate->footer(
      "Prints the prompt, then each token as it is drawn: raw bytes for a byte model, ids otherwise. The context is "
      "the "
      "model's T positions (its input [T]): past T the window slides, keeping the newest T/2 tokens. A line with the "
      "rate goes to stderr. " +
      std::string(kExitCodes));

  std::string export_from, export_to;
  auto* exporter = app.add_subcommand("export",
                                      "write a checkpoint's weights alone, as one safetensors file (or, with `export "
                                      "llmc`, a GPT's as an llm.c checkpoint)");
  // Not marked required: `export llmc …` has neither; without a subcommand both are checked below (exit 2).
  exporter->add_option("checkpoint", export_from, "a checkpoint folder (checkpoints/step-N) or a run directory")
      ->check(gt::cli::non_empty("a checkpoint folder or a run directory"));
  exporter->add_option("--to", export_to, "the safetensors file to write")
      ->check(gt::cli::non_empty("a safetensors file to write"));
  exporter->require_subcommand(0, 1);
  ConfigArgs export_llmc_args;
  std::string export_llmc_weights, export_llmc_out;
  bool export_bf16 = false;
  auto* export_llmc = exporter->add_subcommand(
      "llmc", "write a GPT's weights as an llm.c checkpoint (train_gpt2.c's model file) that llm.c continues from");
  add_config_args(export_llmc, export_llmc_args);
  export_llmc
      ->add_option("--checkpoint", export_llmc_weights,
                   "weights: a .safetensors file, a checkpoint folder, or a run directory (as eval takes them); "
                   "default: the run directory given as CONFIG")
      ->check(gt::cli::non_empty("weights: a .safetensors file, a checkpoint folder or a run directory"));
  export_llmc->add_option("--out", export_llmc_out, "the llm.c checkpoint file to write (MODEL.bin)")
      ->required()
      ->check(gt::cli::non_empty("the llm.c checkpoint file to write"));
  export_llmc->add_flag("--bf16", export_bf16,
                        "bf16 parameters (llm.c version 5, rounded to nearest even); default f32 (version 3)");

  auto* importer = app.add_subcommand("import", "convert a model from another tool into an experiment folder");
  importer->require_subcommand(1);
  std::string import_bin, import_out;
  auto* import_llmc = importer->add_subcommand(
      "llmc",
      "read an llm.c GPT-2 checkpoint (version 3 f32 or 5 bf16) into DIR/config.yaml and DIR/model.safetensors");
  import_llmc->add_option("model", import_bin, "llm.c's model file (gpt2_124M.bin, a model_*.bin checkpoint)")
      ->required()
      ->check(gt::cli::non_empty("llm.c's model file"));
  import_llmc->add_option("--out", import_out, "the folder to write config.yaml and model.safetensors into")
      ->required()
      ->check(gt::cli::non_empty("the folder to write the model into"));
  bool import_force = false;
  import_llmc->add_flag("--force", import_force,
                        "replace an earlier import in DIR (without --force such a folder is refused)");

  std::string report_dir, report_out;
  auto* report = app.add_subcommand("report",
                                    "write report.html (charts, summary, config) of a run directory, "
                                    "finished or still running");
  report->add_option("run_dir", report_dir, "the run directory")
      ->required()
      ->check(gt::cli::non_empty("a run directory"));
  report->add_option("--out", report_out, "the HTML file to write (default RUN_DIR/report.html)")
      ->check(gt::cli::non_empty("the HTML file to write"));

  std::vector<std::string> tokenize_inputs;
  std::string tokenize_out;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  auto* tokenize = app.add_subcommand(
      "tokenize",
      "byte-level tokens (vocabulary 256) of text files as llm.c token shards: OUT/train_000000.bin …, "
      "OUT/val_000000.bin … and OUT/tokenizer.json, for data.format: tokens");
  tokenize->add_option("files", tokenize_inputs, "text files, concatenated in this order")->required();
  tokenize->add_option("--out", tokenize_out, "the directory to write the shards into")->required();
  tokenize->add_option("--val-fraction", val_fraction, "the last fraction of the bytes, for validation (default 0.1)");
  tokenize->add_option("--shard-tokens", shard_tokens, "tokens per shard at most (default 100000000, as llm.c)");
  bool tokenize_force = false;
  tokenize->add_flag("--force", tokenize_force,
                     "replace an earlier tokenization in OUT: its shards and tokenizer.json are removed first, so no "
                     "stale shard outlives it (without --force such a folder is refused)");

  RunsArgs runs_args;
  auto* runs = app.add_subcommand("runs",
                                  "compare run directories: one row per run with the config keys that differ, how it "
                                  "ended, steps, wall time and final metrics");
  runs->add_option("dirs", runs_args.dirs,
                   "run directories, or folders holding them (directly or one level down, as runs/<name>/<time>/)")
      ->required()
      ->check(gt::cli::non_empty("run directories or folders holding them"));
  runs->add_option("--sort", runs_args.sort, "sort by a column (a metric, a config key, status, steps, wall_s, run)")
      ->type_name("KEY");
  runs->add_flag("--desc", runs_args.desc, "sort descending (missing values stay last)");
  auto* runs_json = runs->add_flag("--json", runs_args.json, "one JSON object per run and line, instead of the table");
  runs->add_flag("--csv", runs_args.csv, "CSV with a header line, instead of the table")->excludes(runs_json);
  runs->footer(
      "Status: completed, max_steps, interrupted, diverged (summary.json's exit_reason); running (no summary.json, "
      "its process alive); failed (no summary.json, no process: an error or a kill ended it); unreadable (a "
      "summary.json that cannot be read: corrupt, cut short, or not a regular file). Warnings go to stderr. Exit "
      "codes: 0 listed; 1 no run found; 2 usage error (a bad flag, a missing folder, an unknown "
      "--sort column).");

  auto* config_cmd =
      app.add_subcommand("config", "the config language: its JSON Schema, and a config as a run takes it");
  config_cmd->require_subcommand(1);
  auto* config_schema = config_cmd->add_subcommand(
      "schema",
      "print the JSON Schema (draft 2020-12) of experiment files, generated from the tables that validate them; "
      "editors complete and check a config that starts with `# yaml-language-server: $schema=FILE`");
  ConfigArgs config_print_args;
  auto* config_print = config_cmd->add_subcommand(
      "print",
      "print CONFIG after its --set overrides with every default filled in, as config.resolved.yaml holds it; "
      "validated as check validates it (exit 2 on a config error)");
  add_config_args(config_print, config_print_args);

  SweepArgs sweep_args;
  auto* sweep =
      app.add_subcommand("sweep",
                         "run a hyperparameter sweep: one `gputrain train` child process per trial, N at once "
                         "on the CPU or one per GPU; resumable; a table sorted by the metric at the end");
  add_config_args(sweep, sweep_args.config);
  sweep->add_option("--grid", sweep_args.grid, "a swept key and its values: every combination of the --grid axes runs")
      ->type_name("KEY=V1,V2,…")
      ->allow_extra_args(false);
  sweep
      ->add_option("--random", sweep_args.random,
                   "a key drawn at random per trial: LO:HI (uniform; integers when both ends are), LO:HI:log "
                   "(log-uniform), or V1,V2,… (one of them)")
      ->type_name("KEY=LO:HI[:log]|KEY=V1,V2,…")
      ->allow_extra_args(false);
  sweep->add_option("--trials", sweep_args.trials, "random draws (for each grid point)")
      ->check(CLI::Range(int64_t{1}, gt::kMaxSweepTrials));
  sweep->add_option("--seed", sweep_args.seed,
                    "the random draws' seed (default 0): the same seed draws the same trials");
  auto* sweep_devices = sweep->add_option(
      "--devices", sweep_args.devices,
      "GPUs to run on, one trial per GPU at a time, each trial seeing only its own (CUDA_VISIBLE_DEVICES)");
  sweep_devices->type_name("0,1,…");
  sweep->add_option("--parallel", sweep_args.parallel, "trials at once on the CPU, the cores divided between them (1)")
      ->check(CLI::Range(1, 1024))
      ->excludes(sweep_devices);
  sweep->add_option("--metric", sweep_args.metric,
                    "what to sort by and stop early on: a summary.json number that metrics.jsonl rows also carry "
                    "(test_loss, test_accuracy; default test_loss)");
  sweep->add_option("--mode", sweep_args.mode,
                    "min or max: which end of the metric is better (default: max for an "
                    "accuracy, else min)");
  sweep
      ->add_option("--early-stop", sweep_args.early_stop,
                   "median: stop a trial whose best metric is worse than the median of the others at the same step; "
                   "asha: asynchronous successive halving, rungs at the 1st, 3rd, 9th … evaluation, top 1/3 go on")
      ->type_name("median|asha");
  sweep
      ->add_option("--grace", sweep_args.grace,
                   "evaluations every trial reaches before the median rule judges it; asha's first rung (1)")
      ->check(CLI::Range(1, 1000000));
  sweep->add_option("--eta", sweep_args.eta, "asha's reduction factor: the top 1/eta of a rung go on (3)")
      ->check(CLI::Range(1.5, 1000.0));
  sweep->add_option("--out", sweep_args.out, "the sweep's folder (default sweeps/<config>-<YYYYmmdd-HHMMSS>)")
      ->check(gt::cli::non_empty("the sweep's folder"));
  sweep->add_flag("--resume", sweep_args.resume,
                  "continue the sweep in --out: skip completed trials, resume interrupted ones from their "
                  "checkpoints, re-run failed ones");
  sweep
      ->add_option("--emit", sweep_args.emit,
                   "slurm: write DIR/sweep.sbatch (a job array, one task per trial, --parallel at once) and print "
                   "its path instead of running")
      ->type_name("slurm");
  sweep->footer(
      "Each trial is a run directory DIR/<index>-<key=value,…>/ (its console output in console.log there). Exit "
      "codes: 0 every trial completed (or was stopped early); 1 a trial failed (reported at once with its exit code "
      "and the end of its output; the others go on); 2 a bad flag or a trial's config is invalid (nothing started); "
      "75 stopped by SIGINT/SIGTERM: the running trials wrote checkpoints, --resume continues.");

  auto* data_cmd = app.add_subcommand("data", "look at the data a config names");
  data_cmd->require_subcommand(1);
  ConfigArgs inspect_args;
  bool inspect_json = false;
  auto* data_inspect = data_cmd->add_subcommand(
      "inspect",
      "per split (train, test): samples, shapes, value range, mean and std per channel, samples per class; token "
      "data: token count, distinct tokens, id range. Reads the data as training does (exit 2 on a config error)");
  add_config_args(data_inspect, inspect_args);
  data_inspect->add_flag("--json", inspect_json, "print one JSON object {\"config\", \"splits\": [...]}");

  auto* devices = app.add_subcommand("devices", "list compute devices and the CUDA library versions found");
  auto* layers = app.add_subcommand("layers", "print the layer reference (Markdown), generated from the registry");

  if (argc == 1) {  // bare `gputrain`: what it is and how to start, not an error
    std::cout << app.help() << "\nExamples:\n"
              << "  gputrain train configs/fashion_mnist_mlp.yaml optimizer.lr=0.05 --epochs 3\n"
              << "  gputrain check configs/gpt2_124m.yaml --json\n"
              << "  gputrain generate runs/gpt_bytes/20261204-101500 --prompt 'Once upon a time'\n";
    return 0;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << "error: " << e.what() << "\n";
    // An override written as a flag (Lightning's --optimizer.lr=0.02): say how gputrain takes it.
    for (int i = 1; i < argc; ++i) {
      const std::string_view w = argv[i];
      const size_t eq = w.find('=');
      if (w.rfind("--", 0) == 0 && w.find('.') < eq && eq != std::string_view::npos) {
        std::cerr << "an override is --set " << w.substr(2) << " (or " << w.substr(2) << " after CONFIG)\n";
        return 2;
      }
    }
    std::cerr << "Run with --help for usage.\n";
    return 2;
  }

  // A training run (or a sweep) keeps the handlers through its set-up: a signal while the data loads or the ranks
  // meet still ends it with 75 (or 130). Every other command gets the default actions back, and takes one that came
  // while it was parsed the default way now.
  if (!*train && !*sweep) {
    const int pending = gt::stop_requested();
    gt::remove_stop_handlers();  // the ones .preinit_array installed
    if (pending) std::raise(pending);
  }
  // Outside the try block: on a failure the other ranks must be ended (comm->abort) after the message is logged.
  std::unique_ptr<gt::Communicator> comm;
  auto fail = [&](int code) {
    if (comm && comm->size() > 1) comm->abort(code);
    return code;
  };
  try {
    gt::cpu::env_cpu_isa();  // GPUTRAIN_CPU_ISA, read (or refused) here on the main thread, before any kernel runs
    gt::cpu::env_cpu_conv_algo();  // GPUTRAIN_CPU_CONV, likewise
    gt::cpu::env_cpu_fusion();     // GPUTRAIN_CPU_FUSE, likewise
    // CONFIG, --config and bare overrides become the file and the --set list of the command that runs.
    for (auto [cmd, args] : {std::pair{train, &train_args}, std::pair{check, &check_args}, std::pair{eval, &eval_args},
                             std::pair{generate, &gen_args}, std::pair{export_llmc, &export_llmc_args},
                             std::pair{config_print, &config_print_args}, std::pair{sweep, &sweep_args.config},
                             std::pair{data_inspect, &inspect_args}})
      if (*cmd) args->resolve();
    // Weights default to the run directory named as CONFIG.
    auto weights_or_run = [](std::string& weights, const ConfigArgs& a) {
      if (!weights.empty()) return;
      if (a.run_dir.empty())
        throw gt::ConfigError("--checkpoint PATH is needed (the weights), or give a run directory as CONFIG");
      weights = a.run_dir;
    };
    if (*eval) weights_or_run(checkpoint, eval_args);
    if (*generate) weights_or_run(gen.checkpoint, gen_args);
    if (*export_llmc) weights_or_run(export_llmc_weights, export_llmc_args);
    if (*devices) return cmd_devices();
    if (*runs) return cmd_runs(runs_args);
    if (*sweep) return cmd_sweep(sweep_args);
    if (*layers) {
      fmt::print("{}", gt::layer_reference_markdown());
      return 0;
    }
    if (*check) return cmd_check(check_args, check_json, check_world);
    if (*config_schema) {
      fmt::print("{}", gt::config_json_schema());
      return 0;
    }
    if (*config_print) return cmd_config_print(config_print_args);
    if (*data_inspect) {
      if (inspect_json) quiet_log_for_machine_output();
      const gt::Experiment exp = gt::parse_experiment(gt::load_config(inspect_args.file, inspect_args.sets));
      const gt::LoadedData data = gt::load_data(exp);
      const bool test_only = exp.data.format == gt::DataFormat::tokens && exp.data.train_tokens.empty();
      std::vector<gt::DataStats> splits;
      if (!test_only) splits.push_back(gt::inspect_dataset(data.train, "train", exp.data.train_tokens));
      if (data.test.size() > 0) splits.push_back(gt::inspect_dataset(data.test, "test", exp.data.test_tokens));
      if (inspect_json) {
        std::string rows;
        for (const gt::DataStats& s : splits) rows += (rows.empty() ? "" : ", ") + gt::data_stats_json(s);
        fmt::print("{{\"config\": {}, \"splits\": [{}]}}\n", gt::json_quote(inspect_args.file), rows);
      } else {
        for (const gt::DataStats& s : splits) fmt::print("{}", gt::data_stats_text(s));
      }
      return 0;
    }
    if (*export_llmc) {
      fmt::print("{}\n", gt::export_llmc(export_llmc_args.file, export_llmc_args.sets, export_llmc_weights,
                                         export_llmc_out, export_bf16));
      return 0;
    }
    if (*exporter) {
      if (export_from.empty() || export_to.empty()) {
        std::cerr << "error: export needs CHECKPOINT and --to FILE (or: export llmc CONFIG --checkpoint PATH --out "
                     "MODEL.bin)\nRun with --help for usage.\n";
        return 2;
      }
      return cmd_export(export_from, export_to);
    }
    if (*import_llmc) {
      const gt::LlmcImport r = gt::import_llmc(import_bin, import_out, import_force);
      if (!r.replaced.empty())
        fmt::print("{}: replaced the earlier import ({} files removed)\n", import_out, r.replaced.size());
      fmt::print("{}\n", r.summary);
      return 0;
    }
    if (*generate) return cmd_generate(gen_args, gen, gen_device, gen_seed);
    if (*tokenize) {
      const gt::TokenizeResult r =
          gt::tokenize_bytes(tokenize_inputs, tokenize_out, val_fraction, shard_tokens, tokenize_force);
      if (!r.replaced.empty())
        fmt::print("{}: replaced the earlier tokenization ({} files removed)\n", tokenize_out, r.replaced.size());
      fmt::print("{}: {} training and {} validation tokens (bytes) in {} shard(s), and tokenizer.json\n", tokenize_out,
                 r.train_tokens, r.val_tokens, r.files.size());
      return 0;
    }
    if (*report) {
      // A run's report.html is the report's own file; anything else of a run (or of another output) is not.
      if (!report_out.empty()) gt::refuse_output_file("--out", report_out, {}, {"report.html"});
      const gt::ReportInfo r = gt::write_report(report_dir, report_out);
      fmt::print("{}: {} train rows, {} eval rows, {} charts{}{}\n", r.path, r.train_rows, r.eval_rows, r.charts,
                 r.skipped_lines ? fmt::format(", {} unparsable lines skipped", r.skipped_lines) : std::string(),
                 r.finished ? "" : " (no summary.json: running or stopped)");
      return 0;
    }
    if (*eval) {
      if (eval_json) quiet_log_for_machine_output();
      const gt::ConfigNode root = gt::load_config(eval_args.file, eval_args.sets);
      // Evaluation reads the test set: a token config whose training shards are gone (a run directory copied
      // without them) is evaluated on its test shards alone; other formats are checked as training checks them.
      gt::Experiment exp = gt::parse_experiment_without_data_files(root);
      if (exp.data.format == gt::DataFormat::tokens && !exp.data.test_tokens.empty() &&
          gt::glob_files(exp.data.train_tokens).empty()) {
        spdlog::warn("eval: no shard matches {}: the test shards alone give the shapes and the vocabulary",
                     exp.data.train_tokens);
        exp.data.train_tokens.clear();
      } else {
        exp = gt::parse_experiment(root);
      }
      const gt::EvalSummary r = gt::evaluate_weights(exp, checkpoint, eval_threads);
      if (eval_json) {
        fmt::print("{}\n", gt::JsonObject()
                               .add("checkpoint", checkpoint)
                               .add("samples", r.samples)
                               .add("test_loss", r.loss)
                               .add("test_accuracy", r.accuracy)
                               .add("test_bpb", r.bpb)
                               .add("tokens", r.tokens)
                               .str());
      } else {
        fmt::print("{}: test_loss {:.4f} | test_accuracy {}{} ({} samples{})\n", checkpoint, r.loss,
                   r.accuracy ? fmt::format("{:.4f}", *r.accuracy) : "n/a",
                   r.bpb ? fmt::format(" | test_bpb {:.4f}", *r.bpb) : "", r.samples,
                   r.tokens ? fmt::format(", {} tokens", r.tokens) : "");
      }
      return 0;
    }
    // Command-line flags are overrides like --set, so errors in them name the key they set.
    if (!device.empty()) train_args.sets.push_back("device=" + device);
    gt::ConfigNode root = gt::load_config(train_args.file, train_args.sets);
    auto set_train = [&](const std::string& key, const std::string& v) {
      if (!root.has("train")) {
        YAML::Node top = root.yaml();  // shares the tree: YAML nodes are references
        top["train"] = YAML::Node(YAML::NodeType::Map);
      }
      root = gt::apply_override(root, fmt::format("train.{}={}", key, v));
    };
    run.overrides = train_args.sets;  // (device= is among them)
    // --max-steps N trains N steps: without --epochs it lifts the config's epochs (to the most there may be), so
    // that the flag, not the file, decides where the run ends. With both flags, the first limit reached ends it.
    const bool lift_epochs = !max_steps.empty() && epochs.empty() && max_steps != "0";
    if (lift_epochs) epochs = std::to_string(gt::limits::kEpochs.max);
    if (!epochs.empty()) set_train("epochs", epochs);
    if (!max_steps.empty()) set_train("max_steps", max_steps);
    if (!precision.empty()) set_train("precision", precision);
    if (!seed.empty()) root = gt::apply_override(root, "seed=" + seed);
    if (!epochs.empty()) run.overrides.push_back("train.epochs=" + epochs);
    if (!max_steps.empty()) run.overrides.push_back("train.max_steps=" + max_steps);
    if (!precision.empty()) run.overrides.push_back("train.precision=" + precision);
    if (!seed.empty()) run.overrides.push_back("seed=" + seed);
    if (profile && !root["train"].has("profile")) {
      if (!root.has("train")) {
        YAML::Node top = root.yaml();
        top["train"] = YAML::Node(YAML::NodeType::Map);
      }
      root = gt::apply_override(root, "train.profile={start_step: 5, steps: 20}");
    }
    const gt::Experiment exp = gt::parse_experiment(root);
    // logging.level sets the console and train.log; --quiet still keeps warnings and errors only.
    spdlog::set_level(quiet ? spdlog::level::warn : gt::spdlog_level(exp.logging.level));
    // Under mpirun/srun every rank runs this; rank 0 logs and writes, the others log warnings and errors only.
    const gt::LaunchInfo launch = gt::detect_launch();
    if (launch.rank != 0) gt::set_log_rank(launch.rank);
    comm = gt::make_communicator(launch, exp.dist.timeout_s);
    run.comm = comm.get();
    run.local_rank = launch.local_rank;
    run.launched = launch.launcher != "none";
    return exit_code_for(gt::run_training(exp, run));
  } catch (const gt::Error& e) {
    spdlog::error("{}", e.what());
    switch (e.kind()) {
      case gt::ErrorKind::config: return fail(2);
      case gt::ErrorKind::distributed: return fail(3);
      case gt::ErrorKind::diverged: return fail(4);
      default: return fail(1);
    }
  } catch (const std::bad_alloc&) {
    spdlog::error("out of host memory");
    return fail(1);
  } catch (const std::exception& e) {
    spdlog::error("unexpected failure: {}", e.what());
    return fail(1);
  }
}
