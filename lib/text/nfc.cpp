// NFC through utf8proc, with a fast path for text that holds nothing NFC can change: below U+0300 (lead bytes under
// 0xCC) no character decomposes or combines with the one before it.
#include "text/nfc.h"

#include "core/error.h"
#include "text/byte_level.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

namespace gt {
namespace {

void append_nfc(std::string_view valid, std::string& out) {
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid.data()), static_cast<utf8proc_ssize_t>(valid.size()),
                   &result, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, &std::free);
  if (n < 0) throw Error(std::string("NFC: ") + utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
}

}  // namespace

std::string nfc(std::string_view text) {
  bool simple = true;
  for (const char c : text) simple &= static_cast<uint8_t>(c) < 0xcc;
  if (simple) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t run = 0, i = 0;  // the valid stretch being gathered starts at `run`
  while (i < text.size()) {
    uint32_t cp = 0;
    const size_t n = byte_level::utf8_char(text, i, cp);
    if (n) {
      i += n;
      continue;
    }
    if (i > run) append_nfc(text.substr(run, i - run), out);
    out += text[i];
    run = ++i;
  }
  if (i > run) append_nfc(text.substr(run, i - run), out);
  return out;
}

bool is_word_char(uint32_t c) {
  if (c == 0x200c || c == 0x200d) return true;  // Join_Control
  // The symbols Unicode counts as Alphabetic (Other_Alphabetic): circled and squared Latin letters.
  if ((c >= 0x24b6 && c <= 0x24e9) || (c >= 0x1f130 && c <= 0x1f149) || (c >= 0x1f150 && c <= 0x1f169) ||
      (c >= 0x1f170 && c <= 0x1f189))
    return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC: return true;
    default: return false;
  }
}

}  // namespace gt
