// A step profiler: timed spans (per layer forward/backward, loss, optimizer, data) written as a Chrome trace
// (open in Perfetto or chrome://tracing) and summarised as a per-layer table.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gt {

class Profiler {
 public:
  using Clock = std::chrono::steady_clock;

  /// Starts recording; `step_begin`/`step_end` mark the steps it covers.
  void enable(bool on) { m_on = on; }
  bool enabled() const { return m_on; }

  /// A span: `name` is the layer or phase ("layers.3", "loss", "optimizer", "data"), `category` what it did
  /// ("forward", "backward", …). `flops` is the arithmetic it did (0 when unknown).
  void record(const std::string& name, const std::string& type, const char* category, Clock::time_point begin,
              Clock::time_point end, int64_t flops = 0);
  /// Marks one whole training step (the denominator of "share of step").
  void record_step(Clock::time_point begin, Clock::time_point end);

  /// The Chrome trace JSON ({"traceEvents": [...]}, complete events, microseconds).
  std::string chrome_trace() const;
  /// Per (name, category): calls, total and mean ms, share of the step time, GFLOP/s; then the totals.
  std::string table() const;
  /// Sum of all span durations and of all step durations, in seconds (for checks).
  double span_seconds() const;
  double step_seconds() const;
  int64_t steps() const { return static_cast<int64_t>(m_steps.size()); }

 private:
  struct Span {
    std::string name, type;
    const char* category;
    Clock::time_point begin, end;
    int64_t flops;
  };
  bool m_on = false;
  std::vector<Span> m_spans;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> m_steps;
  Clock::time_point m_origin = Clock::now();
};

/// Times a scope into a profiler when it is enabled; costs a branch, and no allocation, when it is not. The name
/// and type must outlive the scope.
class ProfileScope {
 public:
  ProfileScope(Profiler* p, const std::string& name, const std::string& type, const char* category, int64_t flops = 0)
      : m_p(p && p->enabled() ? p : nullptr), m_name(&name), m_type(&type), m_category(category), m_flops(flops) {
    if (m_p) m_begin = Profiler::Clock::now();
  }
  ~ProfileScope() {
    if (m_p) m_p->record(*m_name, *m_type, m_category, m_begin, Profiler::Clock::now(), m_flops);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler* m_p;
  const std::string *m_name, *m_type;
  const char* m_category;
  int64_t m_flops;
  Profiler::Clock::time_point m_begin;
};

}  // namespace gt
