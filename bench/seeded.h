// What the C++ benchmarks share: tensors of repeatable values (an LCG per seed, uniform in [-0.5, 0.5)), so that two
// runs of a benchmark time the same arithmetic.
#pragma once

#include "core/tensor.h"

#include <cstdint>

namespace gt::bench {

inline Tensor seeded_f32(const Shape& s, uint32_t seed) {
  Tensor t = Tensor::empty(s, DType::f32);
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    t.data<float>()[i] = static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
  }
  return t;
}

}  // namespace gt::bench
