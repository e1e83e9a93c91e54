// The building blocks of the CPU attention kernels (ops/cpu/attention.cpp): the register-block shapes, packing and
// transposing q, k, v into zero-padded copies, the register-blocked score and product loops, and the softmax rows
// with their dropout and half-precision rounding. All of it is inlined into the per-instruction-set task bodies of
// attention.cpp, the one file that includes this header.
#pragma once

#include "core/half.h"
#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/vec_math.h"
#include "ops/math.h"
#include "ops/precision.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace gt::cpu::attention_detail {

constexpr int64_t kTile = 64;  // query rows per tile
constexpr int kCols = 16;      // columns of a register block (keys or head channels)

// A register block's shape and vectors: Cfg::rows rows of kCols columns in vectors of Cfg::bytes. Narrow: 4 rows of
// two 32-byte vectors (AVX2's 16 registers hold the 8 accumulators and the operands; the baseline clone splits
// them). Wide, for AVX-512 only (a separate instantiation, called where CPUID says so): 8 rows of one 64-byte
// vector, the same 8 accumulators doing twice the work per instruction (measured: the kernels ~1.5× faster on
// gpt_bytes' shapes). Each element's sums run in the same order either way; only how many zero probabilities past
// a row's last key join them differs (adding +0 changes no bit of a sum that is not −0).
struct Narrow {
  static constexpr int rows = 4, bytes = 32;
};
struct Wide {
  static constexpr int rows = 8, bytes = 64;
};

inline int64_t round_up(int64_t n, int64_t k) { return (n + k - 1) / k * k; }

// f(std::integral_constant<int, 0>) … f(…<N − 1>): loops over a register block with constant indices, so that the
// compiler keeps the accumulators in registers.
// The lambdas passed to it are marked GT_LAMBDA_INLINE: without it GCC left some of them out of line (compiled for
// the baseline, outside the per-instruction-set clones) once the kernels grew.
#define GT_LAMBDA_INLINE __attribute__((always_inline))
template <int N, class F>
GT_INLINE void unroll(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) GT_LAMBDA_INLINE { (f(std::integral_constant<int, I>{}), ...); }
  (std::make_integer_sequence<int, N>{});
}

// e^x, keeping a NaN a NaN (exp_f32 maps it to e^−87, and a NaN score must reach the loss); T may be a vector of f32.
template <class T>
GT_INLINE T exp_keep_nan(T x) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, Vec64<float>>)
    return x != x ? x : exp_f32(x);
  else
    return std::exp(x);
}

// dst[r][e] = src[r·ld + e] for r < n, e < d, and zero elsewhere in [rows][dp].
template <class T>
GT_INLINE void pack_rows(const T* src, int64_t ld, int64_t n, int64_t d, int64_t dp, int64_t rows, T* dst) {
  for (int64_t r = 0; r < n; ++r) {
    std::copy(src + r * ld, src + r * ld + d, dst + r * dp);
    std::fill(dst + r * dp + d, dst + (r + 1) * dp, T(0));
  }
  std::fill(dst + n * dp, dst + rows * dp, T(0));
}

