// CPU causal attention (ops/attention.h), blocked and causal: one (batch, head) per task, whose q, k, v (and dout,
// going back) are first copied into zero-padded buffers, and queries in tiles of kTile rows. Register-blocked loops
// (kRows rows × kCols columns of accumulators) compute a tile's scores only up to each block of rows' last key (half
// of the square a GEMM would compute), the softmax with a vectorised exp, and the products with v, k and q; at most a
// [kTile, T] block of scores exists per thread. The backward recomputes the tile's probabilities from the forward's
// log-sum-exp. The f32 bodies are compiled per instruction set (GT_CPU_KERNEL). Each task runs on one thread in a
// fixed order, so results do not depend on the thread count, and every sum runs in the same order whichever rows
// share its tile, so a decoded row equals the forward's bit for bit. Dropout (ops/attention.h) scales or zeroes each
// probability from its Philox draw before the product with v, and the backward draws the same mask again; without
// dropout no mask is drawn. Under a half product precision (ops/precision.h) the four products multiply operands
// rounded to bf16/fp16 with f32 accumulation, as a GPU's flash attention does: q, k, v and dout in each task's
// copies of them, and each row of P (after dropout) and of dS where it is made; the scores' scale, the softmax, its
// statistics (max, sum, lse), delta = Σ dout·out and dS's arithmetic stay f32.
#include "ops/attention.h"

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

