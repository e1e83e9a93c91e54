// Chrome trace output and the per-layer profile table.
#include "profile/profiler.h"

#include "core/json.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace gt {

void Profiler::set_device(Device device) {
  if (device.is_cuda()) m_clock = std::make_unique<DeviceClock>(device);
}

void Profiler::record(const std::string& name, const std::string& type, const char* category, Clock::time_point begin,
                      Clock::time_point end, int64_t flops, Lane lane) {
  if (!m_on) return;
  std::lock_guard<std::mutex> lock(m_mutex);
  m_spans.push_back({name, type, category, begin, end, flops, lane});
}

void Profiler::record_marked(const std::string& name, const std::string& type, const char* category, int begin_mark,
                             int end_mark, int64_t flops) {
  if (!m_on) return;
  std::lock_guard<std::mutex> lock(m_mutex);
  m_spans.push_back({name, type, category, {}, {}, flops, kMain, begin_mark, end_mark});
}

SpanStart Profiler::begin_span(const std::string& name) {
  SpanStart start;
  if (timed_on_device()) {
    range_push(name.c_str());
    start.mark = mark();
  } else {
    start.time = Clock::now();
  }
  return start;
}

void Profiler::end_span(const SpanStart& start, const std::string& name, const std::string& type, const char* category,
                        int64_t flops) {
  if (start.mark >= 0) {
    record_marked(name, type, category, start.mark, mark(), flops);
    range_pop();
  } else {
    record(name, type, category, start.time, Clock::now(), flops);
  }
}

void Profiler::begin_step() {
  if (!m_on) return;
  Step s;
  s.begin = Clock::now();
  if (m_clock) {
    s.begin_mark = m_clock->record();
    if (m_first_mark < 0) {
      m_first_mark = s.begin_mark;
      m_first_mark_host = s.begin;
    }
  }
  m_steps.push_back(s);
}

void Profiler::end_step() {
  if (!m_on || m_steps.empty()) return;
  m_steps.back().end = Clock::now();
  if (m_clock) m_steps.back().end_mark = m_clock->record();
}

void Profiler::resolve() {
  if (!m_clock || m_first_mark < 0) return;
  auto at = [&](int mark) {
    const double ms = m_clock->elapsed_ms(m_first_mark, mark);  // waits for the device to get there
    return m_first_mark_host +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
  };
  for (Span& s : m_spans)
    if (s.begin_mark >= 0) {
      s.begin = at(s.begin_mark);
      s.end = at(s.end_mark);
      s.begin_mark = s.end_mark = -1;
    }
  for (Step& s : m_steps)
    if (s.begin_mark >= 0 && s.end_mark >= 0) {
      s.begin = at(s.begin_mark);
      s.end = at(s.end_mark);
      s.begin_mark = s.end_mark = -1;
    }
}

std::string Profiler::chrome_trace() {
  resolve();
  auto us = [&](Clock::time_point t) { return std::chrono::duration<double, std::micro>(t - m_origin).count(); };
  std::string out = "{\"traceEvents\": [\n";
  bool first = true;
  auto event = [&](const std::string& name, const std::string& cat, Clock::time_point b, Clock::time_point e, int tid,
                   const std::string& args) {
    out += first ? "  " : ",\n  ";
    first = false;
    out += fmt::format(
        "{{\"name\": {}, \"cat\": {}, \"ph\": \"X\", \"ts\": {:.3f}, \"dur\": {:.3f}, \"pid\": 1, "
        "\"tid\": {}, \"args\": {{{}}}}}",
        json_quote(name), json_quote(cat), us(b), us(e) - us(b), tid, args);
  };
  for (size_t i = 0; i < m_steps.size(); ++i)
    event(fmt::format("step {}", i + 1), "step", m_steps[i].begin, m_steps[i].end, 1, "");
  for (const Span& s : m_spans)
    event(s.name + " " + s.category, s.category, s.begin, s.end, s.lane,
          fmt::format("\"type\": {}, \"flops\": {}", json_quote(s.type), s.flops));
  // Names for the rows Perfetto shows.
  for (const auto& [tid, name] :
       {std::pair{1, "steps"}, std::pair{static_cast<int>(kMain), m_clock ? "device stream" : "training loop"},
        std::pair{static_cast<int>(kComm), "communication thread"},
        std::pair{static_cast<int>(kHost), "host (data loading)"}})
    out += fmt::format(
        ",\n  {{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": {}, \"args\": {{\"name\": \"{}\"}}}}",
        tid, name);
  return out + "\n], \"displayTimeUnit\": \"ms\"}\n";
}

double Profiler::span_seconds() {
  resolve();
  double t = 0;
  for (const Span& s : m_spans)
    if (s.lane == kMain) t += std::chrono::duration<double>(s.end - s.begin).count();
  return t;
}

double Profiler::step_seconds() {
  resolve();
  double t = 0;
  for (const Step& s : m_steps) t += std::chrono::duration<double>(s.end - s.begin).count();
  return t;
}

std::string Profiler::table() {
  resolve();
  struct Row {
    std::string type;
    int64_t calls = 0, flops = 0;
    double seconds = 0;
    size_t order = 0;
  };
  std::map<std::pair<std::string, std::string>, Row> rows;
  for (const Span& s : m_spans) {
    Row& r = rows[{s.name, s.category}];
    if (r.calls == 0) r.order = rows.size(), r.type = s.type;
    ++r.calls;
    r.flops += s.flops;
    r.seconds += std::chrono::duration<double>(s.end - s.begin).count();
  }
  std::vector<std::pair<std::pair<std::string, std::string>, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  const double step = step_seconds();
  std::string out = fmt::format("{:<14} {:<12} {:<9} {:>6} {:>10} {:>9} {:>7} {:>9}\n", "name", "type", "phase",
                                "calls", "total ms", "mean ms", "% step", "GFLOP/s");
  for (const auto& [key, r] : sorted)
    out += fmt::format("{:<14} {:<12} {:<9} {:>6} {:>10.2f} {:>9.3f} {:>7.1f} {:>9}\n", key.first, r.type, key.second,
                       r.calls, r.seconds * 1e3, r.seconds * 1e3 / static_cast<double>(r.calls),
                       step > 0 ? 100 * r.seconds / step : 0.0,
                       r.flops > 0 ? fmt::format("{:.1f}", static_cast<double>(r.flops) / r.seconds * 1e-9) : "");
  out += fmt::format("{} steps: {:.2f} ms per step{}; the spans cover {:.1f} % of it{}\n", m_steps.size(),
                     m_steps.empty() ? 0.0 : step * 1e3 / static_cast<double>(m_steps.size()),
                     m_clock ? " (device time, CUDA events)" : "", step > 0 ? 100 * span_seconds() / step : 0.0,
                     std::any_of(m_spans.begin(), m_spans.end(), [](const Span& s) { return s.lane != kMain; })
                         ? " (all-reduce and, on a GPU, data load rows overlap the others and are not counted)"
                         : "");
  return out;
}

}  // namespace gt
