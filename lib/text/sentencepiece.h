// SentencePiece vocabularies (BPE or unigram, Debian's libsentencepiece): a trained model read from its .model file
// and the trainer behind `gputrain tokenize --vocab-size`.
//
// Models trained here keep text as it is, so that decode(encode(x)) == x for any UTF-8 x: the identity normalizer,
// no dummy space prefix, spaces kept as they are (runs of them are pieces of their own), and byte fallback by default
// (a character outside the vocabulary becomes its UTF-8 bytes, never <unk>). Ids: 0 is <unk>, 1 is </s>, the
// end-of-text id put before every document (a control symbol: no text encodes to it, so a corpus that contains the
// string "</s>" cannot forge a document boundary); no <s> or <pad>.
#pragma once

#include "text/tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gt {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  /// A model from the bytes of its .model file (a serialised ModelProto); `name` (the file) names it in the
  /// ConfigError for bytes that are not one.
  SentencePieceTokenizer(const std::string& serialized, const std::string& name);
  ~SentencePieceTokenizer() override;

  std::string kind() const override;
  std::string file_name() const override { return "tokenizer.model"; }
  std::vector<uint32_t> encode(std::string_view text) const override;
  /// A piece's text with its ▁ as spaces; a byte piece (<0xE2>) its byte; <unk> " ⁇ " (as SentencePiece decodes
  /// it); a control symbol its name.
  std::string token_bytes(uint32_t id) const override;
  /// SentencePiece's own decoding (which drops the space of a dummy prefix, for models that add one).
  std::string decode(std::span<const uint32_t> ids) const override;
  uint32_t vocab_size() const override;
  std::optional<uint32_t> end_of_text() const override;
  /// True when the model puts a ▁ before every text (SentencePiece's default, not the models trained here).
  bool dummy_prefix() const { return m_dummy_prefix; }
  /// The .model file's bytes.
  const std::string& serialized() const { return m_serialized; }

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
  std::string m_serialized, m_kind;
  bool m_dummy_prefix = false;
};

/// What `gputrain tokenize` trains (its flags of the same names).
struct SentencePieceTraining {
  int64_t vocab_size = 0;
  std::string model = "bpe";  ///< bpe or unigram
  bool byte_fallback = true;
  double character_coverage = 1.0;  ///< the fraction of characters (by count) the vocabulary covers
  uint32_t seed = 1;
  int threads = 1;
};

/// Trains a model on `sample` (text, cut into sentences of at most 4 KiB at line ends) and returns its .model bytes.
/// ConfigError for options SentencePiece refuses (a vocabulary too large for the sample, say), saying why.
std::string train_sentencepiece(std::string_view sample, const SentencePieceTraining& options);

}  // namespace gt