namespace gt::cpu {
namespace {

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

int64_t round_up(int64_t n, int64_t k) { return (n + k - 1) / k * k; }

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
bool packed(int64_t d, const HalfFormat* half) { return d % kCols != 0 || half != nullptr; }

// Rounds a packed copy's n elements to *half in place when half is set: the copies are where a half precision's
// operands are rounded (one pass over each task's few kilobytes, in cache, rather than over the whole tensor).
template <class T>
GT_INLINE void round_packed(const HalfFormat* half, T* p, int64_t n) {
  round_row(half, p, n);
}

// One (batch, head), query rows [first, first + n) over keys [0, first + n): q, k, v rows ld apart from qkv's head
// slice; out rows ldo apart (row i at out + (i − first)·ldo); lse (may be null) indexed by position; drop (null:
// none) with the mask index of (i, j) at mask + i·t + j; half (null: none) the format the products' operands are
// rounded to. buf holds attn_fwd_scratch(first + n, d, half) elements.
int64_t attn_fwd_scratch(int64_t keys, int64_t d, const HalfFormat* half) {
  const int64_t tp = round_up(keys, kCols), dp = round_up(d, kCols);
  return d * tp + kTile * tp + (packed(d, half) ? kTile * dp + tp * dp + kTile * dp : 0);
}

template <class Cfg, class T>
GT_INLINE void attn_fwd_task(const T* q, const T* k, const T* v, int64_t ld, int64_t first, int64_t n, int64_t d,
                             T scale, T* out, int64_t ldo, T* lse, const ops::AttentionDropout* drop, uint64_t mask,
                             int64_t t, const HalfFormat* half, T* buf) {
  constexpr int kRows = Cfg::rows;
  const int64_t keys = first + n, tp = round_up(keys, kCols), dp = round_up(d, kCols);
  const T keep_scale = drop ? static_cast<T>(1.0 / (1.0 - drop->p)) : T(1);  // as ops/dropout.h's kernels round it
  const bool pack = packed(d, half);
  T* kt = buf;              // [d][tp]
  T* s = kt + d * tp;       // [kTile][tp]: scores, then probabilities
  T* qp = s + kTile * tp;   // packed: [kTile][dp], the tile's queries
  T* vp = qp + kTile * dp;  // packed: [tp][dp]
  T* op = vp + tp * dp;     // packed: [kTile][dp]
  pack_transposed(k, ld, keys, d, tp, kt);
  round_packed(half, kt, d * tp);
  if (pack) {
    pack_rows(v, ld, keys, d, dp, tp, vp);
    round_packed(half, vp, tp * dp);
  }
  const T* vs = pack ? vp : v;
  const int64_t ldv = pack ? dp : ld;
  for (int64_t i0 = first; i0 < keys; i0 += kTile) {
    const int64_t m = std::min(kTile, keys - i0);
    if (pack) {
      pack_rows(q + i0 * ld, ld, m, d, dp, m, qp);
      round_packed(half, qp, m * dp);
    }
    const T* qs = pack ? qp : q + i0 * ld;
    const int64_t ldq = pack ? dp : ld;
    for (int64_t r0 = 0; r0 < m; r0 += kRows) {  // scores up to each block of rows' last key
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
      const int64_t nc = round_up(i0 + r0 + rows, kCols);
      for (int64_t j0 = 0; j0 < nc; j0 += kCols)
        dot_block<Cfg>(qs + r0 * ldq, ldq, rows, kt, tp, d, j0, scale, s + r0 * tp, tp);
    }
    for (int64_t r = 0; r < m; ++r) {
      T* row = s + r * tp;
      const int64_t last = i0 + r;  // keys 0..last are visible to query i0 + r
      const T mx = row_max(row, last + 1);
      const double sum = softmax_row(row, last + 1, mx);
      std::fill(row + last + 1, row + i0 + m, T(0));
      if (lse) lse[last] = static_cast<T>(mx + std::log(sum));
      if (drop)
        for_each_keep(last + 1, mask + static_cast<uint64_t>(last * t), *drop,
                      [&](int64_t j, bool keep) { row[j] = keep ? row[j] * keep_scale : T(0); });
      round_row(half, row, last + 1);  // P, the operand of P·v
    }
    T* os = pack ? op : out + (i0 - first) * ldo;
    const int64_t ldc = pack ? dp : ldo;
    for (int64_t r0 = 0; r0 < m; r0 += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
      for (int64_t e0 = 0; e0 < dp; e0 += kCols)
        rows_block<Cfg>(s + r0 * tp, tp, rows, vs, ldv, i0 + r0 + rows, e0, os + r0 * ldc, ldc);
    }
    if (pack)
      for (int64_t r = 0; r < m; ++r) std::copy(op + r * dp, op + r * dp + d, out + (i0 - first + r) * ldo);
  }
}

// One (batch, head) of the backward over T positions: dq, dk, dv rows ld apart (overwritten); g (dout) and o (out)
// rows ldo apart; lse and delta (written: Σ dout·out per row, from the unrounded dout) by position; drop and mask as
// the forward's; half (null: none) the format the products' operands are rounded to. buf holds
// attn_bwd_scratch(t, d, half) elements.
int64_t attn_bwd_scratch(int64_t t, int64_t d, const HalfFormat* half) {
  const int64_t tp = round_up(t, kCols), dp = round_up(d, kCols);
  return 2 * d * tp + 2 * kTile * tp + (packed(d, half) ? 5 * tp * dp + kTile * dp : 0);
}

template <class Cfg, class T>
GT_INLINE void attn_bwd_task(const T* q, const T* k, const T* v, int64_t ld, const T* g, const T* o, int64_t ldo,
                             const T* lse, T* delta, int64_t t, int64_t d, T scale, T* dq, T* dk, T* dv,
                             const ops::AttentionDropout* drop, uint64_t mask, const HalfFormat* half, T* buf) {
  constexpr int kRows = Cfg::rows;
  const int64_t tp = round_up(t, kCols), dp = round_up(d, kCols);
  const T keep_scale = drop ? static_cast<T>(1.0 / (1.0 - drop->p)) : T(1);
  const bool pack = packed(d, half);
  T* kt = buf;              // [d][tp]
  T* vt = kt + d * tp;      // [d][tp]
  T* p = vt + d * tp;       // [kTile][tp]: probabilities
  T* ds = p + kTile * tp;   // [kTile][tp]: dP, then dS
  T* qp = ds + kTile * tp;  // packed: [tp][dp]
  T* kp = qp + tp * dp;     // packed: [tp][dp]
  T* gp = kp + tp * dp;     // packed: [tp][dp], dout
  T* dkp = gp + tp * dp;    // packed: [tp][dp]
  T* dvp = dkp + tp * dp;   // packed: [tp][dp]
  T* dqp = dvp + tp * dp;   // packed: [kTile][dp]
  pack_transposed(k, ld, t, d, tp, kt);
  pack_transposed(v, ld, t, d, tp, vt);
  round_packed(half, kt, 2 * d * tp);  // kt and vt
  if (pack) {
    pack_rows(q, ld, t, d, dp, tp, qp);
    pack_rows(k, ld, t, d, dp, tp, kp);
    pack_rows(g, ldo, t, d, dp, tp, gp);
    round_packed(half, qp, 3 * tp * dp);      // qp, kp and gp
    std::fill(dkp, dkp + 2 * tp * dp, T(0));  // dk and dv
  } else {
    for (int64_t j = 0; j < t; ++j) {
      std::fill(dk + j * ld, dk + j * ld + d, T(0));
      std::fill(dv + j * ld, dv + j * ld + d, T(0));
    }
  }
  const T* qs = pack ? qp : q;
  const T* ks = pack ? kp : k;
  const T* gs = pack ? gp : g;
  T* dks = pack ? dkp : dk;
  T* dvs = pack ? dvp : dv;
  const int64_t ldq = pack ? dp : ld, ldg = pack ? dp : ldo;  // q, k, dk, dv rows ldq apart; dout rows ldg
  for (int64_t i = 0; i < t; ++i)
    delta[i] =
        static_cast<T>(lane_sum(d, [&](int64_t e) { return static_cast<double>(g[i * ldo + e]) * o[i * ldo + e]; }));
  for (int64_t i0 = 0; i0 < t; i0 += kTile) {
    const int64_t m = std::min(kTile, t - i0);
    for (int64_t r0 = 0; r0 < m; r0 += kRows) {  // scores and dP = dout·vᵀ up to each block of rows' last key
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
      const int64_t nc = round_up(i0 + r0 + rows, kCols);
      for (int64_t j0 = 0; j0 < nc; j0 += kCols) {
        dot_block<Cfg>(qs + (i0 + r0) * ldq, ldq, rows, kt, tp, d, j0, scale, p + r0 * tp, tp);
        dot_block<Cfg>(gs + (i0 + r0) * ldg, ldg, rows, vt, tp, d, j0, T(1), ds + r0 * tp, tp);
      }
    }
    for (int64_t r = 0; r < m; ++r) {
      T* pr = p + r * tp;
      T* dr = ds + r * tp;
      const int64_t last = i0 + r;
      const T li = lse[last], di = delta[last];
      if (drop) {
        // pr becomes m_ij p_ij, what dv sums; dr holds dout_i·v_j, the gradient of m_ij p_ij.
        for_each_keep(last + 1, mask + static_cast<uint64_t>(last * t), *drop, [&](int64_t j, bool keep) {
          const T pij = exp_keep_nan<T>(pr[j] - li), mij = keep ? keep_scale : T(0);
          dr[j] = pij * (mij * dr[j] - di) * scale;  // dS
          pr[j] = mij * pij;
        });
      } else {
        softmax_grad_row(pr, dr, last + 1, li, di, scale);
      }
      round_row(half, pr, last + 1);  // P (with dropout's m), the operand of Pᵀ·dout
      round_row(half, dr, last + 1);  // dS, the operand of dS·k and dSᵀ·q
      std::fill(pr + last + 1, pr + i0 + m, T(0));
      std::fill(dr + last + 1, dr + i0 + m, T(0));
    }
    T* dqs = pack ? dqp : dq + i0 * ld;
    const int64_t lddq = pack ? dp : ld;
    for (int64_t r0 = 0; r0 < m; r0 += kRows) {  // dq = dS·k
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
      for (int64_t e0 = 0; e0 < dp; e0 += kCols)
        rows_block<Cfg>(ds + r0 * tp, tp, rows, ks, ldq, i0 + r0 + rows, e0, dqs + r0 * lddq, lddq);
    }
    if (pack)
      for (int64_t r = 0; r < m; ++r) std::copy(dqp + r * dp, dqp + r * dp + d, dq + (i0 + r) * ld);
    // dk += dSᵀ·q and dv += Pᵀ·dout over the tile's rows at or after each key (the rows before it see it not).
    for (int64_t j0 = 0; j0 < i0 + m; j0 += kRows) {
      const int keys = static_cast<int>(std::min<int64_t>(kRows, i0 + m - j0));
      const int64_t r0 = std::max<int64_t>(0, j0 - i0);
      for (int64_t e0 = 0; e0 < dp; e0 += kCols) {
        cols_block<Cfg>(ds, tp, j0, keys, qs + i0 * ldq, ldq, r0, m, e0, dks, ldq);
        cols_block<Cfg>(p, tp, j0, keys, gs + i0 * ldg, ldg, r0, m, e0, dvs, ldq);
      }
    }
  }
  if (pack)
    for (int64_t j = 0; j < t; ++j) {
      std::copy(dkp + j * dp, dkp + j * dp + d, dk + j * ld);
      std::copy(dvp + j * dp, dvp + j * dp + d, dv + j * ld);
    }
}

// The f32 tasks: Narrow blocks compiled per instruction set, and Wide ones for AVX-512 (x86-64-v4) alone.
#define GT_ATTN_FWD_PARAMS                                                                                      \
  const float *q, const float *k, const float *v, int64_t ld, int64_t first, int64_t n, int64_t d, float scale, \
      float *out, int64_t ldo, float *lse, const ops::AttentionDropout *drop, uint64_t mask, int64_t t,         \
      const HalfFormat *half, float *buf
#define GT_ATTN_FWD_ARGS q, k, v, ld, first, n, d, scale, out, ldo, lse, drop, mask, t, half, buf
#define GT_ATTN_BWD_PARAMS                                                                                 \
  const float *q, const float *k, const float *v, int64_t ld, const float *g, const float *o, int64_t ldo, \
      const float *lse, float *delta, int64_t t, int64_t d, float scale, float *dq, float *dk, float *dv,  \
      const ops::AttentionDropout *drop, uint64_t mask, const HalfFormat *half, float *buf
#define GT_ATTN_BWD_ARGS q, k, v, ld, g, o, ldo, lse, delta, t, d, scale, dq, dk, dv, drop, mask, half, buf

GT_CPU_KERNEL(attn_fwd_task_f32, (GT_ATTN_FWD_PARAMS), (GT_ATTN_FWD_ARGS), attn_fwd_task<Narrow, float>)
GT_CPU_KERNEL(attn_bwd_task_f32, (GT_ATTN_BWD_PARAMS), (GT_ATTN_BWD_ARGS), attn_bwd_task<Narrow, float>)
#if defined(__x86_64__)
#define GT_ATTN_WIDE_TARGET __attribute__((target("arch=x86-64-v4")))
GT_ATTN_WIDE_TARGET void attn_fwd_task_f32_wide(GT_ATTN_FWD_PARAMS) { attn_fwd_task<Wide, float>(GT_ATTN_FWD_ARGS); }
GT_ATTN_WIDE_TARGET void attn_bwd_task_f32_wide(GT_ATTN_BWD_PARAMS) { attn_bwd_task<Wide, float>(GT_ATTN_BWD_ARGS); }
#endif

std::atomic<bool> g_attention_narrow{false};  // force_attention_narrow

// Whether the f32 tasks take the Wide blocks: the kernels run AVX-512 (ops/cpu/isa.h: the CPU has x86-64-v4's
// subsets and no test forced a narrower path) and no test asked for the Narrow ones.
bool attention_wide() { return cpu_isa() == CpuIsa::avx512 && !g_attention_narrow.load(std::memory_order_relaxed); }

void attn_fwd_task_dispatch(GT_ATTN_FWD_PARAMS) {
#if defined(__x86_64__)
  if (attention_wide()) return attn_fwd_task_f32_wide(GT_ATTN_FWD_ARGS);
#endif
  attn_fwd_task_f32(GT_ATTN_FWD_ARGS);
}
void attn_bwd_task_dispatch(GT_ATTN_BWD_PARAMS) {
#if defined(__x86_64__)
  if (attention_wide()) return attn_bwd_task_f32_wide(GT_ATTN_BWD_ARGS);
#endif
  attn_bwd_task_f32(GT_ATTN_BWD_ARGS);
}

// The calling thread's half format for attention's products (null: fp32/tf32, and always for f64).
template <class T>
std::optional<HalfFormat> attention_half() {
  if constexpr (std::is_same_v<T, float>) return half_format(product_precision());
  return std::nullopt;
}

// Asks for rows [0, n) of a head's slice (d values each, rows ld apart) to be brought into L2: the dispatchers
// below prefetch the next task's q, k, v (and dout, out) while the current one computes. Its rows sit 3C apart,
// beyond what the hardware prefetchers follow across pages, and first touching them took ~40 % of the backward.
template <class T>
void prefetch_rows(const T* p, int64_t ld, int64_t n, int64_t d) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t e = 0; e < d; e += kLine) __builtin_prefetch(p + r * ld + e, 0, 2);
}

