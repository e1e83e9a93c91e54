// The tokenizer a file holds, whatever its kind: the one entry point tokenize, check, eval and generate read
// tokenizers through.
#pragma once

#include "text/tokenizer.h"

#include <memory>
#include <string>

namespace gt {

/// Reads `path` and returns its tokenizer, by what the file holds (not its name):
/// - a SentencePiece model (a .model file: a serialised protocol buffer),
/// - gputrain's byte descriptor (gputrain_tokenizer.json, or tokenizer.json of type "bytes" as folders written
///   before 2026-12-05 have it),
/// - a Hugging Face tokenizer.json (a JSON object with "model"): byte-level BPE (text/hf_bpe.h),
/// - llm.c's gpt2_tokenizer.bin (its magic first), for decoding only (text/llmc_tokenizer.h).
/// A missing, unreadable or malformed file is a ConfigError of one line naming it.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

/// The tokenizer file a tokenization folder holds (tokenizer.model, gputrain_tokenizer.json, or an older folder's
/// tokenizer.json), or "" when it holds none.
std::string tokenizer_file_in(const std::string& dir);

}  // namespace gt
