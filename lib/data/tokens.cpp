// llm.c token shards: the checked reader (mapped, never copied), the windows the loader cuts from them, the atomic
// writer, and the byte-level tokenizer behind `gputrain tokenize`.
#include "data/tokens.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/limits.h"
#include "core/parallel.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace gt {
namespace {

int32_t header_word(const uint8_t* data, int i) {
  int32_t v;  // little-endian on every host gputrain builds for (x86-64, aarch64)
  std::memcpy(&v, data + 4 * i, 4);
  return v;
}

// The first token at or past `vocab` in [0, n), or -1: threads scan chunks, the smallest position wins.
int64_t first_at_or_above(const uint8_t* tokens, int64_t n, int64_t vocab) {
  std::atomic<int64_t> first{n};
  parallel_for(n, int64_t{1} << 20, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e && i < first.load(std::memory_order_relaxed); ++i) {
      uint16_t t;
      std::memcpy(&t, tokens + 2 * i, 2);
      if (t >= vocab) {
        int64_t seen = first.load();
        while (i < seen && !first.compare_exchange_weak(seen, i)) {
        }
        return;
      }
    }
  });
  return first.load() == n ? -1 : first.load();
}

}  // namespace

int64_t check_token_shard(const uint8_t* data, size_t size, const std::string& path) {
  if (size < kTokenShardHeaderBytes)
    throw DataError(fmt::format("{}: {} bytes: not an llm.c token shard (expected a header of {} bytes, 256 int32s)",
                                path, size, kTokenShardHeaderBytes));
  const int32_t magic = header_word(data, 0), version = header_word(data, 1), count = header_word(data, 2);
  if (magic != kTokenShardMagic)
    throw DataError(fmt::format("{}: not an llm.c token shard: magic {}, expected {}{}", path, magic, kTokenShardMagic,
                                magic == 20240326 ? " (20240326 is an llm.c model checkpoint, not data)" : ""));
  if (version != kTokenShardVersion)
    throw DataError(fmt::format("{}: llm.c token shard version {}, expected {} (uint16 tokens)", path, version,
                                kTokenShardVersion));
  if (count < 0) throw DataError(fmt::format("{}: the header's token count is {}, expected ≥ 0", path, count));
  const size_t expected = kTokenShardHeaderBytes + 2 * static_cast<size_t>(count);
  if (size != expected)
    throw DataError(fmt::format("{}: the file has {} bytes, expected {} (a {}-byte header and {} uint16 tokens){}",
                                path, size, expected, kTokenShardHeaderBytes, count,
                                size < expected ? ": truncated" : ": data after the last token"));
  return count;
}

TokenShard::TokenShard(const std::string& path) : m_path(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    throw DataError(fmt::format("{}: {}", path, S_ISREG(st.st_mode) ? std::strerror(err) : "not a regular file"));
  }
  m_bytes = static_cast<size_t>(st.st_size);
  if (m_bytes > 0) {
    void* p = ::mmap(nullptr, m_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw DataError(fmt::format("{}: cannot map: {}", path, std::strerror(err)));
    }
    m_map = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid
  try {
    m_count = check_token_shard(m_map, m_bytes, path);
  } catch (...) {
    if (m_map) ::munmap(const_cast<uint8_t*>(m_map), m_bytes);
    throw;
  }
}

TokenShard::~TokenShard() {
  if (m_map) ::munmap(const_cast<uint8_t*>(m_map), m_bytes);
}

uint16_t TokenShard::at(int64_t i) const {
  uint16_t t;
  std::memcpy(&t, m_map + kTokenShardHeaderBytes + 2 * static_cast<size_t>(i), 2);
  return t;
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
  const int64_t limit = vocab_size > 0 ? vocab_size : 50257;
  bool bytes = true;
  for (const auto& s : m_shards) {
    if (s->size() == 0) continue;
    const int64_t bad = first_at_or_above(s->data(), s->size(), limit);
    if (bad >= 0)
      throw DataError(fmt::format(
          "{}: token {} at position {} is not below the vocabulary size {}{}", s->path(), s->at(bad), bad, limit,
          vocab_size > 0 ? " (data.vocab_size)" : " (the default for tokens past 255, GPT-2's; set data.vocab_size)"));
    if (vocab_size == 0 && bytes) bytes = first_at_or_above(s->data(), s->size(), 256) < 0;
  }
  if (vocab_size == 0) m_vocab = bytes ? 256 : 50257;
}

void TokenWindows::window(int64_t i, float* x, int32_t* y) const {
  const auto it = std::upper_bound(m_first.begin(), m_first.end(), i);
  const size_t s = static_cast<size_t>(it - m_first.begin()) - 1;
  const TokenShard& shard = *m_shards[s];
  const int64_t start = (i - m_first[s]) * m_block;
  for (int64_t t = 0; t < m_block; ++t) {
    x[t] = static_cast<float>(shard.at(start + t));
    y[t] = shard.at(start + t + 1);
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

void write_token_shard(const std::string& path, const uint16_t* tokens, size_t count) {
  if (count > static_cast<size_t>(limits::kShardTokens.max))
    throw Error(
        fmt::format("{}: {} tokens, more than one llm.c shard holds ({})", path, count, limits::kShardTokens.max));
  int32_t header[256] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(count);
  AtomicFile file(path);
  file.write(header, sizeof header);
  file.write(tokens, 2 * count);
  file.commit();
}

TokenizeResult tokenize_bytes(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                              int64_t shard_tokens) {
  namespace fs = std::filesystem;
  if (inputs.empty()) throw Error("tokenize: no input files");
  if (!(val_fraction >= 0 && val_fraction < 1))
    throw Error(fmt::format("tokenize: --val-fraction {} is not in [0, 1)", val_fraction));
  if (shard_tokens < 1 || shard_tokens > limits::kShardTokens.max)
    throw Error(fmt::format("tokenize: --shard-tokens {} is not in [1, {}] ({})", shard_tokens,
                            limits::kShardTokens.max, limits::kShardTokens.what));
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
  const auto val = static_cast<int64_t>(std::llround(static_cast<double>(total) * val_fraction));
  const int64_t train = total - val;
  if (train == 0) throw DataError(fmt::format("tokenize: --val-fraction {} leaves no training tokens", val_fraction));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the directory: {}", out_dir, ec.message()));

  TokenizeResult r;
  r.train_tokens = train;
  r.val_tokens = val;
  std::vector<uint16_t> buf;
  int64_t done = 0;  // tokens written so far, train then val
  int shard = 0;
  bool in_val = false;
  auto flush = [&] {
    if (buf.empty()) return;
    const std::string path = fmt::format("{}/{}_{:06d}.bin", out_dir, in_val ? "val" : "train", shard++);
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
  write_file_atomic(out_dir + "/tokenizer.json", json + "\n");
  return r;
}

}  // namespace gt
