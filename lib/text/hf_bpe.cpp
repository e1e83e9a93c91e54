// The byte-level BPE encoder and decoder behind load_hf_tokenizer. Encoding follows Hugging Face `tokenizers`
// step by step: added tokens are cut out first (leftmost, longest), the rest is NFC-normalised where the file says
// so, pre-tokenized into words, and each word's bytes are merged by rank. The encoder works on raw bytes rather than
// GPT-2's alphabet (the vocabulary is translated once, at load), and each thread caches the ids of the words it has
// seen, which is most of the speed on real text.
#include "text/hf_bpe.h"

#include "core/error.h"
#include "text/bpe_merge.h"
#include "text/byte_level.h"
#include "text/hf_bpe_spec.h"
#include "text/nfc.h"
#include "text/pretokenize.h"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <fstream>
#include <sstream>
#include <unordered_map>

namespace gt {
namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using WordMap = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

/// The words one thread has encoded with one tokenizer, and their ids.
struct WordCache {
  uint64_t owner = 0;  // the tokenizer's serial number (never reused, unlike its address)
  std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>> ids;
};
constexpr size_t kCacheWords = size_t{1} << 18;  // cleared when full
constexpr size_t kCacheWordBytes = 256;          // longer words are merged every time
std::atomic<uint64_t> g_serial{1};

/// An added token as the search for it needs it.
struct Added {
  uint32_t id;
  std::string content;
  bool single_word, lstrip, rstrip;
};

/// The added tokens searched for together, with the bytes they start with (the search skips any other byte).
struct AddedGroup {
  std::vector<Added> tokens;
  std::array<bool, 256> first{};
  void add(Added a) {
    first[static_cast<uint8_t>(a.content[0])] = true;
    tokens.push_back(std::move(a));
  }
};

bool is_space(uint32_t c) {
  return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

class HfBpe final : public Tokenizer {
 public:
  HfBpe(HfBpeSpec spec, const std::string& name);
  std::string kind() const override { return "byte-level BPE (tokenizer.json)"; }
  std::string file_name() const override { return "tokenizer.json"; }
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string token_bytes(uint32_t id) const override {
    if (id >= m_bytes.size())
      throw DataError(fmt::format("token id {} is past the vocabulary ({} tokens)", id, m_bytes.size()));
    return m_bytes[id];
  }
  uint32_t vocab_size() const override { return static_cast<uint32_t>(m_bytes.size()); }
  std::optional<uint32_t> end_of_text() const override { return m_eot; }

 private:
  /// Cuts the added tokens of `group` out of `text`: plain stretches go to `plain`, tokens' ids to `out`, in order.
  template <class Plain>
  void split_added(std::string_view text, const AddedGroup& group, std::vector<uint32_t>& out, Plain&& plain) const;
  void encode_plain(std::string_view text, std::vector<uint32_t>& out) const;
  void pre_tokenize(size_t step, std::string_view text, std::vector<uint32_t>& out) const;
  void encode_word(std::string_view word, std::vector<uint32_t>& out) const;

  std::vector<std::string> m_bytes;  // id → bytes
  WordMap m_words;                   // bytes → id, for the tokens a word's bytes can become
  BpeMerges m_merges;
  std::array<int64_t, 256> m_byte_ids{};  // -1: the byte has no token
  AddedGroup m_raw_added, m_normalized_added;
  std::vector<PreTokenizerStep> m_steps;
  std::vector<std::unique_ptr<Pattern>> m_patterns;  // one a step (ByteLevel without its regex: null)
  bool m_nfc = false, m_ignore_merges = false, m_fuse_unk = false;
  std::optional<uint32_t> m_unk, m_eot;
  uint64_t m_serial = g_serial.fetch_add(1);
};

HfBpe::HfBpe(HfBpeSpec spec, const std::string& name)
    : m_steps(std::move(spec.pre_tokenizer)),
      m_nfc(spec.nfc),
      m_ignore_merges(spec.ignore_merges),
      m_fuse_unk(spec.fuse_unk),
      m_unk(spec.unk) {
  m_bytes.resize(spec.vocab_size);
  m_words.reserve(spec.vocab_size);
  std::string bytes;
  for (uint32_t id = 0; id < spec.vocab_size; ++id) {
    if (!spec.in_vocab[id]) continue;
    // A token with a character outside GPT-2's alphabet cannot come out of encoding; the ByteLevel decoder gives
    // its text as it is.
    if (byte_level::decode_token(spec.vocab[id], bytes)) {
      m_bytes[id] = bytes;
      m_words.emplace(bytes, id);
    } else {
      m_bytes[id] = spec.vocab[id];
    }
  }
  m_byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b)
    if (const auto it = m_words.find(std::string(1, static_cast<char>(b))); it != m_words.end())
      m_byte_ids[b] = it->second;
  m_merges = BpeMerges(spec.merges);
  for (AddedTokenSpec& a : spec.added) {
    m_bytes[a.id] = a.content;
    if (a.normalized && m_nfc) a.content = nfc(a.content);
    (a.normalized ? m_normalized_added : m_raw_added).add({a.id, a.content, a.single_word, a.lstrip, a.rstrip});
  }
  for (const char* eot : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    for (uint32_t id = 0; id < spec.vocab_size && !m_eot; ++id)
      if (m_bytes[id] == eot) m_eot = id;
    if (m_eot) break;
  }
  for (size_t i = 0; i < m_steps.size(); ++i) {
    const PreTokenizerStep& s = m_steps[i];
    const std::string where = fmt::format("{}: pre_tokenizer step {}", name, i);
    if (s.kind == PreTokenizerStep::Kind::split)
      m_patterns.push_back(std::make_unique<Pattern>(s.pattern, s.literal, where));
    else if (s.use_regex)
      m_patterns.push_back(std::make_unique<Pattern>(kGpt2Pattern, false, where));
    else
      m_patterns.push_back(nullptr);
  }
}

/// Whether the character that ends `s` (or starts it, `at_end` false) is a word character (text/nfc.h).
bool word_char_at(std::string_view s, bool at_end) {
  if (s.empty()) return false;
  size_t i = 0;
  if (at_end) {
    i = s.size() - 1;
    while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xc0) == 0x80) --i;
  }
  uint32_t cp = 0;
  if (!byte_level::utf8_char(s, i, cp)) return false;
  return cp == '_' || is_word_char(cp);
}

