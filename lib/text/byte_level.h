// GPT-2's byte-to-unicode alphabet: every byte stands for one printable character, so that a byte-level BPE's
// vocabulary and merges are text. Bytes '!'..'~', '¡'..'¬' and '®'..'ÿ' stand for themselves; the other 68 take
// U+0100 onwards, in byte order.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gt::byte_level {

/// The code point byte `b` stands for.
constexpr uint32_t char_of(uint8_t b) {
  const bool self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
  if (self) return b;
  uint32_t n = 0;  // bytes below b that are not their own character
  for (uint32_t x = 0; x < b; ++x)
    if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae))) ++n;
  return 256 + n;
}

/// The byte code point `c` stands for, or -1 when `c` is not in the alphabet.
inline int byte_of(uint32_t c) {
  static const std::array<int16_t, 512> table = [] {
    std::array<int16_t, 512> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[char_of(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
    return t;
  }();
  return c < 512 ? table[c] : -1;
}

/// Appends code point `c` (at most U+10FFFF) as UTF-8.
inline void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
}

/// The length of the valid UTF-8 character at s[i], or 0 when the bytes there are not one (bad lead byte, missing or
/// wrong continuation, overlong form, surrogate, past U+10FFFF). Sets `cp` to the code point when valid.
inline size_t utf8_char(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  size_t n = 0;
  uint32_t v = 0, min = 0;
  if ((c & 0xe0) == 0xc0)
    n = 2, v = c & 0x1f, min = 0x80;
  else if ((c & 0xf0) == 0xe0)
    n = 3, v = c & 0x0f, min = 0x800;
  else if ((c & 0xf8) == 0xf0)
    n = 4, v = c & 0x07, min = 0x10000;
  else
    return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    v = v << 6 | (b(i + k) & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  cp = v;
  return n;
}

/// The bytes a token written in the alphabet stands for; false when `token` has a character outside it (or is not
/// UTF-8), in which case `out` is unspecified.
inline bool decode_token(std::string_view token, std::string& out) {
  out.clear();
  for (size_t i = 0; i < token.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_char(token, i, cp);
    const int byte = n ? byte_of(cp) : -1;
    if (byte < 0) return false;
    out += static_cast<char>(byte);
    i += n;
  }
  return true;
}

}  // namespace gt::byte_level
