// Test helpers: running the gputrain binary, temporary folders, reading small JSON fields.
#pragma once

#include <optional>
#include <string>

namespace gt::test {

struct CommandResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr together
};

/// Runs `gputrain <args>` through the shell (args are passed as written) and captures its output.
CommandResult run_gputrain(const std::string& args);

/// A fresh empty folder under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return m_path; }
  std::string operator/(const std::string& name) const { return m_path + "/" + name; }

 private:
  std::string m_path;
};

std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);
/// The number stored under "key" in a one-line JSON object; nullopt when absent or null.
std::optional<double> json_number(const std::string& json, const std::string& key);
/// The string stored under "key".
std::optional<std::string> json_string(const std::string& json, const std::string& key);
/// Path of a file in the source tree (configs/…).
std::string source_path(const std::string& rel);

}  // namespace gt::test
