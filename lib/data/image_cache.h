// What the image folders' reader (images.cpp) and the cache of a decoded set (image_cache.cpp) share: the listing
// of a folder, and the cache's key, writer and reader. Not for use outside lib/data.
#pragma once

#include "data/images.h"

#include <cstdint>
#include <string>
#include <vector>

namespace gt::image_detail {

/// One file of a folder: its path, its class's index, and its size and modification time (the cache's key).
struct ImageFile {
  std::string path;
  int32_t label = 0;
  int64_t bytes = 0, mtime_ns = 0;
};

/// A folder DIR/<class>/<file>: its classes and files in name order.
struct Listing {
  std::string dir;
  std::vector<std::string> classes;
  std::vector<ImageFile> files;
};

/// "[cat, dog, … 40 in all]": a folder's classes for a message.
std::string class_list_text(const std::vector<std::string>& classes);

/// FNV-1a over what names the source: each split's folder, its files' paths, sizes and modification times.
uint64_t source_digest(const std::vector<const Listing*>& listings);
/// The options a cache was made with, as text: a cache of other options is stale.
std::string options_key(const ImageFolderOptions& opts, const std::string& train_dir, const std::string& test_dir);
/// Writes the decoded `splits` (train, then test when there is one) as the cache `path` (atomically).
void write_cache(const std::string& path, const std::string& options, uint64_t digest,
                 const std::vector<const Dataset*>& splits);

// The cached splits, or the reason the cache cannot serve (missing, unreadable, stale, damaged).
struct CacheRead {
  std::vector<Dataset> splits;
  std::string why_not;
  bool damaged = false;  ///< a cache of this build's format whose contents do not check: warned, not just logged
};

/// Reads the cache `path` when its key matches `options` and `digest`, and its checksum, labels and values check.
CacheRead read_cache(const std::string& path, const std::string& options, uint64_t digest,
                     const std::vector<const Listing*>& listings);

}  // namespace gt::image_detail
