// `gputrain runs`: finds run directories and tabulates them for comparison: the config keys that differ between
// them, how each ended, its steps and wall time, and its final metrics; as an aligned table, CSV or JSON lines.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace gt {

/// One value of the table. A config value keeps its YAML text; numbers also carry their value (for sorting, JSON).
struct RunCell {
  enum class Kind { missing, text, number, boolean };
  Kind kind = Kind::missing;
  std::string text;  ///< as the table prints it (CSV and JSON print numbers in full)
  double number = 0;
};

/// A YAML scalar (or CSV field) that reads fully as a finite number ("+1e-3", "0.1"), else nothing.
std::optional<double> finite_number(const std::string& text);

/// What one run directory says about itself.
struct RunInfo {
  std::string dir;    ///< the path as found
  std::string label;  ///< the `run` column: the path relative to the folder given (its own name when given itself)
  /// completed | max_steps | interrupted | diverged (summary.json's exit_reason); running (no summary.json, the
  /// process holding its .lock is alive); failed (no summary.json and no process: ended by an error or killed);
  /// unreadable (summary.json is corrupt or cut short).
  std::string status;
  std::string problem;  ///< why it is unreadable, or why its config could not be read ("" when nothing is wrong)
  std::optional<int64_t> steps;
  std::optional<double> wall_seconds;
  std::vector<std::pair<std::string, double>> metrics;      ///< summary.json's final numbers, in its order
  bool has_config = false;                                  ///< config.resolved.yaml was read
  std::vector<std::pair<std::string, std::string>> config;  ///< config.resolved.yaml flattened: key path → YAML text
  /// overrides.json: the `--set` values (and flags standing for them) the run was started with; nullopt without one
  std::optional<std::vector<std::string>> overrides;
};

/// The run directories named by `paths`: a path that is one (it holds summary.json, config.resolved.yaml,
/// metrics.jsonl or checkpoints/), else the run directories directly below it, else those one level further down
/// (runs/ holds runs/<name>/<time>/), sorted by path. Throws ConfigError for a path that is not a folder.
std::vector<RunInfo> find_runs(const std::vector<std::string>& paths);

/// Reads what `run.dir` holds into `run` (status, steps, wall time, metrics, config). Never throws for what it
/// finds there: a corrupt summary.json makes the status "unreadable", a corrupt config leaves the config empty.
void read_run(RunInfo& run);

/// The comparison: columns `run`, each config key whose value is not the same in every run that has a config, then
/// `status`, `steps`, `wall_s` and the numbers of summary.json any run has (world_size, threads and epochs only when
/// they differ); one row per run.
struct RunsTable {
  std::vector<std::string> columns;
  std::vector<std::vector<RunCell>> rows;
  std::vector<std::string> dirs;                                   ///< each row's directory
  std::vector<std::optional<std::vector<std::string>>> overrides;  ///< each row's overrides (RunInfo::overrides)
};
RunsTable runs_table(const std::vector<RunInfo>& runs);

/// Sorts rows by `column` (numbers by value, then text; missing values last, also when `descending`); stable.
/// Throws ConfigError naming the columns when there is no such column.
void sort_runs(RunsTable& table, const std::string& column, bool descending);

/// Aligned text: a header line and a line per run, numbers right-aligned, missing values as "-".
std::string runs_text(const RunsTable& table);
/// CSV (RFC 4180): a header line and a line per run; missing values empty.
std::string runs_csv(const RunsTable& table);
/// JSON lines: one object per run with the columns as keys (and "dir", and "overrides", a list of strings, or null
/// for a run without overrides.json); numbers as numbers, missing as null.
std::string runs_jsonl(const RunsTable& table);

}  // namespace gt
