// The SVG line chart and its axes.
#include "log/chart.h"

#include "log/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>

namespace gt {

ChartAxis nice_axis(double lo, double hi, int target, bool integers) {
  ChartAxis a;
  if (!(hi > lo)) {  // one value (or none): a band around it
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.05;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  a.step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  if (integers) a.step = std::max(a.step, 1.0);
  a.lo = lo;
  a.hi = hi;
  for (double t = std::ceil(lo / a.step) * a.step; t <= hi + a.step * 1e-9; t += a.step)
    a.ticks.push_back(std::abs(t) < a.step * 1e-9 ? 0.0 : t);
  return a;
}

std::string tick_label(double value, double step) {
  const double v = std::abs(value);
  for (const auto& [scale, suffix] :
       std::array<std::pair<double, const char*>, 3>{{{1e9, "G"}, {1e6, "M"}, {1e4, "k"}}})
    if (v >= scale && step >= scale / 100) {
      const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step / scale) + 1e-9)));
      return fmt::format("{:.{}f}{}", value / scale, decimals, suffix);
    }
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", value, std::min(decimals, 12));
}

std::string shortest(double value) { return fmt::format("{}", value); }

std::string svg_line_chart(const std::string& tag, const std::string& title, const std::string& x_name,
                           const std::vector<ChartSeries>& series, size_t legend_max, const std::string& legend_note) {
  constexpr double W = 640, H = 300, L = 58, R = 16, T = 30, B = 44;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  const double margin = (y1 - y0) * 0.04;  // the lines clear the frame
  const ChartAxis xa = nice_axis(x0, x1, 6, true), ya = nice_axis(y0 - margin, y1 + margin, 5);
  auto px = [&](double x) { return L + (x - xa.lo) / (xa.hi - xa.lo) * (W - L - R); };
  auto py = [&](double y) { return T + (ya.hi - y) / (ya.hi - ya.lo) * (H - T - B); };
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" data-tag=\"{}\" viewBox=\"0 0 {} {}\" "
      "preserveAspectRatio=\"xMidYMid meet\" role=\"img\" aria-label=\"{}\">\n",
      tag, W, H, html_escape(title));
  out += fmt::format("<text x=\"{}\" y=\"18\" class=\"title\">{}</text>\n", L, html_escape(title));
  // Gridlines and tick labels first, under the lines.
  for (const double t : ya.ticks) {
    out +=
        fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{:.2f}\" x2=\"{}\" y2=\"{:.2f}\"/>\n", L, py(t), W - R, py(t));
    out += fmt::format("<text x=\"{}\" y=\"{:.2f}\" class=\"tick\" text-anchor=\"end\">{}</text>\n", L - 6, py(t) + 4,
                       tick_label(t, ya.step));
  }
  for (const double t : xa.ticks) {
    out +=
        fmt::format("<line class=\"grid\" x1=\"{:.2f}\" y1=\"{}\" x2=\"{:.2f}\" y2=\"{}\"/>\n", px(t), T, px(t), H - B);
    out += fmt::format("<text x=\"{:.2f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n", px(t),
                       H - B + 15, tick_label(t, xa.step));
  }
  out +=
      fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", L, T, W - L - R, H - T - B);
  out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n", (L + W - R) / 2,
                     H - 10, html_escape(x_name));
  // The legend, right-aligned on the title's line.
  double legend_x = W - R;
  if (!legend_note.empty()) {
    out += fmt::format("<text x=\"{}\" y=\"18\" class=\"tick\" text-anchor=\"end\">{}</text>\n", legend_x,
                       html_escape(legend_note));
  } else {
    const size_t shown = std::min(series.size(), legend_max);
    for (size_t i = shown; i-- > 0;) {  // right to left: a swatch of the line's colour, then its label
      const ChartSeries& s = series[i];
      out += fmt::format("<text x=\"{}\" y=\"18\" class=\"tick\" text-anchor=\"end\">{}</text>\n", legend_x,
                         html_escape(s.label));
      legend_x -= 6.2 * static_cast<double>(s.label.size()) + 4;
      out += fmt::format("<line x1=\"{:.1f}\" y1=\"14\" x2=\"{:.1f}\" y2=\"14\" style=\"stroke:{};stroke-width:3\"/>\n",
                         legend_x - 14, legend_x, s.color);
      legend_x -= 24;
    }
  }
  for (const auto& s : series) {
    std::string pts;
    for (const auto& [x, y] : s.points) pts += fmt::format("{}{:.2f},{:.2f}", pts.empty() ? "" : " ", px(x), py(y));
    out += fmt::format(
        "<polyline class=\"series\" data-label=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" "
        "points=\"{}\"/>\n",
        html_escape(s.label), s.color, s.width, pts);
    if (s.points.size() == 1)  // a lone point draws no line: mark it
      out += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3\" fill=\"{}\"/>\n", px(s.points[0].first),
                         py(s.points[0].second), s.color);
  }
  return out + "</svg>\n";
}

std::string scale_color(double t) {
  // Three stops of viridis: #440154 (dark blue-purple), #21918c (teal), #fde725 (yellow).
  constexpr std::array<std::array<double, 3>, 3> stops{{{68, 1, 84}, {33, 145, 140}, {253, 231, 37}}};
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0);
  const double at = t * 2;
  const size_t i = std::min<size_t>(static_cast<size_t>(at), 1);
  const double f = at - static_cast<double>(i);
  std::array<int, 3> c{};
  for (size_t k = 0; k < 3; ++k)
    c[k] = static_cast<int>(std::lround(stops[i][k] + f * (stops[i + 1][k] - stops[i][k])));
  return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]);
}

const char* chart_style() {
  return R"(body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse}td{padding:2px 14px 2px 0}td:first-child{color:#666}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:14px;width:100%}
.chart{width:100%;height:auto;background:#fff;border:1px solid #ddd}.chart .title{font-weight:600;font-size:13px}
.chart .tick{font-size:11px;fill:#555}.chart .frame{fill:none;stroke:#999}.chart .grid{stroke:#e6e6e6}
pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:12px}.note{color:#a60}
)";
}

}  // namespace gt
