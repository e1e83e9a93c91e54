// spdlog sinks for the console (with a live line) and train.log, and the rank filter of worker threads.
#include "log/logging.h"

#include "core/error.h"

#include <spdlog/details/log_msg_buffer.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <vector>

namespace gt {
namespace {

thread_local int t_worker_rank = 0;

// The worker threads of one process (`device: [0, 1]`) share the sinks; like the ranks of an mpirun, those other
// than rank 0 log warnings and errors only, prefixed with their rank.
class RankFilterSink final : public spdlog::sinks::sink {
 public:
  explicit RankFilterSink(std::shared_ptr<spdlog::sinks::sink> inner) : m_inner(std::move(inner)) {}
  void log(const spdlog::details::log_msg& msg) override {
    if (t_worker_rank == 0) return m_inner->log(msg);
    if (msg.level < spdlog::level::warn) return;
    const std::string text =
        fmt::format("[rank {}] {}", t_worker_rank, std::string_view(msg.payload.data(), msg.payload.size()));
    spdlog::details::log_msg tagged = msg;
    tagged.payload = spdlog::string_view_t(text.data(), text.size());
    m_inner->log(tagged);
  }
  void flush() override { m_inner->flush(); }
  void set_pattern(const std::string& pattern) override { m_inner->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override { m_inner->set_formatter(std::move(f)); }

 private:
  std::shared_ptr<spdlog::sinks::sink> m_inner;
};

// Where train.log joins the default logger: a sink the logger holds from init_logging on, forwarding to the run's
// file once one is attached. The logger's own list of sinks is not thread-safe to change, and worker-thread ranks
// log through it while rank 0 attaches the file (a push_back there crashed a 3-rank run under load); this sink's
// inner one changes under its own mutex instead. Patterns set on the logger reach the file only while it is attached,
// as when it sat in the logger's list.
//
// Warnings and errors logged while no file is attached (a bad image skipped while the data loads, before the run
// directory exists) are kept, up to kKept of them, and written first into the next file attached: train.log then
// holds every warning of the run, not only those after it was opened.
class FileSlotSink final : public spdlog::sinks::sink {
 public:
  void attach(std::shared_ptr<spdlog::sinks::sink> inner) {
    const std::lock_guard lock(m_mutex);
    m_inner = std::move(inner);
    if (!m_inner) {  // detached: what comes next belongs to the next file
      m_early.clear();
      m_dropped = 0;
      return;
    }
    for (const auto& m : m_early) m_inner->log(m);
    if (m_dropped > 0) {
      const std::string text = fmt::format("({} more warnings before this file was opened are not kept)", m_dropped);
      spdlog::details::log_msg note(spdlog::source_loc{}, "", spdlog::level::warn,
                                    spdlog::string_view_t(text.data(), text.size()));
      m_inner->log(note);
    }
    m_early.clear();
    m_dropped = 0;
  }
  void log(const spdlog::details::log_msg& msg) override {
    if (const auto inner = current()) return inner->log(msg);
    if (msg.level < spdlog::level::warn || t_worker_rank != 0) return;
    const std::lock_guard lock(m_mutex);
    if (m_inner) return m_inner->log(msg);  // attached meanwhile
    if (m_early.size() < kKept)
      m_early.emplace_back(msg);
    else
      ++m_dropped;
  }
  void flush() override {
    if (const auto inner = current()) inner->flush();
  }
  void set_pattern(const std::string& pattern) override {
    if (const auto inner = current()) inner->set_pattern(pattern);
  }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override {
    if (const auto inner = current()) inner->set_formatter(std::move(f));
  }

 private:
  std::shared_ptr<spdlog::sinks::sink> current() {
    const std::lock_guard lock(m_mutex);
    return m_inner;
  }
  static constexpr size_t kKept = 200;
  std::mutex m_mutex;
  std::shared_ptr<spdlog::sinks::sink> m_inner;
  std::vector<spdlog::details::log_msg_buffer> m_early;
  int64_t m_dropped = 0;
};

// "\r" returns to the line's start, "\033[K" (ANSI erase in line) clears from the cursor to its end.
constexpr const char* kClearLine = "\r\033[K";

// stdout, with an optional live line kept below the log lines. Everything goes through the sink's mutex, so a log
// line from another thread (the GPU sampler's warnings) never lands in the middle of a redraw.
class ConsoleSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void set_live(const std::string& line) {
    std::lock_guard lock(mutex_);
    // Writing the new line before erasing the rest of the old one does not flicker.
    if (!line.empty())
      write("\r" + line + "\033[K");
    else if (!m_live.empty())
      write(kClearLine);
    m_live = line;
  }
  void set_stream(std::FILE* stream) {
    std::lock_guard lock(mutex_);
    m_stream = stream;
  }
  void keep(const std::optional<std::string>& line) {
    std::lock_guard lock(mutex_);
    const std::string text = line ? *line : m_live;
    if (!text.empty()) write("\r" + text + "\033[K\n");
    m_live.clear();
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    if (m_live.empty()) {
      std::fwrite(formatted.data(), 1, formatted.size(), m_stream);
      return;
    }
    write(kClearLine + std::string(formatted.data(), formatted.size()) + m_live);
  }
  void flush_() override { std::fflush(m_stream); }

