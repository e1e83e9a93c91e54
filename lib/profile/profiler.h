// A step profiler: timed spans (per layer forward/backward, loss, optimizer, data) written as a Chrome trace
// (open in Perfetto or chrome://tracing) and summarised as a per-layer table.
#pragma once

#include "core/span_timer.h"
#include "ops/stream.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gt {

/// Spans are recorded through SpanTimer (with SpanScope) or record(); see chrome_trace() and table() for the output.
class Profiler final : public SpanTimer {
 public:
  using Clock = std::chrono::steady_clock;
  /// Where a span ran: the training loop (on a GPU: the device's stream), the communication thread, or the host
  /// beside a GPU's stream (data loading). Only the first is part of "the spans cover x % of the step": the others
  /// overlap it.
  enum Lane { kMain = 2, kComm = 3, kHost = 4 };

  /// Starts or stops recording.
  void enable(bool on) { m_on = on; }
  bool enabled() const override { return m_on; }
  /// SpanTimer: on a CUDA device a device timestamp and an NVTX range, else the host clock; the span goes to the
  /// main lane.
  SpanStart begin_span(const std::string& name) override;
  void end_span(const SpanStart& start, const std::string& name, const std::string& type, const char* category,
                int64_t flops) override;
  /// On a CUDA device the spans of the main lane are timed on the device's stream with CUDA events (the host only
  /// queues the work), and named NVTX ranges mark them for Nsight Systems.
  void set_device(Device device);
  bool timed_on_device() const { return m_clock != nullptr; }

  /// A span: `name` is the layer or phase ("layers.3", "loss", "optimizer", "data"), `category` what it did
  /// ("forward", "backward", …). `flops` is the arithmetic it did (0 when unknown). Thread-safe.
  void record(const std::string& name, const std::string& type, const char* category, Clock::time_point begin,
              Clock::time_point end, int64_t flops = 0, Lane lane = kMain);
  /// The same, timed by two device timestamps (see mark()).
  void record_marked(const std::string& name, const std::string& type, const char* category, int begin_mark,
                     int end_mark, int64_t flops);
  /// A device timestamp queued now (CUDA devices only).
  int mark() { return m_clock->record(); }
  /// Brackets one whole training step (the denominator of "share of step").
  void begin_step();
  void end_step();

  /// The Chrome trace JSON ({"traceEvents": [...]}, complete events, microseconds). Call after enable(false).
  std::string chrome_trace();
  /// Per (name, category): calls, total and mean ms, share of the step time, GFLOP/s; then the totals.
  std::string table();
  /// Sum of the main lane's span durations and of all step durations, in seconds (for checks).
  double span_seconds();
  double step_seconds();
  int64_t steps() const { return static_cast<int64_t>(m_steps.size()); }

 private:
  struct Span {
    std::string name, type;
    const char* category;
    Clock::time_point begin, end;
    int64_t flops;
    Lane lane;
    int begin_mark = -1, end_mark = -1;  ///< device timestamps, turned into begin/end by resolve()
  };
  struct Step {
    Clock::time_point begin, end;
    int begin_mark = -1, end_mark = -1;
  };
  /// Places device-timed spans and steps on the host timeline: the first timestamp is taken as the host time at
  /// which it was queued, so device time stays comparable across spans (not with the host lanes' absolute times).
  void resolve();

  bool m_on = false;
  std::mutex m_mutex;
  std::vector<Span> m_spans;
  std::vector<Step> m_steps;
  Clock::time_point m_origin = Clock::now();
  std::unique_ptr<DeviceClock> m_clock;
  int m_first_mark = -1;
  Clock::time_point m_first_mark_host;
};

}  // namespace gt