// dst[i][r] = src[r·ld + i] for r, i < 8: an 8 × 8 block of floats transposed in registers (unpack, shuffle and
// lane-swap steps, as one would write with AVX2's unpacklo/shuffle/permute2f128; in the baseline clone the compiler
// lowers them to SSE shuffles).
GT_INLINE void transpose8(const float* src, int64_t ld, float* dst, int64_t ldd) {
  using V = Vec<float>;
  const V r0 = load(src), r1 = load(src + ld), r2 = load(src + 2 * ld), r3 = load(src + 3 * ld),
          r4 = load(src + 4 * ld), r5 = load(src + 5 * ld), r6 = load(src + 6 * ld), r7 = load(src + 7 * ld);
  // t = unpacklo / unpackhi of row pairs: (a0 b0 a1 b1 | a4 b4 a5 b5), (a2 b2 a3 b3 | a6 b6 a7 b7)
  const V t0 = __builtin_shufflevector(r0, r1, 0, 8, 1, 9, 4, 12, 5, 13);
  const V t1 = __builtin_shufflevector(r0, r1, 2, 10, 3, 11, 6, 14, 7, 15);
  const V t2 = __builtin_shufflevector(r2, r3, 0, 8, 1, 9, 4, 12, 5, 13);
  const V t3 = __builtin_shufflevector(r2, r3, 2, 10, 3, 11, 6, 14, 7, 15);
  const V t4 = __builtin_shufflevector(r4, r5, 0, 8, 1, 9, 4, 12, 5, 13);
  const V t5 = __builtin_shufflevector(r4, r5, 2, 10, 3, 11, 6, 14, 7, 15);
  const V t6 = __builtin_shufflevector(r6, r7, 0, 8, 1, 9, 4, 12, 5, 13);
  const V t7 = __builtin_shufflevector(r6, r7, 2, 10, 3, 11, 6, 14, 7, 15);
  // u: columns c and c + 4 of four rows (c = 0, 1 from the unpacklo halves, 2, 3 from the unpackhi ones)
  const V u0 = __builtin_shufflevector(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13);
  const V u1 = __builtin_shufflevector(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15);
  const V u2 = __builtin_shufflevector(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13);
  const V u3 = __builtin_shufflevector(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15);
  const V u4 = __builtin_shufflevector(t4, t6, 0, 1, 8, 9, 4, 5, 12, 13);
  const V u5 = __builtin_shufflevector(t4, t6, 2, 3, 10, 11, 6, 7, 14, 15);
  const V u6 = __builtin_shufflevector(t5, t7, 0, 1, 8, 9, 4, 5, 12, 13);
  const V u7 = __builtin_shufflevector(t5, t7, 2, 3, 10, 11, 6, 7, 14, 15);
  // the rows' halves joined: column c from u[c] and u[c + 4]
  store<float>(dst, __builtin_shufflevector(u0, u4, 0, 1, 2, 3, 8, 9, 10, 11));
  store<float>(dst + ldd, __builtin_shufflevector(u1, u5, 0, 1, 2, 3, 8, 9, 10, 11));
  store<float>(dst + 2 * ldd, __builtin_shufflevector(u2, u6, 0, 1, 2, 3, 8, 9, 10, 11));
  store<float>(dst + 3 * ldd, __builtin_shufflevector(u3, u7, 0, 1, 2, 3, 8, 9, 10, 11));
  store<float>(dst + 4 * ldd, __builtin_shufflevector(u0, u4, 4, 5, 6, 7, 12, 13, 14, 15));
  store<float>(dst + 5 * ldd, __builtin_shufflevector(u1, u5, 4, 5, 6, 7, 12, 13, 14, 15));
  store<float>(dst + 6 * ldd, __builtin_shufflevector(u2, u6, 4, 5, 6, 7, 12, 13, 14, 15));
  store<float>(dst + 7 * ldd, __builtin_shufflevector(u3, u7, 4, 5, 6, 7, 12, 13, 14, 15));
}

// dst[e][j] = src[j·ld + e] for j < n, e < d, and zero elsewhere in [d][tp]. f32 moves 8 × 8 blocks through
// registers (a strided scalar loop took ~18 % of the attention kernels' time); only the padding is zeroed.
template <class T>
GT_INLINE void pack_transposed(const T* src, int64_t ld, int64_t n, int64_t d, int64_t tp, T* dst) {
  int64_t j8 = 0, e8 = 0;
  if constexpr (std::is_same_v<T, float>) {
    j8 = n / 8 * 8, e8 = d / 8 * 8;
    for (int64_t j = 0; j < j8; j += 8)
      for (int64_t e = 0; e < e8; e += 8) transpose8(src + j * ld + e, ld, dst + e * tp + j, tp);
  }
  for (int64_t e = 0; e < d; ++e) {
    T* row = dst + e * tp;
    if (e >= e8)
      for (int64_t j = 0; j < j8; ++j) row[j] = src[j * ld + e];
    for (int64_t j = j8; j < n; ++j) row[j] = src[j * ld + e];
    std::fill(row + n, row + tp, T(0));
  }
}

