// Errors: one exception type whose kind decides the exit code; the GT_CHECK macros build its message.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace gt {

/// What went wrong, in the terms `main` maps to exit codes (README.md: "Exit codes").
enum class ErrorKind {
  runtime,      ///< exit 1: anything at run time (I/O, numerics, a device failing)
  config,       ///< exit 2: a bad config file, override or command line
  data,         ///< exit 1: a data file that is missing pieces or corrupt
  distributed,  ///< exit 3: another rank failed, timed out, or the launch cannot work
  diverged,     ///< exit 4: training produced a non-finite loss or gradient
};

/// The one exception type of the library; `main` catches it and picks the exit code.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), m_kind(kind) {}
  explicit Error(const std::string& message) : Error(ErrorKind::runtime, message) {}
  ErrorKind kind() const { return m_kind; }

 private:
  ErrorKind m_kind;
};

/// A config error: the message already names the key path and the YAML position.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message) : Error(ErrorKind::config, message) {}
};

/// A data file error: the message names the file and what is wrong with it.
class DataError : public Error {
 public:
  explicit DataError(const std::string& message) : Error(ErrorKind::data, message) {}
};

}  // namespace gt

/// Checks an internal invariant; the message says which and where. Programmer errors, not user errors.
#define GT_CHECK(cond, ...)                                                                               \
  do {                                                                                                    \
    if (!(cond))                                                                                          \
      throw ::gt::Error(::fmt::format("{}:{}: internal check `{}` failed: {}", __FILE__, __LINE__, #cond, \
                                      ::fmt::format(__VA_ARGS__)));                                       \
  } while (0)
