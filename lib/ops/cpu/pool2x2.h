// The 2×2, stride-2, unpadded max and average pools' row loops (ops/cpu/pool2d.cpp), shared with the chains that run
// a pool inside another op's pass (batch norm's epilogue, ops/cpu/batchnorm.cpp); and relu's loops for those chains.
// File-local in each file that includes it (compiled per instruction set there).
#pragma once

#include "ops/cpu/vec_math.h"
#include "ops/math.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace gt::cpu {
namespace {

// The 2×2, stride-2, unpadded window of most CNNs, without the general loop's range arithmetic.
inline bool is_2x2(const Window2d& k) {
  return k.kh == 2 && k.kw == 2 && k.sh == 2 && k.sw == 2 && k.ph == 0 && k.pw == 0 && k.dh == 1 && k.dw == 1;
}

// Output rows [r0, r1) (plane-major) of the 2×2 window's forward, written without branches so they vectorise.
template <class T>
GT_INLINE void pool2x2_fwd_rows(bool is_max, const T* px, int64_t h, int64_t w, int64_t oh, int64_t ow, T* py,
                                int64_t r0, int64_t r1) {
  // (plane p, row oy) of output row r, stepped along instead of divided out per row
  for (int64_t r = r0, p = r0 / oh, oy = r0 % oh; r < r1; ++r, oy = oy + 1 == oh ? 0 : oy + 1, p += oy == 0) {
    const T* a = px + (p * h + 2 * oy) * w;
    const T* b = a + w;
    T* dst = py + r * ow;
    if (is_max)
      for (int64_t ox = 0; ox < ow; ++ox)
        dst[ox] = std::max(std::max(a[2 * ox], a[2 * ox + 1]), std::max(b[2 * ox], b[2 * ox + 1]));
    else
      for (int64_t ox = 0; ox < ow; ++ox) dst[ox] = (a[2 * ox] + a[2 * ox + 1] + b[2 * ox] + b[2 * ox + 1]) * T(0.25);
  }
}

// The input outside every 2×2 window next to row pair oy: its odd last column, and after the last pair an odd last row.
template <class T>
GT_INLINE void pool2x2_zero_rest(int64_t h, int64_t w, int64_t oh, int64_t oy, T* da) {
  if (w % 2) da[w - 1] = da[2 * w - 1] = T(0);
  if (h % 2 && oy == oh - 1) std::fill(da + 2 * w, da + 3 * w, T(0));
}

// Max backward of window ox of a row pair (a, b): the first maximum in reading order takes the gradient (as
// PyTorch's); with a NaN in the window, none equals the maximum and the last tap takes it.
template <class T>
GT_INLINE void pool2x2_max_bwd_window(const T* a, const T* b, const T* g, int64_t ox, T* da, T* db) {
  const T a0 = a[2 * ox], a1 = a[2 * ox + 1], b0 = b[2 * ox], b1 = b[2 * ox + 1], go = g[ox];
  const T m = std::max(std::max(a0, a1), std::max(b0, b1));
  const int which = a0 == m ? 0 : a1 == m ? 1 : b0 == m ? 2 : 3;
  da[2 * ox] = which == 0 ? go : T(0);
  da[2 * ox + 1] = which == 1 ? go : T(0);
  db[2 * ox] = which == 2 ? go : T(0);
  db[2 * ox + 1] = which == 3 ? go : T(0);
}

// Input row pairs [2·r0, 2·r1) of the 2×2 window's backward (oh = ⌊h/2⌋, ow = ⌊w/2⌋: an odd last row or column is
// in no window and gets zeros), from the gradients of output rows [r0, r1) at pdy (pdy is output row r0's, so that a
// chain can hand over just those rows). Max: pool2x2_max_bwd_window.
template <class T>
GT_INLINE void pool2x2_bwd_rows(bool is_max, const T* px, const T* pdy, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                T* pdx, int64_t r0, int64_t r1) {
  // (plane p, row oy) of output row r, stepped along instead of divided out per row
  for (int64_t r = r0, p = r0 / oh, oy = r0 % oh; r < r1; ++r, oy = oy + 1 == oh ? 0 : oy + 1, p += oy == 0) {
    const T* a = px + (p * h + 2 * oy) * w;
    const T* b = a + w;
    T* da = pdx + (p * h + 2 * oy) * w;
    T* db = da + w;
    const T* g = pdy + (r - r0) * ow;
    for (int64_t ox = 0; ox < ow; ++ox) {
      if (!is_max) {
        da[2 * ox] = da[2 * ox + 1] = db[2 * ox] = db[2 * ox + 1] = g[ox] * T(0.25);
        continue;
      }
      pool2x2_max_bwd_window(a, b, g, ox, da, db);
    }
    pool2x2_zero_rest(h, w, oh, oy, da);
  }
}

// The f32 max backward on vectors of N lanes (N / 2 windows): each lane holds one tap of its row and finds its
// window's maximum through the neighbouring lane, so the loads and stores are contiguous (GCC leaves the scalar loop
// above unvectorised); the same choice of tap as the scalar loop, NaN included. A row takes vectors of 16 lanes, then
// at most one of 8 and one of 4, so that only an odd last window goes through pool2x2_max_bwd_window: the rows of
// small images are short (14, 7 and 3 windows in the CNNs), and a window there cost several times a vector lane's
// work. (Copying the tail and its gradients into zero-padded arrays instead cost memcpy calls and a failed store
// forwarding into each vector load.)
template <int N>
using PoolVec = VecN<float, 4 * N>;
template <int N>
using PoolMask = VecN<int32_t, 4 * N>;
template <class V>
GT_INLINE V pool_swap_pairs(V v) {  // lanes 1, 0, 3, 2, …
  if constexpr (sizeof(V) == 64)
    return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  else if constexpr (sizeof(V) == 32)
    return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
  else
    return __builtin_shufflevector(v, v, 1, 0, 3, 2);
}
template <class V>
GT_INLINE V pool_dup_even(V v) {  // lanes 0, 0, 2, 2, …
  if constexpr (sizeof(V) == 64)
    return __builtin_shufflevector(v, v, 0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14);
  else if constexpr (sizeof(V) == 32)
    return __builtin_shufflevector(v, v, 0, 0, 2, 2, 4, 4, 6, 6);
  else
    return __builtin_shufflevector(v, v, 0, 0, 2, 2);
}
template <int N>
GT_INLINE PoolVec<N> pool_window_grads(const float* g) {  // g[0], g[0], g[1], g[1], …: each window's on its taps
  VecN<float, 2 * N> half;
  std::memcpy(&half, g, sizeof half);
  if constexpr (N == 16)
    return __builtin_shufflevector(half, half, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  else if constexpr (N == 8)
    return __builtin_shufflevector(half, half, 0, 0, 1, 1, 2, 2, 3, 3);
  else
    return __builtin_shufflevector(half, half, 0, 0, 1, 1);
}
template <int N>
GT_INLINE PoolVec<N> pool_vmax(PoolVec<N> x, PoolVec<N> y) {  // std::max(x, y) per lane: x unless x < y
  const PoolMask<N> lt = x < y;
  return std::bit_cast<PoolVec<N>>((std::bit_cast<PoolMask<N>>(y) & lt) | (std::bit_cast<PoolMask<N>>(x) & ~lt));
}
// Taps [j, j + N) of a row pair (a, b): N / 2 windows, their gradients from g[j / 2].
template <int N>
GT_INLINE void pool2x2_max_bwd_taps(const float* a, const float* b, const float* g, int64_t j, float* da, float* db) {
  PoolMask<N> odd;
  for (int k = 0; k < N; ++k) odd[k] = k % 2 ? -1 : 0;
  const PoolVec<N> va = load_n<4 * N>(a + j), vb = load_n<4 * N>(b + j);
  const PoolVec<N> vg = pool_window_grads<N>(g + j / 2);
  // the window's maximum in the scalar order on the even lanes, then on both
  const PoolVec<N> m =
      pool_dup_even(pool_vmax<N>(pool_vmax<N>(va, pool_swap_pairs(va)), pool_vmax<N>(vb, pool_swap_pairs(vb))));
  const PoolMask<N> ea = va == m, eb = vb == m;
  const PoolMask<N> eas = pool_swap_pairs(ea), ebs = pool_swap_pairs(eb);
  const PoolMask<N> any_a = ea | eas;
  const PoolMask<N> win_a = ea & ~(odd & eas);                      // a0 first; a1 if a0 is not the max
  const PoolMask<N> win_b = ~any_a & ((eb & ~odd) | (odd & ~ebs));  // b0 if no a; b1 if no other tap
  const PoolVec<N> ga = std::bit_cast<PoolVec<N>>(std::bit_cast<PoolMask<N>>(vg) & win_a);
  const PoolVec<N> gb = std::bit_cast<PoolVec<N>>(std::bit_cast<PoolMask<N>>(vg) & win_b);
  std::memcpy(da + j, &ga, sizeof ga);
  std::memcpy(db + j, &gb, sizeof gb);
}
GT_INLINE void pool2x2_max_bwd_rows_vec(const float* px, const float* pdy, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                        float* pdx, int64_t r0, int64_t r1) {
  const int64_t taps = 2 * ow;  // of a row in windows
  // (plane p, row oy) of output row r, stepped along instead of divided out per row
  for (int64_t r = r0, p = r0 / oh, oy = r0 % oh; r < r1; ++r, oy = oy + 1 == oh ? 0 : oy + 1, p += oy == 0) {
    const float* a = px + (p * h + 2 * oy) * w;
    const float* b = a + w;
    float* da = pdx + (p * h + 2 * oy) * w;
    float* db = da + w;
    const float* g = pdy + (r - r0) * ow;
    int64_t j = 0;
    for (; j + 16 <= taps; j += 16) pool2x2_max_bwd_taps<16>(a, b, g, j, da, db);
    if (j + 8 <= taps) {
      pool2x2_max_bwd_taps<8>(a, b, g, j, da, db);
      j += 8;
    }
    if (j + 4 <= taps) {
      pool2x2_max_bwd_taps<4>(a, b, g, j, da, db);
      j += 4;
    }
    for (int64_t ox = j / 2; ox < ow; ++ox) pool2x2_max_bwd_window(a, b, g, ox, da, db);
    pool2x2_zero_rest(h, w, oh, oy, da);
  }
}

GT_CPU_KERNEL(pool2x2_fwd_rows_f32,
              (bool is_max, const float* px, int64_t h, int64_t w, int64_t oh, int64_t ow, float* py, int64_t r0,
               int64_t r1),
              (is_max, px, h, w, oh, ow, py, r0, r1), pool2x2_fwd_rows<float>)
GT_INLINE void pool2x2_bwd_rows_any(bool is_max, const float* px, const float* pdy, int64_t h, int64_t w, int64_t oh,
                                    int64_t ow, float* pdx, int64_t r0, int64_t r1) {
  if (is_max)
    pool2x2_max_bwd_rows_vec(px, pdy, h, w, oh, ow, pdx, r0, r1);
  else
    pool2x2_bwd_rows<float>(is_max, px, pdy, h, w, oh, ow, pdx, r0, r1);
}
GT_CPU_KERNEL(pool2x2_bwd_rows_f32,
              (bool is_max, const float* px, const float* pdy, int64_t h, int64_t w, int64_t oh, int64_t ow, float* pdx,
               int64_t r0, int64_t r1),
              (is_max, px, pdy, h, w, oh, ow, pdx, r0, r1), pool2x2_bwd_rows_any)

// relu's forward and backward (ops/math.h's act_forward / act_backward: NaN stays NaN, the derivative is dy where x >
// 0) over n values, for the chains: y may be x.
template <class T>
GT_INLINE void chain_relu_fwd(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = act_forward<T>(Activation::relu, x[i]);
}
template <class T>
GT_INLINE void chain_relu_bwd(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = act_backward<T>(Activation::relu, x[i], T(0), dy[i]);
}
GT_CPU_KERNEL(chain_relu_fwd_f32, (const float* x, float* y, int64_t n), (x, y, n), chain_relu_fwd<float>)
GT_CPU_KERNEL(chain_relu_bwd_f32, (const float* x, const float* dy, float* dx, int64_t n), (x, dy, dx, n),
              chain_relu_bwd<float>)

}  // namespace
}  // namespace gt::cpu
