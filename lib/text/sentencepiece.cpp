// SentencePiece through its C++ library: encoding, pieces as bytes, training from a sample held in memory.
#include "text/sentencepiece.h"

#include "core/error.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

namespace gt {

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

namespace {

// "▁" (U+2581), SentencePiece's stand-in for a space.
constexpr std::string_view kSpaceMark = "\xE2\x96\x81";

std::string spaces_restored(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
      out += ' ';
      i += kSpaceMark.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

// The sentences the trainer reads: the sample cut at line ends (a line keeps its \n, so that line ends become parts
// of pieces), at most kSentenceBytes each; a longer line is cut before a UTF-8 lead byte.
class SampleSentences final : public sentencepiece::SentenceIterator {
 public:
  static constexpr size_t kSentenceBytes = 4096;
  explicit SampleSentences(std::string_view text) : m_text(text) { Next(); }
  bool done() const override { return m_done; }
  void Next() override {
    if (m_at >= m_text.size()) {
      m_done = true;
      return;
    }
    size_t end = std::min(m_text.size(), m_at + kSentenceBytes);
    if (end < m_text.size()) {
      const size_t nl = m_text.rfind('\n', end - 1);
      if (nl != std::string_view::npos && nl >= m_at) {
        end = nl + 1;
      } else {
        while (end > m_at + 1 && (static_cast<uint8_t>(m_text[end]) & 0xC0) == 0x80) --end;
      }
    }
    m_value.assign(m_text.substr(m_at, end - m_at));
    m_at = end;
  }
  const std::string& value() const override { return m_value; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::string_view m_text;
  std::string m_value;
  size_t m_at = 0;
  bool m_done = false;
};

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& serialized, const std::string& name)
    : m_impl(std::make_unique<Impl>()), m_serialized(serialized) {
  if (const auto st = m_impl->sp.LoadFromSerializedProto(serialized); !st.ok())
    throw ConfigError(fmt::format("{}: not a SentencePiece model ({})", name, st.ToString()));
  if (m_impl->sp.GetPieceSize() <= 0) throw ConfigError(fmt::format("{}: a SentencePiece model of no pieces", name));
  m_kind = fmt::format("sentencepiece ({} pieces)", m_impl->sp.GetPieceSize());
  // A dummy prefix shows in the first piece of a word at the start of a text: "a" encodes to "▁a".
  std::vector<std::string> pieces;
  if (m_impl->sp.Encode("a", &pieces).ok() && !pieces.empty())
    m_dummy_prefix = pieces.front().compare(0, kSpaceMark.size(), kSpaceMark) == 0;
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::string SentencePieceTokenizer::kind() const { return m_kind; }

std::vector<uint32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  if (const auto st = m_impl->sp.Encode(text, &ids); !st.ok())
    throw DataError(fmt::format("SentencePiece cannot encode the text: {}", st.ToString()));
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::token_bytes(uint32_t id) const {
  const auto& sp = m_impl->sp;
  if (id >= vocab_size())
    throw DataError(fmt::format("token {}: not below the SentencePiece vocabulary's {}", id, vocab_size()));
  const int i = static_cast<int>(id);
  const std::string& piece = sp.IdToPiece(i);
  if (sp.IsByte(i) && piece.size() == 6)  // <0xAB>
    return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
  if (sp.IsUnknown(i)) return " \xE2\x81\x87 ";
  if (sp.IsControl(i)) return piece;
  return spaces_restored(piece);
}

std::string SentencePieceTokenizer::decode(std::span<const uint32_t> ids) const {
  const uint32_t n = vocab_size();
  std::vector<int> v;
  v.reserve(ids.size());
  for (const uint32_t id : ids) {
    if (id >= n) throw DataError(fmt::format("token {}: not below the SentencePiece vocabulary's {}", id, n));
    v.push_back(static_cast<int>(id));
  }
  return m_impl->sp.DecodeIds(v);
}

uint32_t SentencePieceTokenizer::vocab_size() const { return static_cast<uint32_t>(m_impl->sp.GetPieceSize()); }

std::optional<uint32_t> SentencePieceTokenizer::end_of_text() const {
  const int eos = m_impl->sp.eos_id();
  return eos >= 0 ? std::optional<uint32_t>(static_cast<uint32_t>(eos)) : std::nullopt;
}

std::string train_sentencepiece(std::string_view sample, const SentencePieceTraining& o) {
  if (o.model != "bpe" && o.model != "unigram")
    throw ConfigError(fmt::format("tokenize --model {}: expected bpe or unigram", o.model));
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", o.model},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"byte_fallback", o.byte_fallback ? "true" : "false"},
      {"character_coverage", fmt::format("{}", o.character_coverage)},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "false"},
      {"unk_id", "0"},
      {"eos_id", "1"},
      {"bos_id", "-1"},
      {"pad_id", "-1"},
      {"max_sentence_length", std::to_string(SampleSentences::kSentenceBytes * 2)},
      {"num_threads", std::to_string(std::max(o.threads, 1))},
      {"minloglevel", "2"},
  };
  sentencepiece::SetRandomGeneratorSeed(o.seed);
  SampleSentences sentences(sample);
  std::string model;
  if (const auto st = sentencepiece::SentencePieceTrainer::Train(args, &sentences, &model); !st.ok())
    throw ConfigError(
        fmt::format("tokenize --vocab-size {}: SentencePiece cannot train: {}", o.vocab_size, st.ToString()));
  return model;
}

}  // namespace gt
