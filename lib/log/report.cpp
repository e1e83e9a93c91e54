// report.html: charts of metrics.jsonl drawn as inline SVG polylines, summary.json's figures and the resolved config.
#include "log/report.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_read.h"
#include "log/chart.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

namespace gt {
namespace {

namespace fs = std::filesystem;

// One JSON object of metrics.jsonl or summary.json; nullopt for anything else (garbage, half a line, duplicate keys).
std::optional<JsonValue> read_object(const std::string& text) {
  try {
    return json_read_object(text);
  } catch (const JsonReadError&) {
    return std::nullopt;
  }
}

// A field as the report shows it: a string's text, anything else (true, null, nested objects) as JSON.
std::string shown(const JsonValue& v) { return v.is_string() ? v.string : v.text(); }

std::optional<std::string> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

const char* report_style() { return chart_style(); }

ReportInfo write_report(const std::string& run_dir, const std::string& out_path) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    throw ConfigError(fmt::format("{}: not a run directory (no such folder)", run_dir));
  const fs::path dir(run_dir);
  ReportInfo info;
  info.path = out_path.empty() ? (dir / "report.html").string() : out_path;

  // Rows of metrics.jsonl. A run being written may end in half a line: it counts as skipped, like garbage.
  std::map<std::string, ChartSeries> series;
  auto add = [&](const std::string& key, const char* label, const char* color, double step, const JsonValue* f) {
    if (!f || !f->is_number() || !std::isfinite(f->number)) return;
    ChartSeries& s = series[key];
    s.label = label;
    s.color = color;
    s.points.emplace_back(step, f->number);
  };
  const std::optional<std::string> metrics = read_file(dir / "metrics.jsonl");
  if (metrics) {
    std::istringstream in(*metrics);
    for (std::string line; std::getline(in, line);) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const auto row = read_object(line);
      const JsonValue* type = row ? row->find("type") : nullptr;
      const JsonValue* step = row ? row->find("step") : nullptr;
      if (!type || !step || !step->is_number()) {
        ++info.skipped_lines;
        continue;
      }
      const double s = step->number;
      if (type->is_string() && type->string == "train") {
        ++info.train_rows;
        add("train/loss", "train loss", "#1f77b4", s, row->find("loss"));
        add("train/lr", "lr", "#2ca02c", s, row->find("lr"));
        add("train/samples_per_sec", "samples/s", "#9467bd", s, row->find("samples_per_sec"));
        add("train/device_mem_mib", "in use", "#8c564b", s, row->find("device_mem_mib"));
        add("train/device_peak_mib", "peak", "#e377c2", s, row->find("device_peak_mib"));
      } else if (type->is_string() && type->string == "eval") {
        ++info.eval_rows;
        add("test/loss", "test loss", "#d62728", s, row->find("test_loss"));
        add("test/accuracy", "test accuracy", "#ff7f0e", s, row->find("test_accuracy"));
      }
    }
  }

  const std::optional<std::string> summary_text = read_file(dir / "summary.json");
  std::optional<JsonValue> summary;
  if (summary_text) summary = read_object(*summary_text);
  info.finished = summary.has_value();
  std::string name = dir.lexically_normal().filename().string();
  if (name.empty()) name = dir.lexically_normal().parent_path().filename().string();
  if (summary)
    if (const JsonValue* n = summary->find("name"); n && !n->is_number()) name = shown(*n);

  // A series that never changes (a constant learning rate) is one number in the table, not a flat chart.
  std::vector<std::pair<std::string, double>> constant;
  for (auto it = series.begin(); it != series.end();) {
    const auto& pts = it->second.points;
    const bool flat = pts.size() > 1 && std::all_of(pts.begin(), pts.end(),
                                                    [&](const auto& p) { return p.second == pts.front().second; });
    if (!flat) {
      ++it;
      continue;
    }
    constant.emplace_back(it->second.label, pts.front().second);
    it = series.erase(it);
  }

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += fmt::format("<title>gputrain report: {}</title>\n<style>\n{}</style>\n</head>\n<body>\n", html_escape(name),
                      chart_style());
  html +=
      fmt::format("<h1>gputrain run: {}</h1>\n<p>{}</p>\n", html_escape(name), html_escape(fs::absolute(dir).string()));
  if (summary) {
    const JsonValue* why = summary->find("exit_reason");
    html += fmt::format("<p>Finished: <b>{}</b>.</p>\n", html_escape(why ? shown(*why) : "unknown"));
  } else {
    html += fmt::format("<p class=\"note\">No {}summary.json: the run is running or stopped.</p>\n",
                        summary_text ? "readable " : "");
  }

