// Tensor shapes: a short list of extents, printed the PyTorch way.
#pragma once

#include "core/checked.h"

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace gt {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : m_dims(dims) {}
  explicit Shape(std::vector<int64_t> dims) : m_dims(std::move(dims)) {}

  size_t rank() const { return m_dims.size(); }
  int64_t operator[](size_t i) const { return m_dims[i]; }
  int64_t& operator[](size_t i) { return m_dims[i]; }
  const std::vector<int64_t>& dims() const { return m_dims; }
  bool operator==(const Shape&) const = default;

  /// The element count; throws SizeOverflow when it does not fit in 64 bits (sizes from users are bounded by
  /// core/limits.h before they get here, so this is the last line, not the check).
  int64_t numel() const {
    if (const auto n = checked_numel()) return *n;
    throw SizeOverflow(fmt::format("the element count of shape {} does not fit in 64 bits", str()));
  }
  /// The element count, or nothing when a dimension is negative or the product does not fit in 64 bits.
  std::optional<int64_t> checked_numel() const {
    std::optional<int64_t> n = 1;
    for (int64_t d : m_dims) n = checked_mul(n, d);
    return n;
  }
  /// The same shape with a leading batch dimension.
  Shape batched(int64_t batch) const {
    std::vector<int64_t> d{batch};
    d.insert(d.end(), m_dims.begin(), m_dims.end());
    return Shape(std::move(d));
  }
  /// Drops the leading dimension (the batch).
  Shape sample() const { return Shape(std::vector<int64_t>(m_dims.begin() + (m_dims.empty() ? 0 : 1), m_dims.end())); }

  std::string str() const {
    std::string s = "[";
    for (size_t i = 0; i < m_dims.size(); ++i) s += (i ? ", " : "") + std::to_string(m_dims[i]);
    return s + "]";
  }

 private:
  std::vector<int64_t> m_dims;
};

}  // namespace gt
