// PCRE2 behind text/pretokenize.h, and Split's behaviors as Hugging Face `tokenizers` defines them (each match or
// gap becomes a piece, is dropped, or joins its neighbour; empty pieces are dropped).
#include "text/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include "core/error.h"

#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <cstdint>

namespace gt {
namespace {

/// Bounds on one search, so that a pattern from a file cannot backtrack for ever: at least this many steps, more for
/// long text (Llama 3's `\s*[\r\n]+` backtracks over a whole run of spaces before `\s+(?!\S)` takes it).
constexpr uint32_t kMatchLimit = 1'000'000;
constexpr uint64_t kMatchStepsPerByte = 16;
constexpr uint32_t kDepthLimit = 100'000;

/// Per-thread search state: match data and the JIT's stack are not shareable between threads.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (!data || !context || !stack) throw Error("pre-tokenizer: out of memory for PCRE2's match state");
    pcre2_set_depth_limit(context, kDepthLimit);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

/// The length of the character at s[i] (1 for a byte that does not start valid UTF-8).
size_t char_length(std::string_view s, size_t i) {
  const auto c = static_cast<uint8_t>(s[i]);
  const size_t n = c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<uint8_t>(s[i + k]) & 0xc0) != 0x80) return 1;
  return n;
}

/// Unicode's White_Space, which `\s` means in the Rust regex engines of `tokenizers` and tiktoken; PCRE2's `\s`
/// adds U+180E (\h keeps the Mongolian vowel separator, which Unicode 6.3 took out of White_Space).
constexpr const char* kWhiteSpace =
    R"(\t-\r\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

/// `pattern` with `\s` and `\S` spelled as White_Space (inside a character class `\s` becomes the ranges; `\S`
/// there, which a class cannot spell, stays as it is). Escapes, \Q…\E and POSIX classes are stepped over.
std::string white_space_as_unicode(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 'Q') {  // a literal run up to \E, copied as it is
        const size_t end = pattern.find("\\E", i + 2);
        const size_t stop = end == std::string::npos ? pattern.size() : end + 2;
        out.append(pattern, i, stop - i);
        i = stop - 1;
        continue;
      }
      if (e == 's')
        out += in_class ? std::string(kWhiteSpace) : std::string("[") + kWhiteSpace + "]";
      else if (e == 'S' && !in_class)
        out += std::string("[^") + kWhiteSpace + "]";
      else
        out.append(pattern, i, 2);
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' first in the class (after any '^') is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // [:alpha:]
      const size_t end = pattern.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(pattern, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

Pattern::Pattern(const std::string& pattern, bool literal, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2 takes no UCP with LITERAL (a literal has no classes for it to change).
  const uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  const std::string spelled = literal ? pattern : white_space_as_unicode(pattern);
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(spelled.data()), spelled.size(), options, &error, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw ConfigError(fmt::format("{}: the pattern does not compile at offset {}: {}", where, offset,
                                  reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without the JIT (a failure here), the interpreter matches
  m_code = code;
}

Pattern::~Pattern() { pcre2_code_free(static_cast<pcre2_code*>(m_code)); }

void Pattern::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  MatchState& state = match_state();
  auto* code = static_cast<pcre2_code*>(m_code);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const uint64_t limit = std::max<uint64_t>(kMatchLimit, kMatchStepsPerByte * text.size());
  pcre2_set_match_limit(state.context, static_cast<uint32_t>(std::min<uint64_t>(limit, UINT32_MAX)));
  size_t at = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), at, 0, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      throw DataError(fmt::format("pre-tokenizer: searching {} bytes of text failed: {}", text.size(),
                                  reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      out.emplace_back(begin, end);
      at = end;
    } else {  // an empty match: search again from the next character, as the Rust tokenizers do
      if (begin >= text.size()) return;
      at = begin + char_length(text, begin);
    }
  }
}

void split_pieces(size_t text_size, const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
                  bool invert, std::vector<std::pair<size_t, size_t>>& out) {
  // Matches and the gaps between them, in order, each marked; `invert` swaps the marks.
  struct Part {
    size_t begin, end;
    bool match;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (b > prev) parts.push_back({prev, b, invert});
    parts.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < text_size) parts.push_back({prev, text_size, invert});
  std::vector<std::pair<size_t, size_t>> merged;
  switch (behavior) {
    case SplitBehavior::removed:
      for (const Part& p : parts)
        if (!p.match) merged.emplace_back(p.begin, p.end);
      break;
    case SplitBehavior::isolated:
      for (const Part& p : parts) merged.emplace_back(p.begin, p.end);
      break;
    case SplitBehavior::merged_with_previous: {  // a match joins the gap before it
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.match && !previous_match && !merged.empty())
          merged.back().second = p.end;
        else
          merged.emplace_back(p.begin, p.end);
        previous_match = p.match;
      }
      break;
    }
    case SplitBehavior::merged_with_next: {  // a match joins the gap after it
      bool next_match = false;
      std::vector<std::pair<size_t, size_t>> reversed;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !next_match && !reversed.empty())
          reversed.back().first = it->begin;
        else
          reversed.emplace_back(it->begin, it->end);
        next_match = it->match;
      }
      merged.assign(reversed.rbegin(), reversed.rend());
      break;
    }
    case SplitBehavior::contiguous: {  // runs of matches, and of gaps, each become one piece
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.match == previous_match && !merged.empty())
          merged.back().second = p.end;
        else
          merged.emplace_back(p.begin, p.end);
        previous_match = p.match;
      }
      break;
    }
  }
  for (const auto& piece : merged)
    if (piece.second > piece.first) out.push_back(piece);
}

}  // namespace gt
