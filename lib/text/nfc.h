// Unicode for the tokenizers, through Debian's libutf8proc: NFC (the normalizer of Qwen's and other tokenizer.json
// files) and the word characters that added tokens' single_word looks at.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gt {

/// `text` in Unicode normalization form C. Bytes that are not valid UTF-8 stay as they are, and the valid stretches
/// between them are normalised each on its own.
std::string nfc(std::string_view text);

/// Whether code point `c` is a word character as Rust's regex `\w` has it (what `tokenizers` checks single_word
/// with): a letter, mark, decimal digit, letter number, connector punctuation, a joiner, or a letter-like symbol.
bool is_word_char(uint32_t c);

}  // namespace gt
