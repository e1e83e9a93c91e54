// Token data in llm.c's shard format (`data.format: tokens`): the shard reader and writer, and the windows of T + 1
// tokens that the loader cuts from the shards on demand.
//
// A shard is 256 little-endian int32s of header (magic 20240520, version 1, token count) followed by that many
// uint16 tokens: what llm.c's data scripts write and its loader reads. Vocabularies past 65,536 ids take llm.c's
// variant for Llama 3: magic 20240801, version 7, uint32 tokens. Every reader takes both.
#pragma once

#include "core/limits.h"
#include "core/noncopyable.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gt {

// The token limits sit beside the format they bound (docs/runs.md's limits table lists them with core/limits.h's).
namespace limits {
/// Tokens in one llm.c shard: its header's count is an int32.
inline constexpr SizeLimit kShardTokens{(int64_t{1} << 31) - 1, "the most tokens one llm.c shard holds"};
/// Tokens in all the shards of a data set: 2^44 is a thousand times GPT-2's 10B-token training set.
inline constexpr SizeLimit kTokens{int64_t{1} << 44, "the most tokens a data set may hold"};
/// A token vocabulary: the model reads ids as floats, exact up to 2^24.
inline constexpr SizeLimit kTokenVocab{int64_t{1} << 24,
                                       "the largest vocabulary (ids travel as floats, exact to 2^24)"};
/// The largest vocabulary uint16 shards hold; a larger one is written as uint32 shards.
inline constexpr int64_t kUint16Vocab = int64_t{1} << 16;
}  // namespace limits

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int32_t kTokenShardMagic32 = 20240801;  ///< llm.c's uint32 shards (Llama 3)
inline constexpr int32_t kTokenShardVersion32 = 7;
inline constexpr size_t kTokenShardHeaderBytes = 256 * sizeof(int32_t);

/// Checks a shard's bytes (header and size) and returns its token count; a DataError names `path` and says what was
/// expected (the magic, the version, a count that matches the file's size). `width`, when given, receives the bytes
/// of a token: 2 (magic 20240520) or 4 (magic 20240801).
int64_t check_token_shard(const uint8_t* data, size_t size, const std::string& path, int* width = nullptr);

/// One shard, open for reading. Tokens are read with pread where they are needed (a window at a time): nothing is
/// mapped, so a shard truncated or rewritten in place while a run reads it ends the run with a DataError naming the
/// file (a short read), never with SIGBUS.
class TokenShard : NonCopyable {
 public:
  /// Opens and checks `path` (check_token_shard on its header and size).
  explicit TokenShard(const std::string& path);
  ~TokenShard();

  const std::string& path() const { return m_path; }
  int64_t size() const { return m_count; }
  /// Bytes per token: 2 (uint16 shards) or 4 (uint32).
  int width() const { return m_width; }
  /// Tokens [first, first + n) into `out` (a DataError when the file is now shorter than when it was opened).
  void read(int64_t first, int64_t n, uint32_t* out) const;
  /// Token i (i < size()).
  uint32_t at(int64_t i) const;
  /// Throws DataError when the file's size is no longer what it was when opened (checked at every epoch).
  void check_unchanged() const;

 private:
  void read_bytes(size_t offset, void* out, size_t bytes) const;
  std::string m_path;
  int m_fd = -1;
  size_t m_bytes = 0;
  int64_t m_count = 0;
  int m_width = 2;
};

/// Where a token is: the shard, its position there, and its id.
struct TokenAt {
  std::string path;
  int64_t position = 0;
  uint32_t id = 0;
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
  /// The first token (in shard order) whose id is `limit` or more, or nothing: for messages about one out of range.
  std::optional<TokenAt> first_at_or_above(int64_t limit) const;
  /// With no data.vocab_size: the token that made the vocabulary GPT-2's 50257 instead of bytes' 256.
  const std::optional<TokenAt>& first_past_bytes() const { return m_first_past_bytes; }
  /// Throws DataError when a shard's size changed since it was opened (the trainer asks at every epoch).
  void check_unchanged() const;

 private:
  std::optional<TokenAt> m_first_past_bytes;
  std::vector<std::unique_ptr<TokenShard>> m_shards;
  std::vector<int64_t> m_first;  ///< m_first[s]: the first window of shard s; back(): the number of windows
  int64_t m_block = 0, m_vocab = 0, m_tokens = 0;
};

/// The shard files a glob names, sorted; empty when none match.
std::vector<std::string> glob_files(const std::string& pattern);

/// Writes `tokens` as one llm.c shard at `path`, atomically (a temporary file renamed into place). At most
/// limits::kShardTokens tokens.
void write_token_shard(const std::string& path, const uint16_t* tokens, size_t count);
/// The same for uint32 tokens (magic 20240801, version 7).
void write_token_shard(const std::string& path, const uint32_t* tokens, size_t count);

/// `gputrain tokenize`: byte-level tokens (token = byte, vocabulary 256) of the files in order, the last
/// `val_fraction` of them written to val_NNNNNN.bin and the rest to train_NNNNNN.bin under `out_dir`, shards of at
/// most `shard_tokens` tokens, then out_dir/gputrain_tokenizer.json (text/byte_tokenizer.h), the folder's manifest
/// listing each file (core/ownership.h).
/// `out_dir` must be new or empty, or an earlier tokenization, which `force` replaces (its files removed first: no
/// stale shard outlives it); a tokenization that never finished is replaced without it. Errors: ConfigError for the
/// flags and the folder, DataError for the inputs, Error for writing.
struct TokenizeResult {
  int64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> files;     ///< the shards written, in order
  std::vector<std::string> replaced;  ///< the earlier tokenization's files, removed
  std::string tokenizer_file = "gputrain_tokenizer.json", tokenizer_kind = "bytes";  ///< the tokenizer it wrote
};
TokenizeResult tokenize_bytes(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                              int64_t shard_tokens, bool force = false);

/// `gputrain tokenize --vocab-size N` or `--tokenizer PATH.model`: subword tokens of a SentencePiece model, trained
/// here on a sample of the inputs or given. Documents (each input file, or each piece of one between --doc-sep
/// strings, which are dropped) are encoded each after the model's end-of-text id (</s>); a document is cut into
/// pieces of about 64 KiB before a lone space (where no piece of the models trained here spans: a BPE model's ids
/// are those of the whole document, a unigram model may break a tie between equally likely segmentations otherwise)
/// and the pieces are encoded on every thread, so the shards are the same for any thread count. The validation part
/// starts at the first cut after the last `val_fraction` of the input bytes begins. Ids go to uint16 shards, or uint32
/// ones (magic 20240801) for vocabularies over 65,536; out_dir/tokenizer.model is the model.
struct SubwordOptions {
  int64_t vocab_size = 0;     ///< train a vocabulary of this many pieces (0: none, `tokenizer` is given)
  std::string tokenizer;      ///< a SentencePiece .model to encode with
  std::string model = "bpe";  ///< bpe or unigram
  bool byte_fallback = true;
  double character_coverage = 1.0;
  uint32_t seed = 1;
  int64_t sample_bytes = 100'000'000;  ///< the trainer's sample: the first share of each input, in proportion
  std::string doc_sep;                 ///< splits a file into documents where it occurs ("" : a file is one)
};
TokenizeResult tokenize_subword(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                                int64_t shard_tokens, bool force, const SubwordOptions& options);

/// tokenize's checks on the inputs, shared by both: every one a regular readable file; returns their total bytes.
int64_t check_tokenize_inputs(const std::vector<std::string>& inputs);

}  // namespace gt
