// Hugging Face byte-level BPE (`tokenizer.json` of GPT-2, GPT-NeoX, Llama 3, Qwen and the like), read into a
// Tokenizer that encodes with the same ids as the `tokenizers` library and decodes to the same bytes.
#pragma once

#include "text/tokenizer.h"

#include <memory>
#include <string>

namespace gt {

/// Reads `path`, a tokenizer.json whose model is BPE over GPT-2's byte alphabet: merges in either form ("a b" or
/// ["a", "b"]), the pre-tokenizer ByteLevel or a Sequence of Split (a regex or a string, any behavior) and ByteLevel,
/// the ByteLevel decoder, added and special tokens (matched before everything else, never split) and an NFC
/// normalizer or none. Anything else (other models, normalizers or pre-tokenizers, JSON cut short, merges naming
/// tokens the vocabulary lacks, ids past it) is a ConfigError naming the file and what is wrong. Encoding is safe
/// from several threads at once; each thread keeps its own cache of the words it has seen. The post-processor is not
/// applied: encode() gives the text's own ids, as `tokenizers`' encode(text, add_special_tokens=False) does, without
/// the beginning-of-text id Llama 3's template puts first.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

/// The same from the text of a tokenizer.json; `name` stands for the file in messages.
std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string& json_text, const std::string& name);

}  // namespace gt
