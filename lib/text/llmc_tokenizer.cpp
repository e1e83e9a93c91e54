// Decoding with llm.c's gpt2_tokenizer.bin: the layout its tokenizer.h reads (a 1 KiB header, then length-prefixed
// token bytes), checked field by field.
#include "text/llmc_tokenizer.h"

#include "core/error.h"

#include <fmt/format.h>

#include <array>
#include <fstream>
#include <iterator>
#include <vector>

namespace gt {
namespace {

constexpr uint32_t kTokenizerMagic = 20240328;
constexpr uint32_t kTokenizerGpt2Vocab = 50257, kTokenizerGpt2Eot = 50256;  // what version 1 implies
constexpr uint32_t kTokenizerMaxVocab = uint32_t{1} << 24;

class LlmcTokenizer final : public Tokenizer {
 public:
  LlmcTokenizer(std::string path, std::vector<std::string> tokens, std::optional<uint32_t> eot)
      : m_path(std::move(path)), m_tokens(std::move(tokens)), m_eot(eot) {}
  std::string kind() const override { return "llm.c gpt2_tokenizer.bin (decoding only)"; }
  std::string file_name() const override { return "gpt2_tokenizer.bin"; }
  bool encodes() const override { return false; }
  std::vector<uint32_t> encode(std::string_view) const override {
    throw ConfigError(
        fmt::format("{}: an llm.c tokenizer file holds no merges and can only decode; encode with the "
                    "model's tokenizer.json",
                    m_path));
  }
  std::string token_bytes(uint32_t id) const override {
    if (id >= m_tokens.size())
      throw DataError(fmt::format("token id {} is past the vocabulary of {} ({} tokens)", id, m_path, m_tokens.size()));
    return m_tokens[id];
  }
  uint32_t vocab_size() const override { return static_cast<uint32_t>(m_tokens.size()); }
  std::optional<uint32_t> end_of_text() const override { return m_eot; }

 private:
  std::string m_path;
  std::vector<std::string> m_tokens;
  std::optional<uint32_t> m_eot;
};

uint32_t tokenizer_le32(const unsigned char* p) { return p[0] | p[1] << 8 | p[2] << 16 | uint32_t{p[3]} << 24; }

}  // namespace

std::unique_ptr<Tokenizer> load_llmc_tokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open the llm.c tokenizer file", path));
  const std::vector<unsigned char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const auto fail = [&](const std::string& what) -> ConfigError {
    return ConfigError(fmt::format("{}: not an llm.c tokenizer file: {}", path, what));
  };
  if (bytes.size() < 1024) throw fail(fmt::format("{} bytes, less than its 1024-byte header", bytes.size()));
  if (tokenizer_le32(bytes.data()) != kTokenizerMagic)
    throw fail(fmt::format("magic {} (expected {})", tokenizer_le32(bytes.data()), kTokenizerMagic));
  const uint32_t version = tokenizer_le32(bytes.data() + 4), vocab = tokenizer_le32(bytes.data() + 8);
  if (version != 1 && version != 2) throw fail(fmt::format("version {} (1 and 2 are known)", version));
  if (vocab == 0 || vocab > kTokenizerMaxVocab) throw fail(fmt::format("vocabulary size {}", vocab));
  if (version == 1 && vocab != kTokenizerGpt2Vocab)
    throw fail(fmt::format("version 1 is GPT-2's {} tokens, but the header says {}", kTokenizerGpt2Vocab, vocab));
  const uint32_t eot = version == 1 ? kTokenizerGpt2Eot : tokenizer_le32(bytes.data() + 12);
  if (eot >= vocab) throw fail(fmt::format("end-of-text id {} is past the {} tokens", eot, vocab));
  std::vector<std::string> tokens;
  tokens.reserve(vocab);
  size_t at = 1024;
  for (uint32_t id = 0; id < vocab; ++id) {
    if (at >= bytes.size()) throw fail(fmt::format("cut short in token {} of {}", id, vocab));
    const size_t n = bytes[at++];
    if (n == 0) throw fail(fmt::format("token {} has length 0", id));
    if (at + n > bytes.size()) throw fail(fmt::format("cut short in token {} of {}", id, vocab));
    tokens.emplace_back(reinterpret_cast<const char*>(bytes.data() + at), n);
    at += n;
  }
  if (at != bytes.size()) throw fail(fmt::format("{} bytes after the last token", bytes.size() - at));
  return std::make_unique<LlmcTokenizer>(path, std::move(tokens), eot);
}

}  // namespace gt
