// Test helpers: process runner, temp dirs, tiny JSON field readers.
#include "helpers.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace gt::test {

CommandResult run_gputrain(const std::string& args) {
  const std::string cmd = std::string(GT_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed");
  CommandResult r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "gputrain-test-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  m_path = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(m_path, ec);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::optional<double> json_number(const std::string& json, const std::string& key) {
  const std::regex re("\"" + key + "\": (-?[0-9][0-9.eE+-]*)");
  std::smatch m;
  if (!std::regex_search(json, m, re)) return std::nullopt;
  return std::stod(m[1].str());
}

std::optional<std::string> json_string(const std::string& json, const std::string& key) {
  const std::regex re("\"" + key + "\": \"([^\"]*)\"");
  std::smatch m;
  if (!std::regex_search(json, m, re)) return std::nullopt;
  return m[1].str();
}

std::string source_path(const std::string& rel) { return std::string(GT_SOURCE_DIR) + "/" + rel; }

}  // namespace gt::test
