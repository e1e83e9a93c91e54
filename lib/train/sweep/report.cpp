// `gputrain sweep`'s report.html: the metric against each swept key, and every trial's loss curve.
#include "train/sweep.h"

#include "core/atomic_file.h"
#include "core/quote.h"
#include "log/chart.h"
#include "log/report.h"
#include "train/runs.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace gt {
namespace fs = std::filesystem;

namespace {

// One scatter: the metric (y) against one swept key (x): numbers on a linear or log axis, other values as
// categories in the order first seen. Stopped trials are drawn hollow.
std::string svg_scatter(const std::string& key, bool log_axis, const std::vector<std::string>& xs,
                        const std::vector<double>& ys, const std::vector<bool>& hollow, const std::string& metric) {
  constexpr double W = 640, H = 300, L = 58, R = 16, T = 30, B = 44;  // as the line charts: one grid of charts
  bool numeric = true;
  for (const std::string& x : xs) numeric = numeric && finite_number(x) && (!log_axis || *finite_number(x) > 0);
  std::vector<std::string> categories;
  std::vector<double> xv;
  for (const std::string& x : xs) {
    if (numeric) {
      xv.push_back(log_axis ? std::log10(*finite_number(x)) : *finite_number(x));
    } else {
      auto it = std::find(categories.begin(), categories.end(), x);
      if (it == categories.end()) it = categories.insert(categories.end(), x);
      xv.push_back(static_cast<double>(it - categories.begin()));
    }
  }
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (size_t i = 0; i < xv.size(); ++i) {
    x0 = std::min(x0, xv[i]), x1 = std::max(x1, xv[i]), y0 = std::min(y0, ys[i]), y1 = std::max(y1, ys[i]);
  }
  if (!numeric) x0 -= 0.5, x1 += 0.5;
  if (x1 <= x0) x0 -= 1, x1 += 1;
  if (y1 <= y0) {
    const double pad = std::max(std::abs(y0) * 0.05, 1e-12);
    y0 -= pad, y1 += pad;
  }
  // A margin inside the frame, so that the extreme points are not drawn on it (the ticks give the data's range).
  const double ylo = y0, yhi = y1, xlo = x0, xhi = x1;
  y0 -= (yhi - ylo) * 0.06, y1 += (yhi - ylo) * 0.06;
  if (numeric) x0 -= (xhi - xlo) * 0.06, x1 += (xhi - xlo) * 0.06;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  const std::string title = fmt::format("{} against {}", metric, key);
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" data-key=\"{}\" viewBox=\"0 0 {} {}\" "
      "preserveAspectRatio=\"xMidYMid meet\" role=\"img\" aria-label=\"{}\">\n",
      html_escape(key), W, H, html_escape(title));
  out += fmt::format("<text x=\"{}\" y=\"18\" class=\"title\">{}</text>\n", L, html_escape(title));
  const ChartAxis ya = nice_axis(ylo, yhi, 5);  // ticks and gridlines at round values inside the frame
  for (const double t : ya.ticks) {
    if (t < y0 || t > y1) continue;
    out +=
        fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{:.2f}\" x2=\"{}\" y2=\"{:.2f}\"/>\n", L, py(t), W - R, py(t));
    out += fmt::format("<text x=\"{}\" y=\"{:.2f}\" class=\"tick\" text-anchor=\"end\">{}</text>\n", L - 6, py(t) + 4,
                       tick_label(t, ya.step));
  }
  out +=
      fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", L, T, W - L - R, H - T - B);
  auto x_label = [&](double x) {
    return log_axis ? fmt::format("{:.3g}", std::pow(10.0, x)) : fmt::format("{:.4g}", x);
  };
  if (numeric) {
    out += fmt::format("<text x=\"{:.2f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n", px(xlo),
                       H - B + 16, x_label(xlo));
    out += fmt::format("<text x=\"{:.2f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n", px(xhi),
                       H - B + 16, x_label(xhi));
  } else {
    for (size_t i = 0; i < categories.size(); ++i)
      out += fmt::format("<text x=\"{:.2f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n",
                         px(static_cast<double>(i)), H - B + 16, html_escape(categories[i]));
  }
  out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}{}</text>\n", (L + W - R) / 2,
                     H - 8, html_escape(key), log_axis && numeric ? " (log scale)" : "");
  for (size_t i = 0; i < xv.size(); ++i)
    out += fmt::format(
        "<circle class=\"point\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"4\" fill=\"{}\" stroke=\"#1f77b4\"><title>{}={}: "
        "{:.6g}</title></circle>\n",
        px(xv[i]), py(ys[i]), hollow[i] ? "none" : "#1f77b4", html_escape(key), html_escape(xs[i]), ys[i]);
  return out + "</svg>\n";
}