// (batch, head) tasks per chunk that a thread takes: four chunks per thread, so that a core slowed by another
// process takes fewer (a static half each left the faster thread waiting), each chunk's tasks in order so that the
// next one's rows are prefetched while one computes (only a chunk's first task starts cold).
int64_t attention_chunk(int64_t tasks) { return std::max<int64_t>(1, tasks / (4 * std::max(1, num_threads()))); }

// Query rows [first, first + n) of qkv's sequences (all of them for the forward, the new ones for a decode step):
// out is [B, n, C]; lse [B, heads, T] is written when given; drop (null: none) masks the probabilities.
template <class T>
void attn_fwd_t(const Tensor& qkv, int64_t heads, int64_t first, int64_t n, Tensor& out, T* pl,
                const ops::AttentionDropout* drop) {
  const int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3, d = c / heads;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const std::optional<HalfFormat> half = attention_half<T>();
  const T* px = qkv.data<T>();
  const HalfFormat* ph = half ? &*half : nullptr;
  T* po = out.data<T>();
  parallel_for_stealing(nb * heads, attention_chunk(nb * heads), [&](int64_t u0, int64_t u1) {
    thread_local std::vector<T> buf;  // grown, never shrunk
    buf.resize(std::max(buf.size(), static_cast<size_t>(attn_fwd_scratch(first + n, d, ph))));
    auto head = [&](int64_t u) { return px + u / heads * t * 3 * c + u % heads * d; };  // the task's q
    for (int64_t u = u0; u < u1; ++u) {
      if (u + 1 < u1) prefetch_rows(head(u + 1), c, 3 * (first + n), d);  // its q, k and v rows
      const int64_t b = u / heads, h = u % heads;
      const T* q = px + b * t * 3 * c + h * d;
      T* o = po + b * n * c + h * d;
      T* l = pl ? pl + (b * heads + h) * t : nullptr;
      const uint64_t mask = attention_dropout_index(b, h, 0, 0, heads, t);
      if constexpr (std::is_same_v<T, float>)
        attn_fwd_task_dispatch(q, q + c, q + 2 * c, 3 * c, first, n, d, scale, o, c, l, drop, mask, t, ph, buf.data());
      else
        attn_fwd_task<Narrow, T>(q, q + c, q + 2 * c, 3 * c, first, n, d, scale, o, c, l, drop, mask, t, ph,
                                 buf.data());
    }
  });
}

