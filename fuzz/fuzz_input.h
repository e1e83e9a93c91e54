// Helpers shared by the fuzz targets: the readers take file paths, so each input is written to a scratch file.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

namespace gt::fuzz {

/// A per-process scratch file in /dev/shm (else $TMPDIR, else /tmp), rewritten for every input and removed at exit.
/// Memory, not disk: on this project's CI machine a disk-backed /tmp made the readers' fuzzers six times slower.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name) {
    const char* env = std::getenv("TMPDIR");
    const std::string dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : env && *env ? env : "/tmp";
    m_path = dir + "/gt_fuzz_" + std::to_string(::getpid()) + "_" + name;
  }
  ~ScratchFile() { ::unlink(m_path.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  /// Replaces the file's contents with `bytes`; returns its path.
  const std::string& write(std::string_view bytes) {
    std::ofstream out(m_path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return m_path;
  }
  const std::string& path() const { return m_path; }

 private:
  std::string m_path;
};

/// Splits an input into two files' contents: the first two bytes (little-endian) give the first part's length,
/// clamped to what is there. Seeds are built the same way (fuzz/make_corpus.py).
inline std::pair<std::string_view, std::string_view> split_two(const uint8_t* data, size_t size) {
  if (size < 2) return {{}, {}};
  const size_t want = data[0] | (size_t{data[1]} << 8);
  const std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t n = want < rest.size() ? want : rest.size();
  return {rest.substr(0, n), rest.substr(n)};
}

}  // namespace gt::fuzz
