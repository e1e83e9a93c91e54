// `gputrain sweep`'s early-stopping rules (pure): the median rule and ASHA over the trials' curves, and a curve
// read from a metrics.jsonl.
#include "train/sweep.h"

#include "core/json_read.h"

#include <algorithm>
#include <cmath>

namespace gt {

namespace {

// The best value of a curve up to `step` (inclusive), or nullopt when it has no point there.
std::optional<double> best_until(const Curve& c, int64_t step, bool maximize) {
  std::optional<double> best;
  for (const CurvePoint& p : c) {
    if (p.step > step) break;
    if (!std::isfinite(p.value)) continue;
    if (!best || (maximize ? p.value > *best : p.value < *best)) best = p.value;
  }
  return best;
}

bool worse(double a, double b, bool maximize) { return maximize ? a < b : a > b; }

// Linear-interpolated quantile q of sorted values.
double quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(pos));
  if (i + 1 >= sorted.size()) return sorted.back();
  return sorted[i] + (pos - static_cast<double>(i)) * (sorted[i + 1] - sorted[i]);
}
}  // namespace

bool median_rule_stops(const std::vector<Curve>& curves, size_t t, const EarlyStopParams& p) {
  const Curve& c = curves.at(t);
  if (c.size() <= static_cast<size_t>(std::max(p.grace, 0))) return false;
  const int64_t s = c.back().step;
  const auto mine = best_until(c, s, p.maximize);
  if (!mine) return false;
  std::vector<double> others;
  for (size_t u = 0; u < curves.size(); ++u) {
    if (u == t || curves[u].empty() || curves[u].back().step < s) continue;  // not there yet
    if (const auto v = best_until(curves[u], s, p.maximize)) others.push_back(*v);
  }
  if (others.empty() || others.size() < static_cast<size_t>(std::max(p.min_others, 1))) return false;
  std::sort(others.begin(), others.end());
  return worse(*mine, quantile(others, 0.5), p.maximize);
}

int asha_rung(const Curve& curve, const EarlyStopParams& p) {
  int rung = -1;
  double at = std::max(p.grace, 1);
  while (static_cast<double>(curve.size()) >= at) {
    ++rung;
    at *= std::max(p.eta, 1.5);
  }
  return rung;
}

bool asha_stops(const std::vector<Curve>& curves, size_t t, int rung, const EarlyStopParams& p) {
  if (rung < 0) return false;
  const double eta = std::max(p.eta, 1.5);
  const size_t point = static_cast<size_t>(std::llround(std::max(p.grace, 1) * std::pow(eta, rung)));  // 1-based
  auto value_at_rung = [&](const Curve& c) -> std::optional<double> {
    if (c.size() < point) return std::nullopt;
    return best_until(c, c[point - 1].step, p.maximize);
  };
  const auto mine = value_at_rung(curves.at(t));
  if (!mine) return false;
  std::vector<double> recorded;
  for (const Curve& c : curves)
    if (const auto v = value_at_rung(c)) recorded.push_back(*v);
  if (static_cast<double>(recorded.size()) < eta) return false;
  // Sorted from the best: the top 1/eta go on.
  std::sort(recorded.begin(), recorded.end(), [&](double a, double b) { return p.maximize ? a > b : a < b; });
  const double cutoff = quantile(recorded, 1.0 / eta);
  return worse(*mine, cutoff, p.maximize);
}

Curve read_curve(const std::string& text, const std::string& metric) {
  Curve c;
  size_t from = 0;
  while (from < text.size()) {
    size_t end = text.find('\n', from);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(from, end - from);
    from = end + 1;
    if (line.find(metric) == std::string::npos) continue;
    try {
      const JsonValue row = json_read_object(line);
      const JsonValue* v = row.find(metric);
      const JsonValue* step = row.find("step");
      if (!v || !v->is_number() || !step || !step->integer) continue;
      c.push_back({*step->integer, v->number});
    } catch (const Error&) {
      // a row cut short by a write in progress
    }
  }
  return c;
}

}  // namespace gt
