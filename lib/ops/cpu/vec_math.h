// Element-wise math in plain arithmetic for the CPU kernels' f32 loops, so that the compiler vectorises them (a
// libm call per element does not). Files that use it are compiled with -fno-trapping-math (lib/CMakeLists.txt).
#pragma once

#include "ops/cpu/isa.h"

#include <bit>
#include <cstdint>
#include <type_traits>

// GT_CPU_KERNEL(name, (params), (args), callee): a hot loop compiled for AVX-512 (x86-64-v4), AVX2 with FMA
// (x86-64-v3) and the baseline — the rest of the build targets the baseline — as void name##_v4, name##_v3 and
// name##_base, each calling callee(args) with callee inlined (GT_INLINE: a template, compiled again in each), and
// void name(params), which runs the one ops/cpu/isa.h's cpu_isa() names: the widest this CPU has, or the one a test
// forced, so every path below a CPU's own is tested on it too. callee may be a template-id with commas.
#if defined(__x86_64__)
#define GT_CPU_KERNEL(name, params, args, ...)                                          \
  __attribute__((target("arch=x86-64-v4"))) void name##_v4 params { __VA_ARGS__ args; } \
  __attribute__((target("arch=x86-64-v3"))) void name##_v3 params { __VA_ARGS__ args; } \
  void name##_base params { __VA_ARGS__ args; }                                         \
  void name params {                                                                    \
    const ::gt::cpu::CpuIsa isa_ = ::gt::cpu::cpu_isa();                                \
    ++::gt::cpu::detail::t_kernel_calls[static_cast<int>(isa_)];                        \
    switch (isa_) {                                                                     \
      case ::gt::cpu::CpuIsa::avx512: return name##_v4 args;                            \
      case ::gt::cpu::CpuIsa::avx2: return name##_v3 args;                              \
      case ::gt::cpu::CpuIsa::baseline: break;                                          \
    }                                                                                   \
    name##_base args;                                                                   \
  }
#else
#define GT_CPU_KERNEL(name, params, args, ...)                                          \
  void name params {                                                                    \
    ++::gt::cpu::detail::t_kernel_calls[static_cast<int>(::gt::cpu::CpuIsa::baseline)]; \
    __VA_ARGS__ args;                                                                   \
  }
#endif
// `omp simd` on a loop whose buffers may be the same (an in-place gradient), which GCC's overlap check would send to
// its scalar loop, where element i reads only element i. GCC only: clang vectorises these loops with its own overlap
// check, and warns (an error here) when it cannot honour `omp simd`, as under the sanitizers' -O1.
#if defined(__GNUC__) && !defined(__clang__)
#define GT_SIMD _Pragma("omp simd")
#else
#define GT_SIMD
#endif

namespace gt::cpu {

#define GT_INLINE [[gnu::always_inline]] inline

// Bytes bytes of T as one GCC/clang vector. Unaligned loads and stores go through memcpy; store names T
// (store<float>), as it is not deduced through the alias.
template <class T, int Bytes>
using VecN [[gnu::vector_size(Bytes)]] = T;
// 32 bytes: an AVX2 register; two SSE ones in the baseline clone, half an AVX-512 one.
template <class T>
using Vec = VecN<T, 32>;
template <class T>
constexpr int kLanes = static_cast<int>(32 / sizeof(T));
// 64 bytes of T: one AVX-512 register, two AVX2 ones, four SSE ones. For element-wise loops whose operations are
// long chains (exp_f32): on AVX-512 each instruction does twice Vec's work, and elsewhere the compiler splits it
// into independent halves, which the chains' latency leaves room for.
template <class T>
using Vec64 = VecN<T, 64>;
template <class T>
constexpr int kLanes64 = static_cast<int>(64 / sizeof(T));

template <int Bytes, class T>
GT_INLINE VecN<T, Bytes> load_n(const T* p) {
  VecN<T, Bytes> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
GT_INLINE Vec<T> load(const T* p) {
  return load_n<32>(p);
}
template <class T>
GT_INLINE Vec64<T> load64(const T* p) {
  return load_n<64>(p);
}
template <class T, class V>
GT_INLINE void store(T* p, V v) {
  static_assert(sizeof(V) % sizeof(T) == 0);
  __builtin_memcpy(p, &v, sizeof v);
}

// The 32-bit integers of the same shape as F (float, or a vector of floats: what comparing two of them gives), for
// exp_f32's exponent bits.
template <class F>
using Int32Of = std::conditional_t<std::is_same_v<F, float>, int32_t, decltype(F{} < F{})>;

// e^x for f32 in plain arithmetic, so that the compiler vectorises the loops that call it (std::exp is a library
// call per element): x = n·ln 2 + r with |r| ≤ ln 2 / 2 (ln 2 split in two so n·ln 2 is exact), e^r by its
// degree-7 Taylor polynomial (truncation < 1e-8 relative), 2^n from the exponent bits. Inputs are clamped to
// [−87, 88], where 2^n is a normal float, and a NaN counts as −87 (no NaN reaches the integer conversion): the
// callers' own use of x carries the NaN. Relative error within a few ulp of std::exp. Its selects become vector
// blends when the calling file is compiled with -fno-trapping-math (lib/CMakeLists.txt).
// F is float, or Vec<float> or Vec64<float> for loops written on vectors: the same operations element by element, so
// both give the same bits (tests/test_ops.cpp checks the GELU loops for it).
template <class F>
GT_INLINE F exp_f32(F x) {
  using I = Int32Of<F>;
  F c = x > -87.0f ? x : -87.0f;  // a NaN fails the comparison: −87
  c = c < 88.0f ? c : 88.0f;
  // Round to nearest by adding 1.5·2^23 (|c·log2 e| < 2^22): the sum's low mantissa bits are then n as an integer,
  // read without a float-to-int conversion (which neither SSE2 nor GCC's AVX2 vectoriser turns into vector code).
  const F t = c * 1.44269504088896341f + 12582912.0f;
  const F n = t - 12582912.0f;
  const I ni = std::bit_cast<I>(t) - std::bit_cast<int32_t>(12582912.0f);
  const F r = (c - n * 0.693359375f) - n * -2.12194440e-4f;
  F p = F{} + 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<F>((ni + 127) << 23);
}

// Σ f(i) for i < n in double, as eight interleaved partial sums (side by side in vector registers instead of one
// chain of n dependent additions) combined in a fixed order, so the result is the same on every run (layer norm's
// statistics, attention's delta).
template <class F>
GT_INLINE double lane_sum(int64_t n, F&& f) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += f(i + k);
  for (int k = 0; i < n; ++i, ++k) acc[k] += f(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Σ f(i) for i < n as sixteen interleaved partial sums in T (side by side in vector registers instead of one chain of
// n dependent additions), combined in a fixed order so the result is the same on every run (batch norm's statistics,
// a convolution's bias gradient).
template <class T, class F>
GT_INLINE T lane_sum16(int64_t n, F&& f) {
  T acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += f(i + k);
  for (int k = 0; i < n; ++i, ++k) acc[k] += f(i);
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

}  // namespace gt::cpu
