// llm.c's tokenizer file (gpt2_tokenizer.bin, written by its dev/data scripts): each token's bytes, for decoding the
// ids an llm.c model emits. It holds no merges, so it cannot encode.
#pragma once

#include "text/tokenizer.h"

#include <memory>
#include <string>

namespace gt {

/// Reads `path`: a header of 256 little-endian uint32 (magic 20240328, version 1 or 2, the vocabulary size and, in
/// version 2, the end-of-text id; version 1 means GPT-2's 50257 tokens with end-of-text 50256), then per token one
/// length byte (1 to 255) and that many bytes. A file that is not that, or is cut short or runs on, is a ConfigError
/// naming it and what is wrong. The tokenizer's encode() throws ConfigError: the file has no merges.
std::unique_ptr<Tokenizer> load_llmc_tokenizer(const std::string& path);

}  // namespace gt
