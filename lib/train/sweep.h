// `gputrain sweep`: the plan (trials from grid and random axes, their tags and directory names, sweep.json), the
// early-stopping rules, and the runner that starts each trial as a `gputrain train` child process.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gt {

/// One swept key, from `--grid KEY=V1,V2,…` or `--random KEY=LO:HI[:log]` / `--random KEY=V1,V2,…`.
struct SweepAxis {
  enum class Kind { grid, choice, uniform, log_uniform };
  Kind kind = Kind::grid;
  std::string key;                  ///< the override's key (a --set key path, with a +/++ prefix if given)
  std::vector<std::string> values;  ///< grid and choice: the values' YAML texts, in order
  double lo = 0, hi = 0;            ///< uniform and log_uniform: the range (both ends included)
  bool integer = false;             ///< uniform and log_uniform: both ends written as integers, so draws are too
  std::string spec;                 ///< as written after the flag
};

/// Parses `--grid KEY=V1,V2,…`: values split at commas outside brackets (`[1,2]` stays one value). Throws
/// ConfigError naming the flag and what is wrong (no `=`, no key, an empty value, a repeated value).
SweepAxis parse_grid_axis(const std::string& spec);
/// Parses `--random KEY=LO:HI`, `KEY=LO:HI:log` (LO > 0) or `KEY=V1,V2,…` (one value drawn per trial). Throws
/// ConfigError for a bound that is not a finite number, LO ≥ HI, or an unknown third part.
SweepAxis parse_random_axis(const std::string& spec);

/// One trial: the values of the swept keys, and its run directory's name below the sweep's folder.
struct SweepTrial {
  int index = 0;
  std::vector<std::pair<std::string, std::string>> values;  ///< (key, value text) in the order of the axes
  std::string name;                                         ///< `<index>-<tag>`, the index zero-padded
  /// The trial's own overrides, `KEY=VALUE` each, as `--set` takes them.
  std::vector<std::string> overrides() const;
};

/// A sweep: what it was asked, and the trials that follow from it (all of sweep.json but the trials' states).
struct SweepPlan {
  std::string config;             ///< the experiment file, an absolute path (a resume may run from elsewhere)
  std::vector<std::string> sets;  ///< --set values every trial gets, before its own
  std::vector<SweepAxis> grid, random;
  int64_t draws = 0;  ///< random draws per grid point (--trials); 0 without --random
  uint64_t seed = 0;  ///< the random draws' seed (--seed)
  std::vector<SweepTrial> trials;
};

/// Most trials one sweep runs: a typo such as `--trials 1000000` is an error, not a million folders.
constexpr int64_t kMaxSweepTrials = 10000;

/// The trials: every combination of the grid axes (the first axis varies slowest, as nested loops over the flags
/// in order), each with `draws` random draws (0 without random axes). Draw d of axis a comes from (seed, d, a)
/// alone, so a resumed sweep, or the same flags again, gives the same values. Integer ranges draw integers;
/// others are written with 4 significant digits (the value the trial gets is the one in its tag). Throws
/// ConfigError for no axis, a key swept twice, --trials without --random (or --random without --trials), or more
/// than kMaxSweepTrials trials.
SweepPlan plan_sweep(const std::string& config, const std::vector<std::string>& sets,
                     const std::vector<SweepAxis>& grid, const std::vector<SweepAxis>& random, int64_t draws,
                     uint64_t seed);

/// `key=value,key=value` of the values, with every byte outside [A-Za-z0-9._=,+-] as `_` (a tag is a file name),
/// at most 96 bytes: a longer one is cut and ends with `~` and 8 hex digits of a hash of the whole.
std::string sweep_tag(const std::vector<std::pair<std::string, std::string>>& values);

/// How a trial stands, as sweep.json records it.
enum class TrialStatus { pending, running, completed, interrupted, failed, stopped_early };
const char* trial_status_name(TrialStatus s);

struct TrialState {
  TrialStatus status = TrialStatus::pending;
  int exit_code = -1;  ///< the last start's exit code (128 + signal when killed); -1 before one ended
  int starts = 0;      ///< how many times the sweep started it
};

/// sweep.json: the plan and each trial's state.
std::string sweep_json(const SweepPlan& plan, const std::vector<TrialState>& states);
/// Reads sweep.json back. Throws DataError (naming `path`) when it is not one this writes.
std::pair<SweepPlan, std::vector<TrialState>> read_sweep_json(const std::string& text, const std::string& path);

