// Products and sums of sizes that report overflow instead of wrapping: every count of elements, bytes, FLOPs or
// steps that user-written sizes feed goes through these.
#pragma once

#include "core/error.h"

#include <cstdint>
#include <optional>
#include <string>

namespace gt {

/// a × b, or nothing when it does not fit in int64 (or either is negative).
inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> checked_mul(std::optional<int64_t> a, int64_t b) {
  return a ? checked_mul(*a, b) : std::nullopt;
}

/// a + b, or nothing when it does not fit in int64 (or either is negative).
inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> checked_add(std::optional<int64_t> a, int64_t b) {
  return a ? checked_add(*a, b) : std::nullopt;
}

/// Sizes whose product or sum does not fit in 64 bits. A runtime error where nothing better is known; the graph
/// build turns it into a config error naming the layer, and the data readers into a data error naming the file.
class SizeOverflow : public Error {
 public:
  explicit SizeOverflow(const std::string& message) : Error(ErrorKind::runtime, message) {}
};

/// a × b for sizes that must fit; throws SizeOverflow naming `what` otherwise.
inline int64_t mul_sizes(int64_t a, int64_t b, const char* what = "sizes") {
  if (const auto r = checked_mul(a, b)) return *r;
  throw SizeOverflow(fmt::format("{} overflow: {} × {} does not fit in 64 bits", what, a, b));
}

}  // namespace gt
