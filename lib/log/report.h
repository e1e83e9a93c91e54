// report.html: one self-contained page (inline SVG, no scripts, no network) of a run directory's numbers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gt {

struct ReportInfo {
  std::string path;           ///< the file written
  int64_t train_rows = 0;     ///< metrics.jsonl rows of type train
  int64_t eval_rows = 0;      ///< … of type eval
  int64_t skipped_lines = 0;  ///< lines of metrics.jsonl that are not a JSON object
  int charts = 0;             ///< <svg> charts drawn
  bool finished = false;      ///< summary.json was there
};

/// Reads metrics.jsonl, summary.json and config.resolved.yaml of `run_dir` (each may be missing: a run still going,
/// or stopped) and writes the report to `out` (default <run_dir>/report.html), replacing it atomically.
/// Throws gt::ConfigError when `run_dir` is not a folder, gt::Error when the report cannot be written.
ReportInfo write_report(const std::string& run_dir, const std::string& out = "");

/// `s` with & < > " ' as HTML entities (for text and attribute values).
std::string html_escape(const std::string& s);
/// The reports' style sheet (an inline <style>'s text): `gputrain sweep`'s report.html looks like a run's.
const char* report_style();

/// The (step, value) points of `field` in the `type` rows ("train", "eval") of <run_dir>/metrics.jsonl, finite
/// values only; none when the file is missing. Lines that do not parse are skipped.
std::vector<std::pair<double, double>> read_metric_curve(const std::string& run_dir, const std::string& type,
                                                         const std::string& field);

/// write_report for the end of a run: a failure is logged as a warning, never thrown.
void write_report_logged(const std::string& run_dir);

}  // namespace gt