// A register block's row of kCols columns is kVecs vectors of Cfg::bytes (VecN, ops/cpu/vec_math.h), of kLanesOf
// elements each.
template <class T, class Cfg>
constexpr int kLanesOf = Cfg::bytes / static_cast<int>(sizeof(T));
template <class T, class Cfg>
constexpr int kVecs = kCols / kLanesOf<T, Cfg>;
template <class T, class Cfg>
using VecOf = VecN<T, Cfg::bytes>;

// Zeroes a register block's accumulators one by one: `= {}` on the array made GCC clear it in memory (rep stos,
// ~10 % of the forward kernel) before loading it into registers.
template <class Cfg, class T, int V>
GT_INLINE void zero_block(VecOf<T, Cfg> (&acc)[Cfg::rows][V]) {
  for (int r = 0; r < Cfg::rows; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = VecOf<T, Cfg>{};
}

// c[r][j0 .. j0 + kCols) = alpha · Σ_{e<d} x[r][e]·yt[e][j0 ..] for r < rows (≤ Cfg::rows).
template <class Cfg, class T>
GT_INLINE void dot_block(const T* x, int64_t ldx, int rows, const T* yt, int64_t ldy, int64_t d, int64_t j0, T alpha,
                         T* c, int64_t ldc) {
  constexpr int V = kVecs<T, Cfg>, L = kLanesOf<T, Cfg>, kRows = Cfg::rows;
  VecOf<T, Cfg> acc[kRows][V];
  zero_block<Cfg, T, V>(acc);
  const T* xr[kRows];
  for (int rr = 0; rr < kRows; ++rr) xr[rr] = x + std::min(rr, rows - 1) * ldx;
  for (int64_t e = 0; e < d; ++e) {
    VecOf<T, Cfg> y[V];
    unroll<V>([&](auto v) GT_LAMBDA_INLINE { y[v] = load_n<Cfg::bytes>(yt + e * ldy + j0 + v * L); });
    unroll<kRows>([&](auto rr) GT_LAMBDA_INLINE {
      const T xv = xr[rr][e];
      unroll<V>([&](auto v) GT_LAMBDA_INLINE { acc[rr][v] += xv * y[v]; });
    });
  }
  unroll<kRows>([&](auto rr) GT_LAMBDA_INLINE {
    if (rr < rows) unroll<V>([&](auto v) GT_LAMBDA_INLINE { store<T>(c + rr * ldc + j0 + v * L, alpha * acc[rr][v]); });
  });
}

// c[r][e0 .. e0 + kCols) = Σ_{j<nk} a[r][j]·y[j][e0 ..] for r < rows (≤ Cfg::rows), summed in key order.
template <class Cfg, class T>
GT_INLINE void rows_block(const T* a, int64_t lda, int rows, const T* y, int64_t ldy, int64_t nk, int64_t e0, T* c,
                          int64_t ldc) {
  constexpr int V = kVecs<T, Cfg>, L = kLanesOf<T, Cfg>, kRows = Cfg::rows;
  VecOf<T, Cfg> acc[kRows][V];
  zero_block<Cfg, T, V>(acc);
  const T* ar[kRows];
  for (int rr = 0; rr < kRows; ++rr) ar[rr] = a + std::min(rr, rows - 1) * lda;
  for (int64_t j = 0; j < nk; ++j) {
    VecOf<T, Cfg> yr[V];
    unroll<V>([&](auto v) GT_LAMBDA_INLINE { yr[v] = load_n<Cfg::bytes>(y + j * ldy + e0 + v * L); });
    unroll<kRows>([&](auto rr) GT_LAMBDA_INLINE {
      const T av = ar[rr][j];
      unroll<V>([&](auto v) GT_LAMBDA_INLINE { acc[rr][v] += av * yr[v]; });
    });
  }
  unroll<kRows>([&](auto rr) GT_LAMBDA_INLINE {
    if (rr < rows) unroll<V>([&](auto v) GT_LAMBDA_INLINE { store<T>(c + rr * ldc + e0 + v * L, acc[rr][v]); });
  });
}

// c[j0 + jj][e0 .. e0 + kCols) += Σ_{r0≤r<r1} a[r][j0 + jj]·x[r][e0 ..] for jj < keys (≤ Cfg::rows); a has at
// least j0 + Cfg::rows readable columns.
template <class Cfg, class T>
GT_INLINE void cols_block(const T* a, int64_t lda, int64_t j0, int keys, const T* x, int64_t ldx, int64_t r0,
                          int64_t r1, int64_t e0, T* c, int64_t ldc) {
  constexpr int V = kVecs<T, Cfg>, L = kLanesOf<T, Cfg>, kRows = Cfg::rows;
  VecOf<T, Cfg> acc[kRows][V];
  zero_block<Cfg, T, V>(acc);
  for (int64_t r = r0; r < r1; ++r) {
    VecOf<T, Cfg> xr[V];
    unroll<V>([&](auto v) GT_LAMBDA_INLINE { xr[v] = load_n<Cfg::bytes>(x + r * ldx + e0 + v * L); });
    const T* ar = a + r * lda + j0;
    unroll<kRows>([&](auto jj) GT_LAMBDA_INLINE {
      const T av = ar[jj];
      unroll<V>([&](auto v) GT_LAMBDA_INLINE { acc[jj][v] += av * xr[v]; });
    });
  }
  unroll<kRows>([&](auto jj) GT_LAMBDA_INLINE {
    if (jj < keys)
      unroll<V>([&](auto v) GT_LAMBDA_INLINE {
        T* p = c + (j0 + jj) * ldc + e0 + v * L;
        store<T>(p, load_n<Cfg::bytes>(p) + acc[jj][v]);
      });
  });
}

// max(x[0 .. n)), as `x > m ? x : m` from −∞ finds it: a NaN is never taken, so the lanes may meet in any order
// (the sign of a zero maximum can differ with the order, but neither the exponentials x − max nor max + log(sum ≥ 1)
// see it). f32 runs in kLanes lanes: the scalar loop's chain of dependent compares took ~12 % of the forward.
template <class T>
GT_INLINE T row_max(const T* x, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
  int64_t j = 0;
  if constexpr (std::is_same_v<T, float>) {
    constexpr int L = kLanes<T>;
    Vec<T> m = Vec<T>{} + mx;
    for (; j + L <= n; j += L) {
      const Vec<T> v = load(x + j);
      m = v > m ? v : m;
    }
    for (int l = 0; l < L; ++l) mx = m[l] > mx ? m[l] : mx;
  }
  for (; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
  return mx;
}

// 0, 1, …, 15: the lane numbers of a 64-byte vector of f32, compared with what is left of a row to mask its tail.
GT_INLINE Int32Of<Vec64<float>> lane_numbers() {
  Int32Of<Vec64<float>> lane{};
  for (int l = 0; l < kLanes64<float>; ++l) lane[l] = l;
  return lane;
}

// row[j] = e^(row[j] − mx) / Σ e^(row[k] − mx) for j < n (the softmax of a row of scores whose maximum is mx);
// returns the sum. f32 runs on 64-byte vectors up to round_up(n, 16) (row must have that many elements: the score
// buffers' rows are kCols-padded), the lanes past n set to zero, and sums in sixteen lanes combined in a fixed order:
// a row of gpt_bytes' T = 64 took three scalar-tailed loops and a sum in double before (about a fifth of the
// forward kernel). f64 keeps the plain loops.
template <class T>
GT_INLINE double softmax_row(T* row, int64_t n, T mx) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr int L = kLanes64<float>;
    using V = Vec64<float>;
    const auto lane = lane_numbers();
    V acc{};
    for (int64_t j = 0; j < n; j += L) {
      const V e = exp_keep_nan<V>(load64(row + j) - mx);
      const V kept = lane < static_cast<int32_t>(n - j) ? e : V{};
      store<float>(row + j, kept);
      acc += kept;
    }
    for (int w = L / 2; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
    const float sum = acc[0], inv = 1.0f / sum;
    for (int64_t j = 0; j < n; j += L) store<float>(row + j, load64(row + j) * inv);
    return sum;
  } else {
    GT_SIMD
    for (int64_t j = 0; j < n; ++j) row[j] = exp_keep_nan<T>(row[j] - mx);
    const double sum = lane_sum(n, [&](int64_t j) { return static_cast<double>(row[j]); });
    const T inv = static_cast<T>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    return sum;
  }
}

// The backward's row without dropout: p[j] = e^(p[j] − lse) (the probabilities again, from the scores) and
// ds[j] = p[j]·(ds[j] − delta)·scale (dS from dP) for j < n. f32 on 64-byte vectors as softmax_row, the lanes past n
// zeroed; the same arithmetic per element as the plain loop f64 keeps (`omp simd` made GCC's 32-byte loop with a
// scalar tail).
template <class T>
GT_INLINE void softmax_grad_row(T* p, T* ds, int64_t n, T lse, T delta, T scale) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr int L = kLanes64<float>;
    using V = Vec64<float>;
    const auto lane = lane_numbers();
    for (int64_t j = 0; j < n; j += L) {
      const auto keep = lane < static_cast<int32_t>(n - j);
      const V pj = exp_keep_nan<V>(load64(p + j) - lse);
      const V dj = pj * (load64(ds + j) - delta) * scale;
      store<float>(p + j, keep ? pj : V{});
      store<float>(ds + j, keep ? dj : V{});
    }
  } else {
    GT_SIMD
    for (int64_t j = 0; j < n; ++j) {
      p[j] = exp_keep_nan<T>(p[j] - lse);
      ds[j] = p[j] * (ds[j] - delta) * scale;
    }
  }
}

