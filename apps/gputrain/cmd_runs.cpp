// gputrain runs and gputrain report: finished (and running) runs compared and drawn.
#include "cli.h"

#include "core/ownership.h"
#include "log/report.h"
#include "train/runs.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>

namespace gt::cli {
namespace {

struct RunsArgs {
  std::vector<std::string> dirs;
  std::string sort;
  bool desc = false, json = false, csv = false;
};

int runs(const RunsArgs& a) {
  if (a.json || a.csv) quiet_log_for_machine_output();
  std::vector<RunInfo> found = find_runs(a.dirs);
  if (found.empty()) {
    std::string where;
    for (const auto& d : a.dirs) where += (where.empty() ? "" : ", ") + d;
    fmt::print(stderr,
               "no run directories in {} (a run directory holds summary.json, config.resolved.yaml, metrics.jsonl or "
               "checkpoints/; runs are looked for in the folder, below it and one level further down)\n",
               where);
    return 1;
  }
  for (RunInfo& r : found) {
    read_run(r);
    if (!r.problem.empty()) spdlog::warn("{}: {}", r.dir, r.problem);
  }
  RunsTable table = runs_table(found);
  if (!a.sort.empty()) sort_runs(table, a.sort, a.desc);
  fmt::print("{}", a.json ? runs_jsonl(table) : a.csv ? runs_csv(table) : runs_text(table));
  return 0;
}

struct ReportArgs {
  std::string dir, out;
};

int report(const ReportArgs& a) {
  // A run's report.html is the report's own file; anything else of a run (or of another output) is not.
  if (!a.out.empty()) refuse_output_file("--out", a.out, {}, {"report.html"});
  const ReportInfo r = write_report(a.dir, a.out);
  fmt::print("{}: {} train rows, {} eval rows, {} charts{}{}\n", r.path, r.train_rows, r.eval_rows, r.charts,
             r.skipped_lines ? fmt::format(", {} unparsable lines skipped", r.skipped_lines) : std::string(),
             r.finished ? "" : " (no summary.json: running or stopped)");
  return 0;
}

}  // namespace

void add_runs_commands(CLI::App& app, Commands& commands) {
  auto [runs_cmd, r] =
      commands.add_with<RunsArgs>(app, "runs",
                                  "compare run directories: one row per run with the config keys that differ, how "
                                  "it ended, steps, wall time and final metrics",
                                  runs);
  runs_cmd
      ->add_option("dirs", r->dirs,
                   "run directories, or folders holding them (directly or one level down, as runs/<name>/<time>/)")
      ->required()
      ->check(non_empty("run directories or folders holding them"));
  runs_cmd->add_option("--sort", r->sort, "sort by a column (a metric, a config key, status, steps, wall_s, run)")
      ->type_name("KEY");
  runs_cmd->add_flag("--desc", r->desc, "sort descending (missing values stay last)");
  auto* json = runs_cmd->add_flag("--json", r->json, "one JSON object per run and line, instead of the table");
  runs_cmd->add_flag("--csv", r->csv, "CSV with a header line, instead of the table")->excludes(json);
  runs_cmd->footer(
      "Status: completed, max_steps, interrupted, diverged (summary.json's exit_reason); running (no summary.json, "
      "its process alive); failed (no summary.json, no process: an error or a kill ended it); unreadable (a "
      "summary.json that cannot be read: corrupt, cut short, or not a regular file). Warnings go to stderr. Exit "
      "codes: 0 listed; 1 no run found; 2 usage error (a bad flag, a missing folder, an unknown --sort column).");

  auto [report_cmd, p] = commands.add_with<ReportArgs>(
      app, "report", "write report.html (charts, summary, config) of a run directory, finished or still running",
      report);
  report_cmd->add_option("run_dir", p->dir, "the run directory")->required()->check(non_empty("a run directory"));
  report_cmd->add_option("--out", p->out, "the HTML file to write (default RUN_DIR/report.html)")
      ->check(non_empty("the HTML file to write"));
}

}  // namespace gt::cli
