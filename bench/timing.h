// What the C++ benchmarks time with: a steady clock, seconds since a point of it, and the median of repeated
// measurements (the upper one of an even count).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace gt::bench {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace gt::bench
