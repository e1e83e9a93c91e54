// The pre-tokenizers of a byte-level BPE: a PCRE2 pattern (UTF, Unicode properties, compiled to machine code where
// the JIT can) and the way Hugging Face's Split turns its matches into pieces.
#pragma once

#include "text/hf_bpe_spec.h"

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gt {

/// GPT-2's pre-tokenizer pattern, which ByteLevel(use_regex: true) splits with.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// A compiled pattern. Text that is not valid UTF-8 is searched too: its bad bytes match nothing.
class Pattern {
 public:
  /// Throws ConfigError "`where`: …" when the pattern does not compile.
  Pattern(const std::string& pattern, bool literal, const std::string& where);
  ~Pattern();
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  /// The non-empty matches in `text`, left to right, as byte ranges (appended to `out`). A match that runs past the
  /// backtracking limits throws DataError.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* m_code = nullptr;  // pcre2_code_8
};

/// Byte ranges of the pieces one Split step makes of `text` (non-empty, in order), given its pattern's matches.
void split_pieces(size_t text_size, const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
                  bool invert, std::vector<std::pair<size_t, size_t>>& out);

}  // namespace gt