template <class Plain>
void HfBpe::split_added(std::string_view text, const AddedGroup& group, std::vector<uint32_t>& out,
                        Plain&& plain) const {
  size_t start = 0, at = 0;  // plain text runs from start; the search resumes at `at`
  while (!group.tokens.empty() && at < text.size()) {
    const Added* best = nullptr;  // the leftmost match, the longest there
    size_t pos = at;
    for (; pos < text.size(); ++pos) {
      if (!group.first[static_cast<uint8_t>(text[pos])]) continue;
      for (const Added& a : group.tokens)
        if (text.compare(pos, a.content.size(), a.content) == 0 && (!best || a.content.size() > best->content.size()))
          best = &a;
      if (best) break;
    }
    if (!best) break;
    size_t begin = pos, end = pos + best->content.size();
    at = end;
    if (best->single_word && (word_char_at(text.substr(0, begin), true) || word_char_at(text.substr(end), false)))
      continue;
    uint32_t cp = 0;
    if (best->lstrip)  // the white space before the token goes with it
      while (begin > start) {
        size_t k = begin - 1;
        while (k > start && (static_cast<uint8_t>(text[k]) & 0xc0) == 0x80) --k;
        if (!byte_level::utf8_char(text, k, cp) || !is_space(cp)) break;
        begin = k;
      }
    if (best->rstrip)
      while (end < text.size()) {
        const size_t n = byte_level::utf8_char(text, end, cp);
        if (!n || !is_space(cp)) break;
        end += n;
      }
    if (begin > start) plain(text.substr(start, begin - start));
    out.push_back(best->id);
    start = at = end;
  }
  if (start < text.size()) plain(text.substr(start));
}

std::vector<uint32_t> HfBpe::encode(std::string_view text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3);
  split_added(text, m_raw_added, out, [&](std::string_view piece) {
    if (!m_nfc) return split_added(piece, m_normalized_added, out, [&](std::string_view p) { encode_plain(p, out); });
    const std::string normal = nfc(piece);
    split_added(normal, m_normalized_added, out, [&](std::string_view p) { encode_plain(p, out); });
  });
  return out;
}

void HfBpe::encode_plain(std::string_view text, std::vector<uint32_t>& out) const { pre_tokenize(0, text, out); }

void HfBpe::pre_tokenize(size_t step, std::string_view text, std::vector<uint32_t>& out) const {
  if (text.empty()) return;
  if (step == m_steps.size()) return encode_word(text, out);
  const PreTokenizerStep& s = m_steps[step];
  std::string prefixed;
  if (s.kind == PreTokenizerStep::Kind::byte_level && s.add_prefix_space && text[0] != ' ') {
    prefixed.resize(text.size() + 1);
    prefixed[0] = ' ';
    text.copy(prefixed.data() + 1, text.size());
    text = prefixed;
  }
  const Pattern* pattern = m_patterns[step].get();
  if (!pattern) return pre_tokenize(step + 1, text, out);
  std::vector<std::pair<size_t, size_t>> matches, pieces;
  pattern->find_all(text, matches);
  split_pieces(text.size(), matches, s.kind == PreTokenizerStep::Kind::split ? s.behavior : SplitBehavior::isolated,
               s.kind == PreTokenizerStep::Kind::split && s.invert, pieces);
  for (const auto& [b, e] : pieces) pre_tokenize(step + 1, text.substr(b, e - b), out);
}

void HfBpe::encode_word(std::string_view word, std::vector<uint32_t>& out) const {
  if (m_ignore_merges)
    if (const auto it = m_words.find(word); it != m_words.end()) return out.push_back(it->second);
  thread_local WordCache cache;
  const bool cached = word.size() <= kCacheWordBytes;
  if (cached) {
    if (cache.owner != m_serial) cache.ids.clear(), cache.owner = m_serial;
    if (const auto it = cache.ids.find(word); it != cache.ids.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // The word's bytes as tokens; a byte without one becomes the unknown token (runs of them one, with fuse_unk) or,
  // without an unknown token, nothing, as in `tokenizers`.
  std::vector<uint32_t> symbols;
  symbols.reserve(word.size());
  bool last_unk = false;
  for (const char c : word) {
    const int64_t id = m_byte_ids[static_cast<uint8_t>(c)];
    if (id >= 0) {
      symbols.push_back(static_cast<uint32_t>(id));
      last_unk = false;
    } else if (m_unk) {
      if (!(last_unk && m_fuse_unk)) symbols.push_back(*m_unk);
      last_unk = true;
    }
  }
  m_merges.apply(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cached) {
    if (cache.ids.size() >= kCacheWords) cache.ids.clear();
    cache.ids.emplace(std::string(word), std::move(symbols));
  }
}

}  // namespace

std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string& json_text, const std::string& name) {
  return std::make_unique<HfBpe>(read_hf_bpe_spec(json_text, name), name);
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open the tokenizer.json", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError(fmt::format("{}: cannot read the tokenizer.json", path));
  return parse_hf_tokenizer(text.str(), path);
}

}  // namespace gt