// With p_ij = exp(q_i·k_j/√d − lse_i), D_i = Σ dout_i·out_i and dropout's m_ij = keep_ij/(1 − p) (1 without):
// ds_ij = p_ij (m_ij dout_i·v_j − D_i) / √d, dq_i = Σ_j ds_ij k_j, dk_j = Σ_i ds_ij q_i, dv_j = Σ_i m_ij p_ij dout_i.
template <class T>
void attn_bwd_t(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, int64_t heads,
                const ops::AttentionDropout* drop, Tensor& delta, Tensor& dqkv) {
  const int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3, d = c / heads;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const std::optional<HalfFormat> half = attention_half<T>();
  const T* px = qkv.data<T>();
  const HalfFormat* ph = half ? &*half : nullptr;
  const T *po = out.data<T>(), *pl = lse.data<T>(), *pdo = dout.data<T>();
  T* pdelta = delta.data<T>();
  T* pdx = dqkv.data<T>();
  parallel_for_stealing(nb * heads, attention_chunk(nb * heads), [&](int64_t u0, int64_t u1) {
    thread_local std::vector<T> buf;  // grown, never shrunk
    buf.resize(std::max(buf.size(), static_cast<size_t>(attn_bwd_scratch(t, d, ph))));
    for (int64_t u = u0; u < u1; ++u) {
      if (u + 1 < u1) {  // the next task's q, k, v, dout and out rows
        const int64_t b = (u + 1) / heads, h = (u + 1) % heads;
        prefetch_rows(px + b * t * 3 * c + h * d, c, 3 * t, d);
        prefetch_rows(pdo + b * t * c + h * d, c, t, d);
        prefetch_rows(po + b * t * c + h * d, c, t, d);
      }
      const int64_t b = u / heads, h = u % heads;
      const T* q = px + b * t * 3 * c + h * d;
      const T* g = pdo + b * t * c + h * d;
      const T* o = po + b * t * c + h * d;
      const T* l = pl + (b * heads + h) * t;
      T* dl = pdelta + (b * heads + h) * t;
      T* dq = pdx + b * t * 3 * c + h * d;
      const uint64_t mask = attention_dropout_index(b, h, 0, 0, heads, t);
      if constexpr (std::is_same_v<T, float>)
        attn_bwd_task_dispatch(q, q + c, q + 2 * c, 3 * c, g, o, c, l, dl, t, d, scale, dq, dq + c, dq + 2 * c, drop,
                               mask, ph, buf.data());
      else
        attn_bwd_task<Narrow, T>(q, q + c, q + 2 * c, 3 * c, g, o, c, l, dl, t, d, scale, dq, dq + c, dq + 2 * c, drop,
                                 mask, ph, buf.data());
    }
  });
}

}  // namespace