 private:
  void write(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), m_stream);
    std::fflush(m_stream);  // a line without a newline stays in a line-buffered stream otherwise
  }
  std::string m_live;
  std::FILE* m_stream = stdout;
};

std::shared_ptr<ConsoleSink> g_console;
std::shared_ptr<spdlog::sinks::basic_file_sink_mt> g_file_sink;
std::shared_ptr<FileSlotSink> g_file_slot;          // in the default logger's sinks from init_logging on
std::shared_ptr<spdlog::sinks::sink> g_file_entry;  // g_file_sink as the slot holds it
std::shared_ptr<spdlog::logger> g_file_logger;      // train.log alone, for step_logger()
std::atomic<bool> g_live{false};

}  // namespace

void set_thread_log_rank(int rank) { t_worker_rank = rank; }

void log_console_to_stderr() {
  if (g_console) g_console->set_stream(stderr);
}

void init_logging(bool quiet) {
  g_console = std::make_shared<ConsoleSink>();
  g_file_slot = std::make_shared<FileSlotSink>();
  auto logger = std::make_shared<spdlog::logger>(
      "gputrain", spdlog::sinks_init_list{std::make_shared<RankFilterSink>(g_console), g_file_slot});
  logger->set_pattern("[%H:%M:%S] %^%l%$: %v");
  logger->set_level(quiet ? spdlog::level::warn : spdlog::level::info);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  // Plain info lines need no level tag: a person reads them, a script reads metrics.jsonl.
  spdlog::set_pattern("[%H:%M:%S] %v");
  for (auto& sink : logger->sinks()) sink->set_pattern("[%H:%M:%S] %v");
}

void set_log_rank(int rank) {
  spdlog::set_level(spdlog::level::warn);
  spdlog::set_pattern(fmt::format("[%H:%M:%S] [rank {}] %v", rank));
}

void add_log_file(const std::string& path) {
  try {
    g_file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, false);
  } catch (const spdlog::spdlog_ex& e) {
    throw Error(fmt::format("{}: cannot open the log file: {}", path, e.what()));
  }
  g_file_sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  g_file_entry = std::make_shared<RankFilterSink>(g_file_sink);
  if (!g_file_slot) {  // no init_logging (a test's process): the slot joins the logger now, before any rank runs
    g_file_slot = std::make_shared<FileSlotSink>();
    spdlog::default_logger()->sinks().push_back(g_file_slot);
  }
  g_file_slot->attach(g_file_entry);
  g_file_logger = std::make_shared<spdlog::logger>("gputrain.file", g_file_sink);
  g_file_logger->flush_on(spdlog::level::info);  // as the default logger does
}

void remove_log_file() {
  if (!g_file_sink) return;
  g_file_sink->flush();
  g_file_slot->attach(nullptr);
  g_file_entry.reset();
  g_file_logger.reset();
  g_file_sink.reset();
}

void console_live_line(const std::string& line) {
  if (g_console) g_console->set_live(line);
}

void console_keep_live(const std::optional<std::string>& line) {
  if (g_console) g_console->keep(line);
}

void console_set_live(bool on) { g_live = on; }

spdlog::logger& step_logger() {
  if (!g_live) return *spdlog::default_logger();
  static const auto nowhere = std::make_shared<spdlog::logger>("gputrain.none");  // no train.log: no sink
  // Worker threads other than rank 0 log no step lines (the default logger's rank filter would drop them).
  spdlog::logger& file = g_file_logger && t_worker_rank == 0 ? *g_file_logger : *nowhere;
  file.set_level(spdlog::default_logger()->level());  // follows --quiet and logging.level
  return file;
}

}  // namespace gt
