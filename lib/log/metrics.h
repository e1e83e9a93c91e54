// Where a run's numbers go: metrics.jsonl and the TensorBoard events file, fed by one MetricsSink.
#pragma once

#include "core/json.h"
#include "core/noncopyable.h"
#include "log/tensorboard.h"

#include <cstdint>
#include <memory>
#include <string>

namespace gt {

/// metrics.jsonl: one JSON object per line, appended; a resumed run first cuts it back to the checkpoint's length so
/// that the rows of steps done again appear once.
class MetricsFile : NonCopyable {
 public:
  /// An empty path writes nothing (a rank other than 0, or logging.jsonl: false).
  explicit MetricsFile(const std::string& path);
  ~MetricsFile();

  uint64_t bytes() const;
  void truncate(uint64_t bytes);
  void write(const JsonObject& obj);

 private:
  std::string m_path;
  int m_fd = -1;
};

/// One row in, the same numbers out to every sink that is on: the whole row to metrics.jsonl, and for `train`
/// and `eval` rows their plotted fields to TensorBoard (train/loss, train/lr, train/grad_norm,
/// train/samples_per_sec, train/data_wait_ms, train/device_mem_mib, train/device_peak_mib, test/loss, test/accuracy) at
/// the row's step.
class MetricsSink {
 public:
  /// `dir` "" writes nothing (ranks other than 0).
  MetricsSink(const std::string& dir, bool jsonl, bool tensorboard);

  void write(const JsonObject& row);
  /// metrics.jsonl's length (0 when it is off), for the checkpoint that a resume cuts it back to.
  uint64_t bytes() const { return m_jsonl.bytes(); }
  void truncate(uint64_t bytes) { m_jsonl.truncate(bytes); }
  /// A resumed run goes on after `step`: TensorBoard is told to drop what earlier starts logged after it.
  void resume_after(int64_t step) {
    if (m_tb) m_tb->write_session_start(step + 1);
  }
  /// The events file, "" when TensorBoard is off.
  std::string events_path() const { return m_tb ? m_tb->path() : ""; }

 private:
  MetricsFile m_jsonl;
  std::unique_ptr<TensorBoardWriter> m_tb;
};

/// The TensorBoard tag of a row's field ("train" + "loss" → "train/loss"), "" for fields that are not plotted.
std::string tensorboard_tag(const std::string& row_type, const std::string& field);

}  // namespace gt
