// Logging set-up (spdlog): the console, train.log, the live progress line and the rank prefixes.
#pragma once

#include <spdlog/spdlog.h>

#include <optional>
#include <string>

namespace gt {

/// Console logging: info and above to stdout with a time stamp; `quiet` keeps warnings and errors only.
void init_logging(bool quiet = false);
/// The console's log lines go to stderr from now on (they go to stdout by default): for commands whose stdout is
/// machine output (JSON, CSV, YAML), so a parser of it never meets a warning.
void log_console_to_stderr();
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

}  // namespace gt
