// Token data in llm.c's shard format (`data.format: tokens`): the shard reader and writer, and the windows of T + 1
// tokens that the loader cuts from the shards on demand.
//
// A shard is 256 little-endian int32s of header (magic 20240520, version 1, token count) followed by that many
// uint16 tokens: what llm.c's data scripts write and its loader reads.
#pragma once

#include "core/limits.h"
#include "core/noncopyable.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gt {

// The token limits sit beside the format they bound (the README's limits table lists them with core/limits.h's).
namespace limits {
/// Tokens in one llm.c shard: its header's count is an int32.
inline constexpr SizeLimit kShardTokens{(int64_t{1} << 31) - 1, "the most tokens one llm.c shard holds"};
/// Tokens in all the shards of a data set: 2^44 is a thousand times GPT-2's 10B-token training set.
inline constexpr SizeLimit kTokens{int64_t{1} << 44, "the most tokens a data set may hold"};
/// A token vocabulary: shards hold uint16 tokens.
inline constexpr SizeLimit kTokenVocab{int64_t{1} << 16, "the largest vocabulary of uint16 tokens"};
}  // namespace limits

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderBytes = 256 * sizeof(int32_t);

/// Checks a shard's bytes (header and size) and returns its token count; a DataError names `path` and says what was
/// expected (the magic, the version, a count that matches the file's size).
int64_t check_token_shard(const uint8_t* data, size_t size, const std::string& path);

/// One shard, mapped read-only into memory (the tokens are never copied: GPT-2's data is billions of them).
class TokenShard : NonCopyable {
 public:
  /// Maps and checks `path` (check_token_shard).
  explicit TokenShard(const std::string& path);
  ~TokenShard();

  const std::string& path() const { return m_path; }
  int64_t size() const { return m_count; }
  /// Token i (i < size()).
  uint16_t at(int64_t i) const;
  /// The tokens' bytes (little-endian uint16s; not aligned to 2 when the file is not).
  const uint8_t* data() const { return m_map + kTokenShardHeaderBytes; }

 private:
  std::string m_path;
  const uint8_t* m_map = nullptr;
  size_t m_bytes = 0;
  int64_t m_count = 0;
};

/// The windows of a list of shards, as llm.c's loader takes them: window i of a shard is its tokens [i·T, i·T + T + 1)
/// (stride T), every full window, none across two shards; the shards' windows follow each other in the list's order.
/// A window's input is its first T tokens, its target the last T (the next token at every position).
class TokenWindows {
 public:
  /// Opens every shard of `paths` for windows of `block_size` + 1 tokens. Every token must be below `vocab_size`
  /// (0: the default, 256 when every token is below 256, else 50257, GPT-2's vocabulary; a token past that needs
  /// an explicit data.vocab_size). A shard too short for one window contributes none; no window at all is a
  /// DataError, as is a token out of range (naming the shard and the token's position).
  TokenWindows(const std::vector<std::string>& paths, int64_t block_size, int64_t vocab_size);

  int64_t block_size() const { return m_block; }
  int64_t vocab_size() const { return m_vocab; }
  int64_t windows() const { return m_first.back(); }
  int64_t tokens() const { return m_tokens; }  ///< in all the shards
  /// Window i's input (T token ids as floats) into x and its targets (T int32) into y.
  void window(int64_t i, float* x, int32_t* y) const;
  /// "N shards (path, …)" for logs.
  std::string describe() const;

 private:
  std::vector<std::unique_ptr<TokenShard>> m_shards;
  std::vector<int64_t> m_first;  ///< m_first[s]: the first window of shard s; back(): the number of windows
  int64_t m_block = 0, m_vocab = 0, m_tokens = 0;
};

/// The shard files a glob names, sorted; empty when none match.
std::vector<std::string> glob_files(const std::string& pattern);

/// Writes `tokens` as one llm.c shard at `path`, atomically (a temporary file renamed into place). At most
/// limits::kShardTokens tokens.
void write_token_shard(const std::string& path, const uint16_t* tokens, size_t count);

/// `gputrain tokenize`: byte-level tokens (token = byte, vocabulary 256) of the files in order, the last
/// `val_fraction` of them written to val_NNNNNN.bin and the rest to train_NNNNNN.bin under `out_dir`, shards of at
/// most `shard_tokens` tokens, then out_dir/tokenizer.json. Returns a line for the user. Errors: Error/DataError.
struct TokenizeResult {
  int64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> files;  ///< the shards written, in order
};
TokenizeResult tokenize_bytes(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                              int64_t shard_tokens);

}  // namespace gt
