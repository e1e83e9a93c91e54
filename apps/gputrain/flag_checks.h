// Checks CLI11 runs on command-line values as it parses them. An empty path is refused rather than read as "not
// given": `--resume $CKPT` with CKPT unset would otherwise start a fresh run, and `--out $DIR` write to runs/.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace gt::cli {

/// Refuses "" with "got an empty value (an unset shell variable?); expected `what`". CLI11 puts the option's name
/// in front ("--resume: …") and main exits 2. No description: the option's help line stays as it is.
inline CLI::Validator non_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& value) {
        return value.empty() ? "got an empty value (an unset shell variable?); expected " + what : std::string();
      },
      "");
}

}  // namespace gt::cli
