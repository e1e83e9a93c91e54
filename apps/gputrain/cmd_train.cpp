// gputrain train and gputrain sweep: the commands that train, and keep the stop signals' handlers while they do.
#include "cli.h"

#include "core/limits.h"
#include "core/quote.h"
#include "graph/model.h"
#include "log/logging.h"
#include "log/settings.h"
#include "parallel/comm.h"
#include "parallel/launch.h"
#include "train/setup.h"
#include "train/sweep.h"
#include "train/trainer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>

namespace gt::cli {
namespace {

int exit_code_for(const RunSummary& s) {
  if (s.exit_reason == ExitReason::interrupted) return 75;
  if (s.exit_reason == ExitReason::diverged) return 4;
  return 0;
}

struct TrainArgs {
  ConfigArgs config;
  RunOptions run;
  std::string device, epochs, max_steps, seed, precision;  // passed on as overrides, so errors name the key they set
  bool quiet = false, profile = false;
  std::unique_ptr<Communicator> comm;
};

int train(TrainArgs& a, Context& ctx) {
  a.config.resolve();
  std::vector<std::string>& sets = a.config.sets;
  // The shorthand flags are overrides like --set, applied with the config, so an error in one names the key it
  // sets (a --set creates the train section when the file has none). --max-steps N trains N steps: without --epochs it
  // lifts the config's epochs (to the most there may be), so that the flag, not the file, decides where the run
  // ends; with both flags the first limit reached ends it.
  if (!a.max_steps.empty() && a.epochs.empty() && a.max_steps != "0") a.epochs = std::to_string(limits::kEpochs.max);
  a.run.overrides = sets;
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"device", a.device},
                                   {"train.epochs", a.epochs},
                                   {"train.max_steps", a.max_steps},
                                   {"train.precision", a.precision},
                                   {"seed", a.seed}}) {
    if (value.empty()) continue;
    sets.push_back(key + "=" + value);
    a.run.overrides.push_back(key + "=" + value);
  }
  ConfigNode root = load_config(a.config.file, sets);
  if (a.profile && !root["train"].has("profile"))
    root = apply_override(root, "train.profile={start_step: 5, steps: 20}");
  const Experiment exp = parse_experiment(root);
  // logging.level sets the console and train.log; --quiet still keeps warnings and errors only.
  spdlog::set_level(a.quiet ? spdlog::level::warn : spdlog_level(exp.logging.level));
  // Under mpirun/srun every rank runs this; rank 0 logs and writes, the others log warnings and errors only.
  const LaunchInfo launch = detect_launch();
  if (launch.rank != 0) set_log_rank(launch.rank);
  a.comm = make_communicator(launch, exp.dist.timeout_s);
  Communicator* comm = a.comm.get();
  ctx.abort_ranks = [comm](int code) {
    if (comm->size() > 1) comm->abort(code);
  };
  a.run.comm = comm;
  a.run.local_rank = launch.local_rank;
  a.run.launched = launch.launcher != "none";
  return exit_code_for(run_training(exp, a.run));
}

// What `check` verifies, without its report: the config, the data, the model's shapes, the loss against the output.
// `gputrain sweep` runs it on every trial's overrides before starting any; trials that share a data section (and
// seed) share its loading, which is most of the time taken (Fashion-MNIST: ~1 s each).
class TrialChecker {
 public:
  void operator()(const std::string& file, const std::vector<std::string>& sets) {
    const Experiment exp = parse_experiment(load_config(file, sets));
    const std::string key = fmt::format("{}\n{}", exp.seed, YAML::Dump(to_yaml(exp.data)));
    auto it = m_data.find(key);
    if (it == m_data.end()) it = m_data.emplace(key, load_data(exp)).first;
    checked_model(exp, it->second);
  }

 private:
  std::map<std::string, LoadedData> m_data;
};

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

