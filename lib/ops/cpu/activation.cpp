// CPU activations (ops/activation.h): OpenMP loops over ops/math.h's per-element math, one loop per activation;
// GPT-2's GELU in f32 has its own loop with a vectorisable exp (it is 40 % of a small GPT's step with std::exp).
#include "ops/activation.h"

#include "core/half.h"
#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/vec_math.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace gt::cpu {
namespace {

// GPT-2's GELU in f32 with exp_f32 (the same formulas as ops/math.h's gelu_tanh, which f64 and CUDA use), on one
// float or one Vec<float> of them: the vector loops below and their scalar tails run the same operations.
template <class F>
GT_INLINE F gelu_tanh_fwd(F v) {
  // v · σ(2u) as v times a reciprocal, not v / (1 + e^−2u): where exp_f32 clamps its argument GCC computes the
  // quotient for the clamped constant as a second vector division and blends the two (measured: half the loop's
  // time); a reciprocal of the constant folds away instead.
  const F s = 1.0f / (1.0f + exp_f32(-1.5957691216057307f * (v + 0.044715f * v * v * v)));
  return v * s;
}
template <class F>
GT_INLINE F gelu_tanh_bwd(F v, F dy) {
  const F v2 = v * v;
  const F s = 1.0f / (1.0f + exp_f32(-1.5957691216057307f * (v + 0.044715f * v2 * v)));
  const F du = 0.7978845608028654f * (1.0f + 0.134145f * v2);
  return dy * (s + 2.0f * v * s * (1.0f - s) * du);
}

// The GELU loops, compiled per instruction set (GT_CPU_KERNEL), written on vectors: GCC's own vectorisation of the
// per-element loop ran 1.6× slower (~780 → ~490 µs of CPU for gpt_bytes' 1024 × 512 forward, one thread). Two
// vectors per iteration overlap two of exp_f32's long chains of dependent operations (~445 µs). Each element is
// read before its result is stored, so the buffers may be the same (an in-place gradient).
// The loops themselves are always-inline templates, so that clang checks the vector calls' ABI where they land (in
// each clone) rather than in a baseline function, as in attention.cpp.
template <class T>
GT_INLINE void gelu_tanh_fwd_loop(const T* x, T* y, int64_t i0, int64_t i1) {
  constexpr int kL = kLanes64<T>;
  int64_t i = i0;
  for (; i + 2 * kL <= i1; i += 2 * kL) {
    const Vec64<T> a = gelu_tanh_fwd(load64(x + i)), b = gelu_tanh_fwd(load64(x + i + kL));
    store<T>(y + i, a);
    store<T>(y + i + kL, b);
  }
  for (; i < i1; ++i) y[i] = gelu_tanh_fwd(x[i]);
}
template <class T>
GT_INLINE void gelu_tanh_bwd_loop(const T* x, const T* dy, T* dx, int64_t i0, int64_t i1) {
  constexpr int kL = kLanes64<T>;
  int64_t i = i0;
  for (; i + 2 * kL <= i1; i += 2 * kL) {
    const Vec64<T> a = gelu_tanh_bwd(load64(x + i), load64(dy + i));
    const Vec64<T> b = gelu_tanh_bwd(load64(x + i + kL), load64(dy + i + kL));
    store<T>(dx + i, a);
    store<T>(dx + i + kL, b);
  }
  for (; i < i1; ++i) dx[i] = gelu_tanh_bwd(x[i], dy[i]);
}
GT_CPU_KERNEL(gelu_tanh_fwd_f32, (const float* x, float* y, int64_t i0, int64_t i1), (x, y, i0, i1), gelu_tanh_fwd_loop)
GT_CPU_KERNEL(gelu_tanh_bwd_f32, (const float* x, const float* dy, float* dx, int64_t i0, int64_t i1),
              (x, dy, dx, i0, i1), gelu_tanh_bwd_loop)

template <class T>
void act_fwd_t(Activation a, const Tensor& x, Tensor& y) {
  const T* px = x.data<T>();
  T* py = y.data<T>();
  if constexpr (std::is_same_v<T, float>)
    if (a == Activation::gelu_tanh) {
      parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) { gelu_tanh_fwd_f32(px, py, i0, i1); });
      return;
    }
  auto loop = [&](auto act) {
    parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) py[i] = act_forward<T>(act, px[i]);
    });
  };
  with_activation(a, loop);
}

template <class T>
void act_bwd_t(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const T *px = x.data<T>(), *py = y.data<T>(), *pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  if constexpr (std::is_same_v<T, float>)
    if (a == Activation::gelu_tanh) {
      parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) { gelu_tanh_bwd_f32(px, pdy, pdx, i0, i1); });
      return;
    }
  auto loop = [&](auto act) {
    parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pdx[i] = act_backward<T>(act, px[i], py[i], pdy[i]);
    });
  };
  with_activation(a, loop);
}

}  // namespace

void activation_backward_half_x(Activation a, const ops::HalfMatrix& x, const Tensor& dy, Tensor& dx) {
  const auto* px = static_cast<const uint16_t*>(x.data);
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  // The chunks of act_bwd_t's loops, each widened in pieces of kPiece (a multiple of the GELU loop's two vectors, so
  // that its vector and scalar parts fall on the same elements as there) into the thread's stack.
  constexpr int64_t kPiece = 1024;
  auto loop = [&](auto act) {
    parallel_for(dy.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      alignas(64) float wide[kPiece];
      for (int64_t p0 = i0; p0 < i1; p0 += kPiece) {
        const int64_t m = std::min(kPiece, i1 - p0);
        if (x.format == HalfFormat::bf16)
          bf16_to_floats(px + p0, wide, static_cast<size_t>(m));
        else
          fp16_to_floats(px + p0, wide, static_cast<size_t>(m));
        if constexpr (decltype(act)::value == Activation::gelu_tanh)
          gelu_tanh_bwd_f32(wide, pdy + p0, pdx + p0, 0, m);
        else
          for (int64_t i = 0; i < m; ++i) pdx[p0 + i] = act_backward<float>(act, wide[i], 0.0f, pdy[p0 + i]);
      }
    });
  };
  with_activation(a, loop);
}

namespace {
template <class T>
void activation_span_t(Activation a, const T* x, T* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    if (a == Activation::gelu_tanh) {
      gelu_tanh_fwd_f32(x, y, 0, n);
      return;
    }
  with_activation(a, [&](auto act) {
    for (int64_t i = 0; i < n; ++i) y[i] = act_forward<T>(act, x[i]);
  });
}
}  // namespace

void activation_span(Activation a, const float* x, float* y, int64_t n) { activation_span_t(a, x, y, n); }
void activation_span(Activation a, const double* x, double* y, int64_t n) { activation_span_t(a, x, y, n); }

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) { act_fwd_t<decltype(t)>(a, x, y); });
}
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  for_float_type(x.dtype(), [&](auto t) { act_bwd_t<decltype(t)>(a, x, y, dy, dx); });
}

}  // namespace gt::cpu