/// Early stopping on one metric at the trials' evaluation points.
enum class EarlyStopRule { none, median, asha };
struct EarlyStopParams {
  EarlyStopRule rule = EarlyStopRule::none;
  bool maximize = false;
  int grace = 1;       ///< evaluation points a trial always reaches (median); the first rung (asha)
  int min_others = 2;  ///< median: other trials that must have reached the step before one is judged
  double eta = 3;      ///< asha: the reduction factor; the top 1/eta at a rung go on
};
/// One trial's metric: (step, value) at its evaluation points, in step order.
struct CurvePoint {
  int64_t step = 0;
  double value = 0;
};
using Curve = std::vector<CurvePoint>;

/// The median stopping rule (Google Vizier's): trial `t`, at its latest point (step s), stops when it has more
/// than `grace` points and its best value up to s is worse than the median of the best values up to s of the other
/// trials that have reached s (at least `min_others` of them).
bool median_rule_stops(const std::vector<Curve>& curves, size_t t, const EarlyStopParams& p);

/// Asynchronous successive halving: rungs at the grace·eta^k-th evaluation point (1st, 3rd, 9th, … with the
/// defaults). The highest rung `curve` has reached, or -1.
int asha_rung(const Curve& curve, const EarlyStopParams& p);
/// Whether trial `t`, having just reached `rung`, stops: its best value up to the rung's point is worse than the
/// 1/eta quantile (from the good end) of the values every trial that has reached the rung had there, itself
/// included, once at least eta of them have (before that, every trial goes on).
bool asha_stops(const std::vector<Curve>& curves, size_t t, int rung, const EarlyStopParams& p);

/// The `metric` values of a metrics.jsonl text: (step, value) of each row that has `metric` as a number (eval rows
/// for test_loss and test_accuracy, train rows for loss), in file order; lines that do not parse are skipped.
Curve read_curve(const std::string& metrics_jsonl, const std::string& metric);

/// How `gputrain sweep` runs its trials.
struct SweepOptions {
  std::string out;           ///< the sweep's folder
  std::vector<int> devices;  ///< --devices: one trial per device at a time, CUDA_VISIBLE_DEVICES set to it
  int parallel = 1;          ///< --parallel (without --devices): trials at once, the cores divided between them
  int cores = 0;             ///< cores to divide (0: all of this machine)
  std::string metric = "test_loss";
  bool maximize = false;
  EarlyStopParams early_stop;
  bool resume = false;
  std::string exe;  ///< the gputrain binary the trials run (default /proc/self/exe)
  double poll_seconds = 0.2;
};

/// What a sweep ended with.
struct SweepResult {
  int exit_code = 0;  ///< 0 all completed (or stopped early); 1 a trial failed; 75 interrupted by a signal
  std::string table;  ///< the aligned table printed at the end
  int started = 0, completed = 0, failed = 0, stopped_early = 0, interrupted = 0, skipped = 0;
};

/// The trial's full `gputrain train` argument list (after the program): CONFIG, its --set values, --out DIR/NAME.
std::vector<std::string> trial_train_args(const SweepPlan& plan, const SweepTrial& trial, const std::string& out);

/// Runs the sweep: `validate` is called with the config and each trial's full --set list before anything starts (it
/// throws the error `gputrain check` would); then the trials run as child processes of `opts.exe`, their output to
/// DIR/<trial>/console.log. Writes DIR/sweep.json as states change, and at the end DIR/sweep.csv, DIR/sweep.jsonl and
/// DIR/report.html. With opts.resume the plan comes from DIR/sweep.json (`plan` must then equal it, or have no
/// axes). Throws ConfigError for usage errors (before any trial starts).
SweepResult run_sweep(
    SweepPlan plan, const SweepOptions& opts,
    const std::function<void(const std::string& config, const std::vector<std::string>& sets)>& validate);

/// DIR/sweep.sbatch: a Slurm job array, one task per trial (`%parallel` at once), each running its trial's
/// `gputrain train` line. Returns the script's path.
std::string write_slurm_script(const SweepPlan& plan, const std::string& out, int parallel, const std::string& exe);

/// DIR/report.html: the metric against each swept key, one inline SVG scatter per key. Returns its path.
std::string write_sweep_report(const std::string& out, const SweepPlan& plan, const std::vector<TrialState>& states,
                               const std::vector<std::optional<double>>& metric, const std::string& metric_name,
                               bool maximize);

}  // namespace gt