std::vector<int> parse_devices(const std::string& devices) {
  std::vector<int> out;
  for (size_t from = 0;;) {
    const size_t comma = devices.find(',', from);
    const std::string d = devices.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    int v = -1;
    const auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
    if (ec != std::errc() || end != d.data() + d.size() || v < 0 || v > 1023)
      throw ConfigError(fmt::format("--devices {}: {} is not a device number (0, 1, …)", quote_if_needed(devices),
                                    quote_if_needed(d)));
    if (std::find(out.begin(), out.end(), v) != out.end())
      throw ConfigError(fmt::format("--devices {}: device {} is listed twice", quote_if_needed(devices), v));
    out.push_back(v);
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return out;
}

SweepOptions sweep_options(const SweepArgs& a) {
  namespace fs = std::filesystem;
  SweepOptions opts;
  if (!a.devices.empty()) opts.devices = parse_devices(a.devices);
  opts.parallel = a.parallel;
  opts.metric = a.metric;
  if (!a.mode.empty() && a.mode != "min" && a.mode != "max")
    throw ConfigError(fmt::format("--mode {}: expected min or max", quote_if_needed(a.mode)));
  opts.maximize = a.mode.empty() ? a.metric.find("accuracy") != std::string::npos : a.mode == "max";
  if (a.early_stop == "median")
    opts.early_stop.rule = EarlyStopRule::median;
  else if (a.early_stop == "asha")
    opts.early_stop.rule = EarlyStopRule::asha;
  else if (!a.early_stop.empty())
    throw ConfigError(fmt::format("--early-stop {}: expected median or asha", quote_if_needed(a.early_stop)));
  opts.early_stop.maximize = opts.maximize;
  opts.early_stop.grace = a.grace;
  opts.early_stop.eta = a.eta;
  opts.resume = a.resume;
  if (a.resume && a.out.empty()) throw ConfigError("sweep --resume: name the sweep's folder with --out DIR");
  if (!a.emit.empty() && a.emit != "slurm")
    throw ConfigError(fmt::format("--emit {}: expected slurm", quote_if_needed(a.emit)));
  opts.out = a.out;
  if (opts.out.empty()) {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    opts.out = (fs::path("sweeps") / fmt::format("{}-{}", fs::path(a.config.file).stem().string(), stamp)).string();
  }
  return opts;
}

int sweep(SweepArgs& a) {
  namespace fs = std::filesystem;
  a.config.resolve();
  std::vector<SweepAxis> grid, random;
  for (const std::string& g : a.grid) grid.push_back(parse_grid_axis(g));
  for (const std::string& r : a.random) random.push_back(parse_random_axis(r));
  const SweepOptions opts = sweep_options(a);
  // A resume may name CONFIG alone: the plan is then the one sweep.json records.
  SweepPlan plan;
  if (a.resume && grid.empty() && random.empty()) {
    std::error_code ec;
    plan.config = fs::absolute(a.config.file, ec).lexically_normal().string();
  } else {
    plan = plan_sweep(a.config.file, a.config.sets, grid, random, a.trials, a.seed);
  }
  TrialChecker check_trial_config;
  if (!a.emit.empty()) {
    for (const SweepTrial& t : plan.trials) {
      std::vector<std::string> sets = plan.sets;
      for (const std::string& o : t.overrides()) sets.push_back(o);
      try {
        check_trial_config(plan.config, sets);
      } catch (const Error& e) {
        throw Error(e.kind(), fmt::format("trial {} ({}): {}", t.index, t.name, e.what()));
      }
    }
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    fmt::print("{}\n", write_slurm_script(plan, opts.out,
                                          opts.devices.empty() ? a.parallel : static_cast<int>(opts.devices.size()),
                                          ec ? std::string("gputrain") : exe.string()));
    return 0;
  }
  const SweepResult r = run_sweep(plan, opts, [&](const std::string& config, const std::vector<std::string>& sets) {
    check_trial_config(config, sets);
  });
  fmt::print("{}", r.table);
  fmt::print(stderr,
             "sweep {}: {} started, {} completed, {} stopped early, {} failed, {} interrupted, {} done before; "
             "sweep.csv, sweep.jsonl, report.html written\n",
             opts.out, r.started, r.completed, r.stopped_early, r.failed, r.interrupted, r.skipped);
  return r.exit_code;
}

void add_train(CLI::App& app, Commands& commands) {
  auto [train, a] = commands.add_with<TrainArgs>(app, "train", "train a model from an experiment file", cli::train,
                                                 /*training=*/true);
  add_config_args(train, a->config);
  train->add_option("--out", a->run.out_dir, "run directory (default runs/<name>/<YYYYmmdd-HHMMSS>)")
      ->check(non_empty("a run directory"));
  train
      ->add_option("--resume", a->run.resume,
                   "auto: continue the unfinished run in --out (default: the newest unfinished run of this config's "
                   "name), or start fresh if there is none; PATH: a checkpoint or run directory")
      ->type_name("auto|PATH")
      ->check(non_empty("auto or a checkpoint or run directory"));
  train->add_option("--device", a->device, "auto | cpu | cuda | cuda:N (overrides device:)");
  train->add_option("--epochs", a->epochs, "overrides train.epochs")->type_name("N");
  train
      ->add_option("--max-steps", a->max_steps,
                   "train N steps: sets train.max_steps and, without --epochs, lifts train.epochs (with both, the "
                   "first limit reached ends the run)")
      ->type_name("N");
  train->add_option("--seed", a->seed, "overrides seed")->type_name("N");
  train->add_option("--precision", a->precision, "fp32 | tf32 | bf16 | fp16 (overrides train.precision)");
  train->add_option("--threads", a->run.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 4096));
  train->add_flag("--quiet", a->quiet, "log warnings and errors only");
  train->add_flag_callback(
      "--no-progress", [args = a] { args->run.progress = false; },
      "periodic log lines instead of the live progress bar on a terminal");
  train->add_flag("--profile", a->profile,
                  "profile steps 5-24 (or train.profile: {start_step, steps}): trace.json and a per-layer table");
  train->footer(kExitCodes);
}

