// Inline SVG charts for the HTML reports (a run's report.html, a sweep's): axes with nice ticks and gridlines, a
// legend, and a viewBox, so that each chart fills the width the page's grid gives it. No script, nothing fetched.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace gt {

/// An axis from lo to hi (widened to take a range of one value) with ticks at round steps (1, 2 or 5 × 10^k).
struct ChartAxis {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> ticks;
};
/// About `target` ticks over [lo, hi]; with `integers` (steps) the step is at least 1.
ChartAxis nice_axis(double lo, double hi, int target = 5, bool integers = false);

/// A tick's label: as many decimals as the step needs (0.25, 0.5 …, never 0.30000000000000004), and k/M/G for large
/// values (12k, 1.5M).
std::string tick_label(double value, double step);

/// A number in its shortest form that reads back as the same double (0.05, not 0.050000000000000003).
std::string shortest(double value);

struct ChartSeries {
  std::string label, color;
  std::vector<std::pair<double, double>> points;  ///< (x, y), finite only
  double width = 1.5;                             ///< the line's stroke width
};

/// A line chart: one polyline per series (a lone point drawn as a dot), `tag` as its data-tag attribute, the x axis
/// named `x_name`. A legend lists the labels of at most `legend_max` series (more are summarised by `legend_note`).
std::string svg_line_chart(const std::string& tag, const std::string& title, const std::string& x_name,
                           const std::vector<ChartSeries>& series, size_t legend_max = 8,
                           const std::string& legend_note = "");

/// The colour of position t in [0, 1] on a blue → green → yellow scale (viridis' ends), for a swept value's rank.
std::string scale_color(double t);

/// The reports' CSS: a responsive grid of charts at the page's full width.
const char* chart_style();

}  // namespace gt
