// What a byte-level BPE tokenizer.json says, checked and in plain containers: the half of load_hf_tokenizer that
// reads the JSON (text/hf_bpe.cpp builds the encoder from it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gt {

/// How a Split pre-tokenizer treats what its pattern matches (the names are Hugging Face's).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

/// One pre-tokenizer of the chain, applied to every piece the ones before it left.
struct PreTokenizerStep {
  enum class Kind { split, byte_level } kind = Kind::byte_level;
  std::string pattern;   ///< split: a PCRE2 pattern, or the text itself when `literal`
  bool literal = false;  ///< split: {"String": …} rather than {"Regex": …}
  bool invert = false;   ///< split: the pieces are what the pattern does not match
  SplitBehavior behavior = SplitBehavior::isolated;
  bool add_prefix_space = true;  ///< byte_level: a space before every piece that lacks one
  bool use_regex = true;         ///< byte_level: split with GPT-2's regex
};

/// A token of added_tokens: found in the text before anything else and never split.
struct AddedTokenSpec {
  uint32_t id = 0;
  std::string content;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

struct HfBpeSpec {
  /// Token text (GPT-2's alphabet) by id; ids that only added_tokens give are "" here.
  std::vector<std::string> vocab;
  std::vector<bool> in_vocab;  ///< whether model.vocab names the id
  /// Merges in rank order: the ids of the two tokens and of their concatenation.
  struct Merge {
    uint32_t left, right, result;
  };
  std::vector<Merge> merges;
  std::vector<AddedTokenSpec> added;
  std::vector<PreTokenizerStep> pre_tokenizer;
  bool nfc = false;
  bool ignore_merges = false;  ///< a word the vocabulary holds whole is that token, without merging
  bool fuse_unk = false;
  std::optional<uint32_t> unk;
  uint32_t vocab_size = 0;  ///< one past the largest id of model.vocab and added_tokens
};

/// Reads and checks the text of a tokenizer.json; ConfigError naming `name` and what is wrong otherwise.
HfBpeSpec read_hf_bpe_spec(const std::string& json_text, const std::string& name);

}  // namespace gt
