// report.html: charts of metrics.jsonl drawn as inline SVG polylines, summary.json's figures and the resolved config.
#include "log/report.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_read.h"

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

struct Series {
  std::string label, color;
  std::vector<std::pair<double, double>> points;  // (step, value), finite only
};

// One chart: an <svg> with a <polyline> per series, axes with their ranges, and a legend.
std::string svg_chart(const std::string& id, const std::string& title, const std::vector<Series>& series) {
  constexpr double W = 640, H = 260, L = 70, R = 20, T = 30, B = 40;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x1 <= x0) x0 -= 1, x1 += 1;  // one point (or one step): centre it
  if (y1 <= y0) {
    const double pad = std::max(std::abs(y0) * 0.05, 1e-12);
    y0 -= pad, y1 += pad;
  }
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" data-tag=\"{}\" width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">\n",
      id, W, H, W, H, html_escape(title));
  out += fmt::format("<text x=\"{}\" y=\"18\" class=\"title\">{}</text>\n", L, html_escape(title));
  out +=
      fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", L, T, W - L - R, H - T - B);
  out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"end\">{:.4g}</text>\n", L - 6, T + 4, y1);
  out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"end\">{:.4g}</text>\n", L - 6, H - B, y0);
  out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\">{:.0f}</text>\n", L, H - B + 16, x0);
  out +=
      fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"end\">{:.0f}</text>\n", W - R, H - B + 16, x1);
  out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2,
                     H - 8);
  double legend_x = W - R;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    out += fmt::format("<text x=\"{}\" y=\"18\" class=\"tick\" text-anchor=\"end\" fill=\"{}\">{}</text>\n", legend_x,
                       it->color, html_escape(it->label));
    legend_x -= 10.0 + 7.0 * static_cast<double>(it->label.size());
  }
  for (const auto& s : series) {
    std::string pts;
    for (const auto& [x, y] : s.points) pts += fmt::format("{}{:.2f},{:.2f}", pts.empty() ? "" : " ", px(x), py(y));
    out += fmt::format(
        "<polyline class=\"series\" data-label=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" "
        "points=\"{}\"/>\n",
        html_escape(s.label), s.color, pts);
    if (s.points.size() == 1)  // a lone point draws no line: mark it
      out += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3\" fill=\"{}\"/>\n", px(s.points[0].first),
                         py(s.points[0].second), s.color);
  }
  return out + "</svg>\n";
}

constexpr const char* kStyle = R"(body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1400px}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse}td{padding:2px 12px 2px 0}td:first-child{color:#666}
.charts{display:flex;flex-wrap:wrap;gap:12px}
.chart{background:#fff;border:1px solid #ddd}.chart .title{font-weight:600;font-size:13px}
.chart .tick{font-size:11px;fill:#555}.chart .frame{fill:none;stroke:#bbb}
pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:12px}.note{color:#a60}
)";

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

const char* report_style() { return kStyle; }

ReportInfo write_report(const std::string& run_dir, const std::string& out_path) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    throw ConfigError(fmt::format("{}: not a run directory (no such folder)", run_dir));
  const fs::path dir(run_dir);
  ReportInfo info;
  info.path = out_path.empty() ? (dir / "report.html").string() : out_path;

  // Rows of metrics.jsonl. A run being written may end in half a line: it counts as skipped, like garbage.
  std::map<std::string, Series> series;
  auto add = [&](const std::string& key, const char* label, const char* color, double step, const JsonValue* f) {
    if (!f || !f->is_number() || !std::isfinite(f->number)) return;
    Series& s = series[key];
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
        add("train/loss", "loss", "#1f77b4", s, row->find("loss"));
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

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += fmt::format("<title>gputrain report: {}</title>\n<style>\n{}</style>\n</head>\n<body>\n", html_escape(name),
                      kStyle);
  html +=
      fmt::format("<h1>gputrain run: {}</h1>\n<p>{}</p>\n", html_escape(name), html_escape(fs::absolute(dir).string()));
  if (summary) {
    const JsonValue* why = summary->find("exit_reason");
    html += fmt::format("<p>Finished: <b>{}</b>.</p>\n", html_escape(why ? shown(*why) : "unknown"));
    html += "<h2>Summary</h2>\n<table class=\"summary\">\n";
    for (const auto& [k, v] : summary->members)
      html += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", html_escape(k),
                          v.is_number() ? fmt::format("{:.6g}", v.number) : html_escape(shown(v)));
    html += "</table>\n";
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
    std::vector<Series> drawn;
    for (const auto& k : keys)
      if (auto it = series.find(k); it != series.end() && !it->second.points.empty()) drawn.push_back(it->second);
    if (drawn.empty()) return;
    html += svg_chart(id, title, drawn);
    ++info.charts;
  };
  chart("train/loss", "train loss", {"train/loss"});
  chart("test/loss", "test loss", {"test/loss"});
  chart("test/accuracy", "test accuracy", {"test/accuracy"});
  chart("train/lr", "learning rate", {"train/lr"});
  chart("train/samples_per_sec", "samples/s", {"train/samples_per_sec"});
  chart("train/device_mem", "device memory (MiB)", {"train/device_mem_mib", "train/device_peak_mib"});
  html += "</div>\n";

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

void write_report_logged(const std::string& run_dir) {
  try {
    const ReportInfo r = write_report(run_dir);
    spdlog::info("report: {}", r.path);
  } catch (const std::exception& e) {
    spdlog::warn("report.html not written: {}", e.what());
  }
}

}  // namespace gt
