// Choices read from environment variables (GPUTRAIN_CPU_SGEMM, GPUTRAIN_CPU_BF16, GPUTRAIN_CPU_ISA): one parser, so
// each says the same thing about a value it does not know.
#pragma once

#include "core/error.h"
#include "core/quote.h"

#include <cstddef>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace gt {

/// The position in `choices` of the value of the environment variable `name`; nullopt when it is unset, empty or
/// "auto". Any other value is an Error (exit 1): "NAME=value: expected auto, a, b or c", the value quoted
/// (quote_value) unless it is letters, digits, '-', '_' and '.' only.
inline std::optional<size_t> env_choice(const char* name, std::initializer_list<std::string_view> choices) {
  const char* env = std::getenv(name);
  const std::string_view v = env ? env : "";
  if (v.empty() || v == "auto") return std::nullopt;
  size_t i = 0;
  for (const std::string_view c : choices) {
    if (v == c) return i;
    ++i;
  }
  bool plain = v.size() <= 64;
  for (const char ch : v)
    plain = plain && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                      ch == '_' || ch == '.');
  std::string expected = "auto";
  i = 0;
  for (const std::string_view c : choices)
    expected += std::string(++i == choices.size() ? " or " : ", ") + std::string(c);
  throw Error(std::string(name) + "=" + (plain ? std::string(v) : quote_value(v)) + ": expected " + expected);
}

}  // namespace gt