// Calls f(j, keep) for j in [0, n), keep being dropout's decision for mask index index0 + j: one Philox block per
// four indices, the words ops/math.h's dropout_keep reads, so the mask is dropout_keep's.
template <class F>
GT_INLINE void for_each_keep(int64_t n, uint64_t index0, const ops::AttentionDropout& drop, F&& f) {
  for (int64_t j = 0; j < n;) {
    const uint64_t index = index0 + static_cast<uint64_t>(j);
    const PhiloxBlock block = philox4x32(index / 4, drop.step, drop.key);
    for (uint64_t w = index % 4; w < 4 && j < n; ++w, ++j) f(j, dropout_keep_word(block.v[w], drop.p));
  }
}

// row[0, n) rounded to *half in place when half is set (f32 only: a half precision never reaches the f64 kernels).
template <class T>
GT_INLINE void round_row(const HalfFormat* half, T* row, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    if (half) round_to_half(*half, row, row, static_cast<size_t>(n));
}

// Where the head size is a multiple of kCols the kernels read q, k, v and dout where they are and write out, dq, dk
// and dv in place; otherwise, and under a half precision (whose operands the copies round), those go through
// zero-padded copies ("packed", [rows][dp]). Keys are always also copied transposed ([d][tp], zero past the last
// key), the layout the score kernel reads.
inline bool packed(int64_t d, const HalfFormat* half) { return d % kCols != 0 || half != nullptr; }

// Rounds a packed copy's n elements to *half in place when half is set: the copies are where a half precision's
// operands are rounded (one pass over each task's few kilobytes, in cache, rather than over the whole tensor).
template <class T>
GT_INLINE void round_packed(const HalfFormat* half, T* p, int64_t n) {
  round_row(half, p, n);
}

}  // namespace gt::cpu::attention_detail