void add_sweep(CLI::App& app, Commands& commands) {
  auto [sweep, a] = commands.add_with<SweepArgs>(
      app, "sweep",
      "run a hyperparameter sweep: one `gputrain train` child process per trial, N at once on the CPU or one per GPU; "
      "resumable; a table sorted by the metric at the end",
      cli::sweep, /*training=*/true);
  add_config_args(sweep, a->config);
  sweep->add_option("--grid", a->grid, "a swept key and its values: every combination of the --grid axes runs")
      ->type_name("KEY=V1,V2,…")
      ->allow_extra_args(false);
  sweep
      ->add_option("--random", a->random,
                   "a key drawn at random per trial: LO:HI (uniform; integers when both ends are), LO:HI:log "
                   "(log-uniform), or V1,V2,… (one of them)")
      ->type_name("KEY=LO:HI[:log]|KEY=V1,V2,…")
      ->allow_extra_args(false);
  sweep->add_option("--trials", a->trials, "random draws (for each grid point)")
      ->check(CLI::Range(int64_t{1}, kMaxSweepTrials));
  sweep->add_option("--seed", a->seed, "the random draws' seed (default 0): the same seed draws the same trials");
  auto* devices = sweep->add_option(
      "--devices", a->devices,
      "GPUs to run on, one trial per GPU at a time, each trial seeing only its own (CUDA_VISIBLE_DEVICES)");
  devices->type_name("0,1,…");
  sweep->add_option("--parallel", a->parallel, "trials at once on the CPU, the cores divided between them (1)")
      ->check(CLI::Range(1, 1024))
      ->excludes(devices);
  sweep->add_option("--metric", a->metric,
                    "what to sort by and stop early on: a summary.json number that metrics.jsonl rows also carry "
                    "(test_loss, test_accuracy; default test_loss)");
  sweep->add_option("--mode", a->mode,
                    "min or max: which end of the metric is better (default: max for an accuracy, else min)");
  sweep
      ->add_option("--early-stop", a->early_stop,
                   "median: stop a trial whose best metric is worse than the median of the others at the same step; "
                   "asha: asynchronous successive halving, rungs at the 1st, 3rd, 9th … evaluation, top 1/3 go on")
      ->type_name("median|asha");
  sweep
      ->add_option("--grace", a->grace,
                   "evaluations every trial reaches before the median rule judges it; asha's first rung (1)")
      ->check(CLI::Range(1, 1000000));
  sweep->add_option("--eta", a->eta, "asha's reduction factor: the top 1/eta of a rung go on (3)")
      ->check(CLI::Range(1.5, 1000.0));
  sweep->add_option("--out", a->out, "the sweep's folder (default sweeps/<config>-<YYYYmmdd-HHMMSS>)")
      ->check(non_empty("the sweep's folder"));
  sweep->add_flag("--resume", a->resume,
                  "continue the sweep in --out: skip completed trials, resume interrupted ones from their "
                  "checkpoints, re-run failed ones");
  sweep
      ->add_option("--emit", a->emit,
                   "slurm: write DIR/sweep.sbatch (a job array, one task per trial, --parallel at once) and print "
                   "its path instead of running")
      ->type_name("slurm");
  sweep->footer(
      "Each trial is a run directory DIR/<index>-<key=value,…>/ (its console output in console.log there). Exit "
      "codes: 0 every trial completed (or was stopped early); 1 a trial failed (reported at once with its exit code "
      "and the end of its output; the others go on); 2 a bad flag or a trial's config is invalid (nothing started); "
      "75 stopped by SIGINT/SIGTERM: the running trials wrote checkpoints, --resume continues.");
}

}  // namespace

void add_train_commands(CLI::App& app, Commands& commands) {
  add_train(app, commands);
  add_sweep(app, commands);
}

}  // namespace gt::cli
