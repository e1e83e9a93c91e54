// Values from files and configs quoted for one-line messages: control bytes escaped (a NUL cut messages off, a
// newline split them) and long values cut (a 10 MB CSV field became a 10 MB error line).
#pragma once

#include "core/limits.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

namespace gt {

/// `s` in double quotes, with \" \\ \n \r \t \0 and \xNN for other control bytes; past `max_chars` bytes of the
/// value it is cut and the full length given: "aaaa…" (10485760 bytes).
inline std::string quote_value(std::string_view s, size_t max_chars = static_cast<size_t>(limits::kQuotedChars)) {
  std::string out = "\"";
  const size_t shown = std::min(s.size(), max_chars);
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\0': out += "\\0"; break;
      default:
        if (c < 0x20 || c == 0x7f)
          out += fmt::format("\\x{:02x}", c);
        else
          out += static_cast<char>(c);
    }
  }
  out += shown < s.size() ? fmt::format("…\" ({} bytes)", s.size()) : std::string("\"");
  return out;
}

/// `s` as it is when every byte prints (UTF-8 does; a tab, newline or other control byte does not), else
/// quote_value(s): text a user typed (a --set, a key path) goes into a message as typed where that is safe,
/// "(--set optimizer.lr=abc)", and escaped where it would split or garble the line, "(--set "optimizer.lr=abc\nx")".
inline std::string quote_if_needed(std::string_view s) {
  const bool plain = std::none_of(s.begin(), s.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c < 0x20 || c == 0x7f;
  });
  return plain ? std::string(s) : quote_value(s);
}

/// `s` as one word for a POSIX shell: as it is when it holds only characters no shell treats specially, else in
/// single quotes (a ' inside as '\''). For the commands gputrain prints to be run again.
inline std::string shell_quote(std::string_view s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/=,:+@%") ==
                        std::string_view::npos)
    return std::string(s);
  std::string out(1, '\'');
  for (const char c : s) {
    if (c == '\'')
      out.append("'\\''");
    else
      out.push_back(c);
  }
  out.push_back('\'');
  return out;
}

/// FNV-1a, 32 bits: a short, stable fingerprint of a text (a trial's folder name, a model section), not a checksum.
/// FNV-1a of `s`; `h` continues a hash over earlier bytes, so a file hashed a chunk at a time hashes as a whole.
inline uint32_t fnv1a(std::string_view s, uint32_t h = 2166136261u) {
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return h;
}

}  // namespace gt