void force_attention_narrow(bool narrow) { g_attention_narrow.store(narrow, std::memory_order_relaxed); }

void attention_forward(const Tensor& qkv, int64_t heads, const ops::AttentionDropout& dropout, Tensor& out,
                       Tensor& lse) {
  const ops::AttentionDropout* drop = dropout.p > 0 ? &dropout : nullptr;
  for_float_type(qkv.dtype(), [&](auto t) {
    using T = decltype(t);
    attn_fwd_t<T>(qkv, heads, 0, qkv.dim(1), out, lse.defined() ? lse.data<T>() : nullptr, drop);
  });
}

void attention_decode(const Tensor& qkv, int64_t heads, int64_t first, Tensor& out) {
  for_float_type(qkv.dtype(), [&](auto t) {
    using T = decltype(t);
    attn_fwd_t<T>(qkv, heads, first, out.dim(1), out, nullptr, nullptr);
  });
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, int64_t heads,
                        const ops::AttentionDropout& dropout, Tensor& delta, Tensor& dqkv) {
  const ops::AttentionDropout* drop = dropout.p > 0 ? &dropout : nullptr;
  for_float_type(qkv.dtype(), [&](auto t) { attn_bwd_t<decltype(t)>(qkv, out, lse, dout, heads, drop, delta, dqkv); });
}

}  // namespace gt::cpu
