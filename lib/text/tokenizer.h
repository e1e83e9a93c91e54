// Text ↔ token ids: the interface every tokenizer gputrain reads implements (bytes, SentencePiece models, Hugging
// Face byte-level BPE tokenizer.json, llm.c's gpt2_tokenizer.bin for decoding), so that tokenize, eval and generate
// take any of them alike.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// What it is, for messages and logs: "bytes", "sentencepiece bpe", "byte-level BPE (tokenizer.json)", …
  virtual std::string kind() const = 0;
  /// The name its own tools give its file (tokenizer.model, tokenizer.json, gpt2_tokenizer.bin, gputrain's byte
  /// descriptor): what a tokenization folder, a run directory or an import keeps a copy under.
  virtual std::string file_name() const = 0;
  /// Ids of `text` (UTF-8 bytes as they are; a tokenizer that cannot encode, as one read for decoding only, throws
  /// ConfigError saying so).
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
  /// Whether encode works (llm.c's gpt2_tokenizer.bin holds the pieces only: it decodes).
  virtual bool encodes() const { return true; }
  /// The bytes of the token `id` stands for (a piece of UTF-8 that may split a character; special tokens give their
  /// text). Throws DataError for an id past vocab_size().
  virtual std::string token_bytes(uint32_t id) const = 0;
  /// The bytes of a sequence: the tokens' bytes in order (SentencePiece turns its ▁ back into spaces).
  virtual std::string decode(std::span<const uint32_t> ids) const;
  virtual uint32_t vocab_size() const = 0;
  /// The end-of-text (or end-of-sequence) id put between documents, if the vocabulary has one.
  virtual std::optional<uint32_t> end_of_text() const = 0;
};

}  // namespace gt
