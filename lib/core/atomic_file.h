// Files replaced whole or not at all: written beside the target, synced and renamed over it, so a reader (or a crash
// at any moment) sees the old file or the new one, never half of one. Every writer of a result file goes through it.
#pragma once

#include "core/noncopyable.h"

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace gt {

/// A file being written to `path + ".tmp"`; commit() makes it `path`. An AtomicFile destroyed uncommitted (a write
/// failed, an exception passed) removes its temporary, so a failed write leaves nothing beside the target. Errors
/// throw gt::Error naming the file and the system's reason: the temporary for create, write, sync and close, the
/// target for the rename.
class AtomicFile : NonCopyable {
 public:
  explicit AtomicFile(std::string path);
  /// Several writers of the same bytes at once (ranks filling one shared cache): each writes its own temporary,
  /// `path + tmp_suffix`, and the renames replace the target whole, one after the other.
  AtomicFile(std::string path, std::string_view tmp_suffix);
  ~AtomicFile();

  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  /// fsync, close, rename over the target, then fsync the folder so the rename itself survives a crash.
  void commit();

 private:
  std::string m_path, m_tmp;
  int m_fd;
};

/// The whole of `bytes` as the file `path`, through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view bytes);

/// Makes the entries of `dir` (a rename, a new file) durable. A file system that cannot sync a folder (EINVAL) is
/// let be; any other failure throws, naming the folder.
void fsync_dir(const std::filesystem::path& dir);

}  // namespace gt