  html += fmt::format("<h2>Metrics</h2>\n<p>{} train rows, {} eval rows from metrics.jsonl{}.</p>\n", info.train_rows,
                      info.eval_rows, metrics ? "" : " (no metrics.jsonl)");
  if (info.skipped_lines > 0)
    html += fmt::format("<p class=\"note\">{} unparsable line{} of metrics.jsonl skipped.</p>\n", info.skipped_lines,
                        info.skipped_lines == 1 ? "" : "s");
  html += "<div class=\"charts\">\n";
  auto chart = [&](const std::string& id, const std::string& title, std::vector<std::string> keys) {
    std::vector<ChartSeries> drawn;
    for (const auto& k : keys)
      if (auto it = series.find(k); it != series.end() && !it->second.points.empty()) drawn.push_back(it->second);
    if (drawn.empty()) return;
    html += svg_line_chart(id, title, "step", drawn);
    ++info.charts;
  };
  // Train and test loss on one chart: where they part is where the model starts to overfit.
  chart("loss", "loss", {"train/loss", "test/loss"});
  chart("test/accuracy", "test accuracy", {"test/accuracy"});
  chart("train/lr", "learning rate", {"train/lr"});
  chart("train/samples_per_sec", "samples/s", {"train/samples_per_sec"});
  chart("train/device_mem", "device memory (MiB)", {"train/device_mem_mib", "train/device_peak_mib"});
  html += "</div>\n";

  if (summary || !constant.empty()) {
    html += "<h2>Summary</h2>\n<table class=\"summary\">\n";
    if (summary)
      for (const auto& [k, v] : summary->members)
        html += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", html_escape(k),
                            v.is_number() ? shortest(v.number) : html_escape(shown(v)));
    for (const auto& [label, v] : constant)
      html += fmt::format("<tr><td>{}</td><td>{} (constant over the run)</td></tr>\n", html_escape(label), shortest(v));
    html += "</table>\n";
  }

  html += "<h2>config.resolved.yaml</h2>\n";
  if (const auto cfg = read_file(dir / "config.resolved.yaml"))
    html += "<pre class=\"config\">" + html_escape(*cfg) + "</pre>\n";
  else
    html += "<p class=\"note\">No config.resolved.yaml.</p>\n";
  html += "</body>\n</html>\n";

  // Written beside the target and renamed over it, so a browser reloading it never sees half a page.
  write_file_atomic(info.path, html);
  return info;
}

std::vector<std::pair<double, double>> read_metric_curve(const std::string& run_dir, const std::string& type,
                                                         const std::string& field) {
  std::vector<std::pair<double, double>> points;
  const std::optional<std::string> text = read_file(fs::path(run_dir) / "metrics.jsonl");
  if (!text) return points;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) {
    const auto row = read_object(line);
    const JsonValue* t = row ? row->find("type") : nullptr;
    const JsonValue* step = row ? row->find("step") : nullptr;
    const JsonValue* v = row ? row->find(field) : nullptr;
    if (t && t->is_string() && t->string == type && step && step->is_number() && v && v->is_number() &&
        std::isfinite(v->number))
      points.emplace_back(step->number, v->number);
  }
  return points;
}

void write_report_logged(const std::string& run_dir) {
  try {
    const ReportInfo r = write_report(run_dir);
    spdlog::info("report: {}", r.path);
  } catch (const std::exception& e) {
    spdlog::warn("report.html not written: {}", e.what());
  }
}

}  // namespace gt
