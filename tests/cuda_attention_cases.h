// What the CUDA attention tests share (test_cuda_attention.cpp, cuDNN's; test_cuda_attention_tiled.cpp, the tiled
// kernels'): an attention problem with the CPU's results in the calling thread's product precision, and comparisons.
#pragma once

#include "cuda_helpers.h"
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gt::test::attention_cases {

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, static_cast<double>(std::abs(t.data<float>()[i])));
  return m;
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.numel()) * 4) == 0;
}

/// One attention problem: seeded inputs in [−1, 1] and the CPU's results in the calling thread's product precision
/// (f32 outside a ProductPrecisionScope).
struct Case {
  int64_t heads;
  Tensor qkv, dout;       // [B, T, 3C], [B, T, C] on the host
  Tensor out, lse, dqkv;  // the CPU's
};

inline Case cpu_case(int64_t nb, int64_t t, int64_t heads, int64_t d, uint64_t seed) {
  const int64_t c = heads * d;
  Case k{heads,
         seeded(Shape{nb, t, 3 * c}, seed, -1, 1),
         seeded(Shape{nb, t, c}, seed + 1, -1, 1),
         Tensor::empty(Shape{nb, t, c}, DType::f32),
         Tensor::empty(Shape{nb, heads, t}, DType::f32),
         Tensor::empty(Shape{nb, t, 3 * c}, DType::f32)};
  ops::attention_forward(k.qkv, heads, {}, k.out, k.lse);
  Tensor delta = Tensor::empty(k.lse.shape(), DType::f32);
  ops::attention_backward(k.qkv, k.out, k.lse, k.dout, heads, {}, delta, k.dqkv);
  return k;
}

}  // namespace gt::test::attention_cases
