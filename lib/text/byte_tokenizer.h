// Byte-level tokens: token = byte, vocabulary 256, what `gputrain tokenize` writes without --vocab-size. Its
// descriptor in a tokenization folder is gputrain_tokenizer.json ({"type": "bytes", "vocab_size": 256, …}); folders
// written before 2026-12-05 name it tokenizer.json, which is Hugging Face's name, and still read.
#pragma once

#include "text/tokenizer.h"

namespace gt {

/// The descriptor's name in a tokenization folder, and the name folders written before it had.
inline constexpr const char* kByteDescriptorName = "gputrain_tokenizer.json";
inline constexpr const char* kOldByteDescriptorName = "tokenizer.json";

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "bytes"; }
  std::string file_name() const override { return kByteDescriptorName; }
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string token_bytes(uint32_t id) const override;
  uint32_t vocab_size() const override { return 256; }
  /// Bytes have none: documents follow each other as their bytes.
  std::optional<uint32_t> end_of_text() const override { return std::nullopt; }
};

/// True when `text` is gputrain's byte descriptor: a JSON object whose "type" is "bytes".
bool is_byte_descriptor(const std::string& text);

}  // namespace gt
