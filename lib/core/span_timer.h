// What the code below the profiler sees of it: a timer of named spans. The model times each layer's forward and
// backward through this interface, so graph/ needs nothing from profile/ (profile::Profiler implements it).
#pragma once

#include "core/noncopyable.h"

#include <chrono>
#include <cstdint>
#include <string>

namespace gt {

/// Where a span started: a host time, or a device timestamp when the timer times on a device's stream.
struct SpanStart {
  std::chrono::steady_clock::time_point time;
  int mark = -1;
};

class SpanTimer {
 public:
  virtual ~SpanTimer() = default;
  /// False while not recording: a span then costs this call and nothing else.
  virtual bool enabled() const = 0;
  /// Starts a span named `name` (the layer or phase: "layers.3", "loss", "data").
  virtual SpanStart begin_span(const std::string& name) = 0;
  /// Ends the span begun at `start`; `category` is what it did ("forward", "backward", …), `flops` the arithmetic
  /// it did (0 when unknown).
  virtual void end_span(const SpanStart& start, const std::string& name, const std::string& type, const char* category,
                        int64_t flops) = 0;
};

/// Times a scope into a span timer when there is one and it is enabled; costs a branch, and no allocation, when not.
/// The name and type must outlive the scope.
class SpanScope : NonCopyable {
 public:
  SpanScope(SpanTimer* timer, const std::string& name, const std::string& type, const char* category, int64_t flops = 0)
      : m_timer(timer && timer->enabled() ? timer : nullptr),
        m_name(&name),
        m_type(&type),
        m_category(category),
        m_flops(flops) {
    if (m_timer) m_start = m_timer->begin_span(name);
  }
  ~SpanScope() {
    if (m_timer) m_timer->end_span(m_start, *m_name, *m_type, m_category, m_flops);
  }

 private:
  SpanTimer* m_timer;
  const std::string *m_name, *m_type;
  const char* m_category;
  int64_t m_flops;
  SpanStart m_start;
};

}  // namespace gt
