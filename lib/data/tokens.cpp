// llm.c token shards: the checked reader (positioned reads, so a shard cut short under a run is an error, never a
// signal), the windows the loader cuts from them, the atomic
// writer, and the byte-level tokenizer behind `gputrain tokenize`.
#include "data/tokens.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/limits.h"
#include "core/ownership.h"
#include "core/parallel.h"
#include "text/byte_tokenizer.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

namespace gt {
namespace {

int32_t header_word(const uint8_t* data, int i) {
  int32_t v;  // little-endian on every host gputrain builds for (x86-64, aarch64)
  std::memcpy(&v, data + 4 * i, 4);
  return v;
}

// Tokens read per chunk when a shard is scanned whole (2 MiB of uint16s).
constexpr int64_t kScanChunk = int64_t{1} << 20;

// The first token at or past each limit in `shard` (positions; n when there is none), in one pass over the file:
// threads read and scan chunks, the smallest position wins. A chunk stops once it has found both, or starts past
// what others found.
std::array<int64_t, 2> first_tokens_at_or_above(const TokenShard& shard, std::array<int64_t, 2> bounds) {
  const int64_t n = shard.size();
  std::array<std::atomic<int64_t>, 2> first{n, n};
  auto lower = [](std::atomic<int64_t>& f, int64_t at) {
    int64_t seen = f.load();
    while (at < seen && !f.compare_exchange_weak(seen, at)) {
    }
  };
  parallel_for((n + kScanChunk - 1) / kScanChunk, 1, [&](int64_t cb, int64_t ce) {
    std::vector<uint32_t> buf(static_cast<size_t>(kScanChunk));
    for (int64_t c = cb; c < ce; ++c) {
      const int64_t begin = c * kScanChunk, count = std::min(kScanChunk, n - begin);
      if (begin >= first[0].load(std::memory_order_relaxed) && begin >= first[1].load(std::memory_order_relaxed))
        return;
      shard.read(begin, count, buf.data());
      std::array<bool, 2> found{false, false};
      for (int64_t i = 0; i < count && !(found[0] && found[1]); ++i)
        for (size_t k = 0; k < 2; ++k)
          if (!found[k] && buf[static_cast<size_t>(i)] >= bounds[k]) {
            found[k] = true;
            lower(first[k], begin + i);
          }
      if (found[0] && found[1]) return;
    }
  });
  return {first[0].load(), first[1].load()};
}

}  // namespace

int64_t check_token_shard(const uint8_t* data, size_t size, const std::string& path, int* width) {
  if (size < kTokenShardHeaderBytes)
    throw DataError(fmt::format("{}: {} bytes: not an llm.c token shard (expected a header of {} bytes, 256 int32s)",
                                path, size, kTokenShardHeaderBytes));
  const int32_t magic = header_word(data, 0), version = header_word(data, 1), count = header_word(data, 2);
  if (magic != kTokenShardMagic && magic != kTokenShardMagic32)
    throw DataError(fmt::format("{}: not an llm.c token shard: magic {}, expected {} (uint16 tokens) or {} (uint32){}",
                                path, magic, kTokenShardMagic, kTokenShardMagic32,
                                magic == 20240326 ? " (20240326 is an llm.c model checkpoint, not data)" : ""));
  const bool wide = magic == kTokenShardMagic32;
  const int32_t want = wide ? kTokenShardVersion32 : kTokenShardVersion;
  if (version != want)
    throw DataError(fmt::format("{}: llm.c token shard version {}, expected {} (magic {}: {} tokens)", path, version,
                                want, magic, wide ? "uint32" : "uint16"));
  if (count < 0) throw DataError(fmt::format("{}: the header's token count is {}, expected ≥ 0", path, count));
  const size_t bytes = wide ? 4 : 2;
  const size_t expected = kTokenShardHeaderBytes + bytes * static_cast<size_t>(count);
  if (size != expected)
    throw DataError(fmt::format("{}: the file has {} bytes, expected {} (a {}-byte header and {} {} tokens){}", path,
                                size, expected, kTokenShardHeaderBytes, count, wide ? "uint32" : "uint16",
                                size < expected ? ": truncated" : ": data after the last token"));
  if (width) *width = static_cast<int>(bytes);
  return count;
}

TokenShard::TokenShard(const std::string& path) : m_path(path) {
  m_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (m_fd < 0) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  try {
    struct stat st {};
    if (::fstat(m_fd, &st) != 0) throw DataError(fmt::format("{}: {}", path, std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) throw DataError(fmt::format("{}: not a regular file", path));
    m_bytes = static_cast<size_t>(st.st_size);
    uint8_t header[kTokenShardHeaderBytes] = {};
    const size_t head = std::min(m_bytes, sizeof header);
    read_bytes(0, header, head);
    m_count = check_token_shard(header, m_bytes, path, &m_width);
  } catch (...) {
    ::close(m_fd);
    throw;
  }
}

TokenShard::~TokenShard() { ::close(m_fd); }

void TokenShard::read_bytes(size_t offset, void* out, size_t bytes) const {
  auto* p = static_cast<uint8_t*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(m_fd, p, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw DataError(fmt::format("{}: cannot read: {}", m_path, std::strerror(errno)));
    if (got == 0) {
      struct stat st {};
      const long long now = ::fstat(m_fd, &st) == 0 ? static_cast<long long>(st.st_size) : -1;
      throw DataError(
          fmt::format("{}: the file was cut short while this run read it ({} bytes when opened, {} now): "
                      "a shard was rewritten in place? Write new shards under new names",
                      m_path, m_bytes, now));
    }
    p += got;
    offset += static_cast<size_t>(got);
    bytes -= static_cast<size_t>(got);
  }
}

void TokenShard::read(int64_t first, int64_t n, uint32_t* out) const {
  GT_CHECK(first >= 0 && n >= 0 && first + n <= m_count, "tokens [{}, {}) of {}", first, first + n, m_count);
  const auto w = static_cast<size_t>(m_width);
  read_bytes(kTokenShardHeaderBytes + w * static_cast<size_t>(first), out, w * static_cast<size_t>(n));
  if (w == 2) {  // widened in place, from the back: token i's two bytes sit at 2i, below its four at 4i
    const auto* bytes = reinterpret_cast<const uint8_t*>(out);
    for (int64_t i = n - 1; i >= 0; --i) {
      uint16_t v;
      std::memcpy(&v, bytes + 2 * i, 2);
      out[i] = v;
    }
  }
}

uint32_t TokenShard::at(int64_t i) const {
  uint32_t t;
  read(i, 1, &t);
  return t;
}

void TokenShard::check_unchanged() const {
  struct stat st {};
  if (::fstat(m_fd, &st) != 0) throw DataError(fmt::format("{}: {}", m_path, std::strerror(errno)));
  if (static_cast<size_t>(st.st_size) != m_bytes)
    throw DataError(
        fmt::format("{}: the file changed size while this run read it ({} bytes when opened, {} now): a "
                    "shard was rewritten in place? Write new shards under new names",
                    m_path, m_bytes, static_cast<long long>(st.st_size)));
}

TokenWindows::TokenWindows(const std::vector<std::string>& paths, int64_t block_size, int64_t vocab_size)
    : m_block(block_size), m_vocab(vocab_size) {
  if (block_size < 1) throw DataError(fmt::format("block size {}: expected ≥ 1", block_size));
  m_first.push_back(0);
  for (const std::string& p : paths) {
    m_shards.push_back(std::make_unique<TokenShard>(p));
    const int64_t n = m_shards.back()->size();
    m_tokens += n;
    m_first.push_back(m_first.back() + (n > block_size ? (n - 1) / block_size : 0));
  }
  if (m_tokens > limits::kTokens.max)
    throw DataError(fmt::format("{}: {} tokens, more than {} ({})", describe(), m_tokens, limits::kTokens.max,
                                limits::kTokens.what));
  if (windows() == 0)
    throw DataError(fmt::format("{}: {} tokens, not one window of block_size + 1 = {} tokens in any shard", describe(),
                                m_tokens, block_size + 1));
  // Every token is checked once here, so the embedding and the loss never meet one out of range.
  // With no vocab_size the same pass finds the first token past 255, which makes the vocabulary GPT-2's.
  const int64_t limit = vocab_size > 0 ? vocab_size : 50257;
  for (const auto& s : m_shards) {
    if (s->size() == 0) continue;
    const bool want_wide = vocab_size == 0 && !m_first_past_bytes;
    const auto [bad, wide] = first_tokens_at_or_above(*s, {limit, want_wide ? 256 : limit});
    if (bad < s->size())
      throw DataError(fmt::format(
          "{}: token {} at position {} is not below the vocabulary size {}{}", s->path(), s->at(bad), bad, limit,
          vocab_size > 0 ? " (data.vocab_size)" : " (the default for tokens past 255, GPT-2's; set data.vocab_size)"));
    if (want_wide && wide < s->size()) m_first_past_bytes = TokenAt{s->path(), wide, s->at(wide)};
  }
  if (vocab_size == 0) m_vocab = m_first_past_bytes ? 50257 : 256;
}

std::optional<TokenAt> TokenWindows::first_at_or_above(int64_t limit) const {
  for (const auto& s : m_shards)
    if (const int64_t at = first_tokens_at_or_above(*s, {limit, limit})[0]; at < s->size())
      return TokenAt{s->path(), at, s->at(at)};
  return std::nullopt;
}

void TokenWindows::check_unchanged() const {
  for (const auto& s : m_shards) s->check_unchanged();
}

void TokenWindows::window(int64_t i, float* x, int32_t* y) const {
  const auto it = std::upper_bound(m_first.begin(), m_first.end(), i);
  const size_t s = static_cast<size_t>(it - m_first.begin()) - 1;
  const TokenShard& shard = *m_shards[s];
  const int64_t start = (i - m_first[s]) * m_block;
  thread_local std::vector<uint32_t> tokens;  // (the loader's threads each read their own windows)
  tokens.resize(static_cast<size_t>(m_block + 1));
  shard.read(start, m_block + 1, tokens.data());
  for (int64_t t = 0; t < m_block; ++t) {
    x[t] = static_cast<float>(tokens[static_cast<size_t>(t)]);
    y[t] = static_cast<int32_t>(tokens[static_cast<size_t>(t + 1)]);
  }
}

std::string TokenWindows::describe() const {
  if (m_shards.size() == 1) return m_shards[0]->path();
  return fmt::format("{} shards ({} … {})", m_shards.size(), m_shards.front()->path(), m_shards.back()->path());
}

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> out;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

void write_shard(const std::string& path, const void* tokens, size_t count, bool wide) {
  if (count > static_cast<size_t>(limits::kShardTokens.max))
    throw Error(
        fmt::format("{}: {} tokens, more than one llm.c shard holds ({})", path, count, limits::kShardTokens.max));
  int32_t header[256] = {};
  header[0] = wide ? kTokenShardMagic32 : kTokenShardMagic;
  header[1] = wide ? kTokenShardVersion32 : kTokenShardVersion;
  header[2] = static_cast<int32_t>(count);
  AtomicFile file(path);
  file.write(header, sizeof header);
  file.write(tokens, (wide ? 4 : 2) * count);
  file.commit();
}

}  // namespace

void write_token_shard(const std::string& path, const uint16_t* tokens, size_t count) {
  write_shard(path, tokens, count, false);
}

void write_token_shard(const std::string& path, const uint32_t* tokens, size_t count) {
  write_shard(path, tokens, count, true);
}

int64_t check_tokenize_inputs(const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  // Every input is opened and sized before anything is written.
  int64_t total = 0;
  for (const std::string& p : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (!fs::is_regular_file(st))
      throw DataError(fmt::format("{}: {}", p, fs::exists(st) ? "not a regular file" : "no such file"));
    std::ifstream probe(p, std::ios::binary);
    if (!probe) throw DataError(fmt::format("{}: cannot open: {}", p, std::strerror(errno)));
    total += static_cast<int64_t>(fs::file_size(p, ec));
    if (total > limits::kTokens.max)
      throw DataError(fmt::format("{}: the inputs exceed {} bytes ({})", p, limits::kTokens.max, limits::kTokens.what));
  }
  if (total == 0) throw DataError(fmt::format("{}: the input is empty: nothing to tokenize", inputs.front()));
  return total;
}

TokenizeResult tokenize_bytes(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                              int64_t shard_tokens, bool force) {
  // Flags first (usage errors, exit 2), then the inputs (data errors, exit 1), then the folder: nothing is written
  // before every check has passed.
  if (inputs.empty()) throw ConfigError("tokenize: no input files");
  if (out_dir.empty()) throw ConfigError("tokenize --out: an empty path");
  if (!(val_fraction >= 0 && val_fraction < 1))
    throw ConfigError(fmt::format("tokenize --val-fraction {}: expected a number in [0, 1)", val_fraction));
  if (shard_tokens < 1 || shard_tokens > limits::kShardTokens.max)
    throw ConfigError(fmt::format("tokenize --shard-tokens {}: expected a number in [1, {}] ({})", shard_tokens,
                                  limits::kShardTokens.max, limits::kShardTokens.what));
  const int64_t total = check_tokenize_inputs(inputs);
  const auto val = static_cast<int64_t>(std::llround(static_cast<double>(total) * val_fraction));
  const int64_t train = total - val;
  if (train == 0) throw ConfigError(fmt::format("tokenize --val-fraction {}: leaves no training tokens", val_fraction));
  // The folder is this tokenization's: new or empty, or an earlier tokenization replaced whole (--force), never
  // another command's output or a folder of other files; and an input is never inside it (it would be removed).
  refuse_input_inside("--out", out_dir, inputs);
  const ClaimedFolder claimed =
      claim_output_folder("--out", out_dir, Owner::tokenization, force ? Reuse::replace : Reuse::never,
                          "--force replaces it (its shards are removed first)");

  TokenizeResult r;
  r.train_tokens = train;
  r.val_tokens = val;
  r.replaced = claimed.removed;
  std::vector<std::string> written;  // the manifest's list: each name recorded before its file is written
  std::vector<uint16_t> buf;
  int64_t done = 0;  // tokens written so far, train then val
  int shard = 0;
  bool in_val = false;
  auto flush = [&] {
    if (buf.empty()) return;
    const std::string name = fmt::format("{}_{:06d}.bin", in_val ? "val" : "train", shard++);
    written.push_back(name);
    write_manifest(out_dir, Owner::tokenization, written, false);
    const std::string path = out_dir + "/" + name;
    write_token_shard(path, buf.data(), buf.size());
    r.files.push_back(path);
    buf.clear();
  };
  std::vector<char> chunk(size_t{1} << 20);
  for (const std::string& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw DataError(fmt::format("{}: cannot open: {}", p, std::strerror(errno)));
    while (in) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const auto got = static_cast<size_t>(in.gcount());
      if (in.bad()) throw DataError(fmt::format("{}: cannot read: {}", p, std::strerror(errno)));
      for (size_t i = 0; i < got; ++i) {
        if (done == train && !in_val) {  // the split: the rest is validation, numbered from 0 again
          flush();
          in_val = true;
          shard = 0;
        }
        if (done == total) break;  // a file that grew since it was sized: its new bytes are not read
        buf.push_back(static_cast<uint8_t>(chunk[i]));
        ++done;
        if (static_cast<int64_t>(buf.size()) == shard_tokens) flush();
      }
    }
  }
  if (done < total)
    throw DataError(fmt::format("{}: the inputs shrank while being read ({} of {} bytes)", inputs.back(), done, total));
  flush();
  const std::string json = JsonObject()
                               .add("type", "bytes")
                               .add("vocab_size", 256)
                               .add("train_tokens", train)
                               .add("val_tokens", val)
                               .add("format", "llm.c token shards (magic 20240520, version 1, uint16 tokens)")
                               .str();
  written.push_back(kByteDescriptorName);
  write_manifest(out_dir, Owner::tokenization, written, false);
  write_file_atomic(out_dir + "/" + kByteDescriptorName, json + "\n");
  write_manifest(out_dir, Owner::tokenization, written, true);  // only now does the folder read as a tokenization
  return r;
}

}  // namespace gt
