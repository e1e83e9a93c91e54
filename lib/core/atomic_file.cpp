// AtomicFile: POSIX open/write/fsync/rename, retrying interrupted writes.
#include "core/atomic_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gt {

AtomicFile::AtomicFile(std::string path) : AtomicFile(std::move(path), ".tmp") {}

AtomicFile::AtomicFile(std::string path, std::string_view tmp_suffix)
    : m_path(std::move(path)), m_tmp(m_path + std::string(tmp_suffix)) {
  m_fd = ::open(m_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (m_fd < 0) throw Error(fmt::format("{}: cannot create: {}", m_tmp, std::strerror(errno)));
}

AtomicFile::~AtomicFile() {
  if (m_fd >= 0) ::close(m_fd);
  if (!m_tmp.empty()) ::unlink(m_tmp.c_str());  // not committed: no temporary is left behind
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t w = ::write(m_fd, p, bytes);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw Error(fmt::format("{}: write failed: {}", m_tmp, std::strerror(errno)));
    p += w;
    bytes -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(m_fd) != 0) throw Error(fmt::format("{}: fsync failed: {}", m_tmp, std::strerror(errno)));
  const int rc = ::close(m_fd);
  m_fd = -1;
  if (rc != 0) throw Error(fmt::format("{}: close failed: {}", m_tmp, std::strerror(errno)));
  if (::rename(m_tmp.c_str(), m_path.c_str()) != 0)
    throw Error(fmt::format("{}: cannot rename into place: {}", m_path, std::strerror(errno)));
  m_tmp.clear();
  const std::filesystem::path folder = std::filesystem::path(m_path).parent_path();
  fsync_dir(folder.empty() ? std::filesystem::path(".") : folder);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

void fsync_dir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw Error(fmt::format("{}: cannot open the folder to sync it: {}", dir.string(), std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) throw Error(fmt::format("{}: fsync failed: {}", dir.string(), std::strerror(err)));
}

}  // namespace gt