// Every trial's training loss over its steps on one chart, coloured by the rank of its value of `axis` among the
// distinct ones (numbers by value, other values in the order first seen), so that a grid's values spread over the
// colour scale: how the curves part as the key changes, which the end metric alone does not show. "" when no trial
// has logged a row.
std::string trial_curves_chart(const std::string& out, const SweepPlan& plan, const SweepAxis& axis) {
  std::vector<std::string> values, seen;
  for (const SweepTrial& t : plan.trials) values.push_back(t.values.empty() ? "" : t.values.front().second);
  const bool numeric =
      std::all_of(values.begin(), values.end(), [](const std::string& v) { return finite_number(v).has_value(); });
  std::vector<double> key;
  for (const std::string& v : values) {
    if (numeric) {
      key.push_back(*finite_number(v));
      continue;
    }
    auto it = std::find(seen.begin(), seen.end(), v);
    if (it == seen.end()) it = seen.insert(seen.end(), v);
    key.push_back(static_cast<double>(it - seen.begin()));
  }
  std::vector<double> distinct = key;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<ChartSeries> curves;
  std::string lo_value, hi_value;
  for (size_t i = 0; i < plan.trials.size(); ++i) {
    const auto r = std::lower_bound(distinct.begin(), distinct.end(), key[i]) - distinct.begin();
    if (r == 0) lo_value = values[i];
    if (r + 1 == static_cast<std::ptrdiff_t>(distinct.size())) hi_value = values[i];
    ChartSeries s;
    s.label = plan.trials[i].name;
    s.color =
        scale_color(distinct.size() > 1 ? static_cast<double>(r) / static_cast<double>(distinct.size() - 1) : 0.5);
    s.points = read_metric_curve((fs::path(out) / plan.trials[i].name).string(), "train", "loss");
    if (!s.points.empty()) curves.push_back(std::move(s));
  }
  if (curves.empty()) return "";
  return svg_line_chart("trial_loss", "train loss of each trial", "step", curves, 0,
                        fmt::format("colour: {} from {} (dark) to {} (yellow)", axis.key, lo_value, hi_value));
}

}  // namespace

std::string write_sweep_report(const std::string& out, const SweepPlan& plan, const std::vector<TrialState>& states,
                               const std::vector<std::optional<double>>& metric, const std::string& metric_name,
                               bool maximize) {
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>gputrain sweep: {}</title>\n"
      "<style>\n{}</style>\n</head>\n<body>\n<h1>gputrain sweep: {}</h1>\n<p>{} trials of {}; {} ({}: {} is "
      "better). A hollow point is a trial stopped early (its metric when it stopped).</p>\n",
      html_escape(out), report_style(), html_escape(out), plan.trials.size(), html_escape(plan.config),
      html_escape(metric_name), maximize ? "max" : "min", maximize ? "higher" : "lower");
  std::vector<const SweepAxis*> axes;
  for (const auto* list : {&plan.grid, &plan.random})
    for (const SweepAxis& a : *list) axes.push_back(&a);
  html += "<div class=\"charts\">\n";
  for (size_t a = 0; a < axes.size(); ++a) {
    std::vector<std::string> xs;
    std::vector<double> ys;
    std::vector<bool> hollow;
    for (size_t i = 0; i < plan.trials.size(); ++i) {
      if (i >= metric.size() || !metric[i] || a >= plan.trials[i].values.size()) continue;
      xs.push_back(plan.trials[i].values[a].second);
      ys.push_back(*metric[i]);
      hollow.push_back(i < states.size() && states[i].status == TrialStatus::stopped_early);
    }
    if (xs.empty()) continue;
    bool log_axis = axes[a]->kind == SweepAxis::Kind::log_uniform;
    if (!log_axis) {  // a grid of positive numbers spanning 100x or more reads better on a log axis (lr 1e-4 … 1e-1)
      double lo = INFINITY, hi = 0;
      bool positive = true;
      for (const std::string& x : xs) {
        const auto v = finite_number(x);
        positive = positive && v && *v > 0;
        if (v) lo = std::min(lo, *v), hi = std::max(hi, *v);
      }
      log_axis = positive && hi >= 100 * lo;
    }
    html += svg_scatter(axes[a]->key, log_axis, xs, ys, hollow, metric_name);
  }
  if (!axes.empty()) html += trial_curves_chart(out, plan, *axes.front());
  html += "</div>\n<h2>Trials</h2>\n<table>\n";
  for (size_t i = 0; i < plan.trials.size(); ++i)
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", html_escape(plan.trials[i].name),
                        trial_status_name(i < states.size() ? states[i].status : TrialStatus::pending),
                        i < metric.size() && metric[i] ? shortest(*metric[i]) : "-");
  html += "</table>\n</body>\n</html>\n";
  const std::string path = (fs::path(out) / "report.html").string();
  write_file_atomic(path, html);
  return path;
}

}  // namespace gt
