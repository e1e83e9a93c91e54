// What the CUDA attention tests share (test_cuda_attention.cpp, cuDNN's; test_cuda_attention_tiled.cpp, the tiled
// kernels'): an attention problem with the CPU's results in the calling thread's product precision, and comparisons.
#pragma once

#include "cuda_helpers.h"
#include "ops/attention.h"
#include "ops/stream.h"

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

/// The rate cases' problem: GPT-2 small's attention (B 16, T 1024, 12 heads of 64) on the GPU, seeded inputs in
/// [−1, 1], its forward and backward calls in the calling thread's product precision, and their FLOPs with the masked
/// half skipped (FlashAttention's count): forward 2 products, 2·B·H·T²·d; backward 5.
struct Gpt2Rate {
  static constexpr int64_t nb = 16, t = 1024, heads = 12, d = 64, c = heads * d;
  static constexpr double fwd_flop = 2.0 * nb * heads * t * t * d, bwd_flop = 2.5 * fwd_flop;
  explicit Gpt2Rate(uint64_t seed)
      : qkv(to_cuda(seeded(Shape{nb, t, 3 * c}, seed, -1, 1))),
        dout(to_cuda(seeded(Shape{nb, t, c}, seed + 1, -1, 1))),
        out(Tensor::empty(Shape{nb, t, c}, DType::f32, Device::cuda(0))),
        lse(Tensor::empty(Shape{nb, heads, t}, DType::f32, Device::cuda(0))),
        delta(Tensor::empty(lse.shape(), DType::f32, Device::cuda(0))),
        dqkv(Tensor::empty(qkv.shape(), DType::f32, Device::cuda(0))) {}
  void forward() { ops::attention_forward(qkv, heads, {}, out, lse); }
  void backward() { ops::attention_backward(qkv, out, lse, dout, heads, {}, delta, dqkv); }
  /// Milliseconds of device time per call of forward (or backward) over `reps` calls, after one untimed call when
  /// `warm` (a graph built, a kernel loaded).
  double time_ms(int reps, bool warm, bool backward_pass) {
    auto call = [&] { backward_pass ? backward() : forward(); };
    if (warm) call();
    const int a = clock.record();
    for (int i = 0; i < reps; ++i) call();
    const int b = clock.record();
    const double ms = clock.elapsed_ms(a, b) / reps;
    clock.clear();
    return ms;
  }

  Tensor qkv, dout, out, lse, delta, dqkv;
  DeviceClock clock{Device::cuda(0)};
};

}  // namespace gt::test::attention_cases
