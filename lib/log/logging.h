// Logging set-up (spdlog) and the JSON lines that metrics.jsonl and summary.json are made of.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gt {

/// Console logging: info and above to stdout with a time stamp; `quiet` keeps warnings and errors only.
void init_logging(bool quiet = false);
/// For ranks other than 0: warnings and errors only, each line prefixed with "[rank R]".
void set_log_rank(int rank);
/// The same for the calling thread alone: the worker threads of one process driving several devices.
void set_thread_log_rank(int rank);
/// Also writes every log line to `path` (the run's train.log). Throws gt::Error when it cannot be opened.
void add_log_file(const std::string& path);
/// Flushes and detaches the file sink.
void remove_log_file();

/// The console's live line (a progress bar), drawn in place below the log lines: a log line clears it, is printed,
/// and draws it again, so neither is garbled. "" takes it off the screen.
void console_live_line(const std::string& line);
/// Prints `line` (by default the live line as it is) where the live line was, as a permanent line; no live line
/// remains.
void console_keep_live(const std::optional<std::string>& line = std::nullopt);
/// While on, step_logger() writes to train.log alone: a live display stands for the periodic step lines on the
/// console.
void console_set_live(bool on);
/// The logger of the periodic step lines: the default logger, or train.log alone while the console is live.
spdlog::logger& step_logger();

/// Builds one JSON object, key by key, in insertion order. Non-finite numbers become null.
class JsonObject {
 public:
  JsonObject& add(const std::string& key, double v);
  JsonObject& add(const std::string& key, int64_t v);
  JsonObject& add(const std::string& key, int v) { return add(key, static_cast<int64_t>(v)); }
  JsonObject& add(const std::string& key, const std::string& v);
  JsonObject& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonObject& add(const std::string& key, std::optional<double> v);
  JsonObject& add_null(const std::string& key);
  JsonObject& add_bool(const std::string& key, bool v);
  /// A nested object.
  JsonObject& add(const std::string& key, const JsonObject& v);
  /// A list of objects.
  JsonObject& add(const std::string& key, const std::vector<JsonObject>& items);
  std::string str() const { return "{" + m_body + "}"; }
  /// The finite numbers added at the top level, in order (what a TensorBoard sink plots).
  const std::vector<std::pair<std::string, double>>& numbers() const { return m_numbers; }
  /// The string added under `key`, or "" when there is none.
  std::string string_field(const std::string& key) const;

 private:
  void key(const std::string& k);
  std::string m_body;
  std::vector<std::pair<std::string, double>> m_numbers;
  std::vector<std::pair<std::string, std::string>> m_strings;
};

/// JSON string literal with escapes.
std::string json_quote(const std::string& s);

}  // namespace gt
