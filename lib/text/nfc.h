// Unicode for the tokenizers, through Debian's libutf8proc: NFC (the normalizer of Qwen's and other tokenizer.json
// files) and letter/digit tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gt {

/// `text` in Unicode normalization form C. Bytes that are not valid UTF-8 stay as they are, and the valid stretches
/// between them are normalised each on its own.
std::string nfc(std::string_view text);

/// Whether code point `c` is a letter or a number (general category L* or N*).
bool is_alphanumeric(uint32_t c);

}  // namespace gt
