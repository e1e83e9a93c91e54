// What the checkpoint files share between writing them (checkpoint.cpp) and reading them back
// (checkpoint_read.cpp): the format's names and versions, and the checksums. Not for use outside lib/train.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gt::checkpoint_detail {

inline constexpr const char* kFormat = "gputrain.checkpoint";
// 2: state.json checksums itself (state_crc32) and records the batch shape its position counts in.
// 3: the optimizer state in per-rank shard files (dist.zero ≥ 1), described by optimizer.shards; a checkpoint
// without shards is still written as version 2, so that what zero 0 writes reads as before.
inline constexpr int64_t kFormatVersion = 2, kShardedFormatVersion = 3;
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kStateFile = "state.json";
// state.json holds the resolved config: kilobytes, not megabytes.
inline constexpr size_t kStateLimit = size_t{64} << 20;
// state.json ends with this field; its value is the CRC-32 of the text before it with the object closed there
// ("…}"), so one flipped bit anywhere in the counters is caught like one in the tensor files.
inline constexpr std::string_view kStateCrcField = ", \"state_crc32\": \"";

/// 8 lowercase hex digits.
std::string hex32(uint32_t v);
/// The CRC-32 of `text`.
uint32_t crc_of(std::string_view text);

struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Size and CRC-32 of a file, read in 1 MiB pieces.
FileSum file_sum(const std::string& path);

}  // namespace gt::checkpoint_detail
