// CPU 2-D max and average pooling (ops/pool2d.h), planes in parallel; the common 2×2 window has its own loop.
#include "ops/pool2d.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/vec_math.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>

namespace gt::cpu {
namespace {

// The taps of output (oy, ox) that fall inside the image: rows [y0, y1), columns [x0, x1) of the input.
struct Taps {
  int64_t y0, y1, x0, x1;
};
inline Taps taps(const Window2d& k, int64_t h, int64_t w, int64_t oy, int64_t ox) {
  const int64_t ys = oy * k.sh - k.ph, xs = ox * k.sw - k.pw;
  return {std::max<int64_t>(ys, 0), std::min(ys + k.kh, h), std::max<int64_t>(xs, 0), std::min(xs + k.kw, w)};
}

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
// in no window and gets zeros). Max: pool2x2_max_bwd_window.
template <class T>
GT_INLINE void pool2x2_bwd_rows(bool is_max, const T* px, const T* pdy, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                T* pdx, int64_t r0, int64_t r1) {
  // (plane p, row oy) of output row r, stepped along instead of divided out per row
  for (int64_t r = r0, p = r0 / oh, oy = r0 % oh; r < r1; ++r, oy = oy + 1 == oh ? 0 : oy + 1, p += oy == 0) {
    const T* a = px + (p * h + 2 * oy) * w;
    const T* b = a + w;
    T* da = pdx + (p * h + 2 * oy) * w;
    T* db = da + w;
    const T* g = pdy + r * ow;
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

// The f32 max backward on vectors of 8 lanes (4 windows): each lane holds one tap of its row and finds its window's
// maximum through the neighbouring lane, so the loads and stores are contiguous (GCC leaves the scalar loop above
// unvectorised); the same choice of tap as the scalar loop, NaN included. The windows after a row's last full
// vector go through pool2x2_max_bwd_window. (Copying that tail and the 4 gradients into zero-padded arrays instead
// cost memcpy calls and a failed store forwarding into each vector load: the kernel was 12 % of a CNN step.)
using PoolVec = Vec<float>;
using PoolMask = Vec<int32_t>;
using PoolVec4 [[gnu::vector_size(16)]] = float;
GT_INLINE PoolVec pool_vmax(PoolVec x, PoolVec y) {  // std::max(x, y) per lane: x unless x < y
  const PoolMask lt = x < y;
  return std::bit_cast<PoolVec>((std::bit_cast<PoolMask>(y) & lt) | (std::bit_cast<PoolMask>(x) & ~lt));
}
GT_INLINE void pool2x2_max_bwd_rows_vec(const float* px, const float* pdy, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                        float* pdx, int64_t r0, int64_t r1) {
  const PoolMask odd = {0, -1, 0, -1, 0, -1, 0, -1};
  const int64_t full = ow / 4 * 8;  // the taps of a row in full vectors of 4 windows
  // (plane p, row oy) of output row r, stepped along instead of divided out per row
  for (int64_t r = r0, p = r0 / oh, oy = r0 % oh; r < r1; ++r, oy = oy + 1 == oh ? 0 : oy + 1, p += oy == 0) {
    const float* a = px + (p * h + 2 * oy) * w;
    const float* b = a + w;
    float* da = pdx + (p * h + 2 * oy) * w;
    float* db = da + w;
    const float* g = pdy + r * ow;
    for (int64_t j = 0; j < full; j += 8) {
      const PoolVec va = load(a + j), vb = load(b + j);
      PoolVec4 g4;
      std::memcpy(&g4, g + j / 2, sizeof g4);
      const PoolVec vg = __builtin_shufflevector(g4, g4, 0, 0, 1, 1, 2, 2, 3, 3);
      const PoolVec sa = __builtin_shufflevector(va, va, 1, 0, 3, 2, 5, 4, 7, 6);
      const PoolVec sb = __builtin_shufflevector(vb, vb, 1, 0, 3, 2, 5, 4, 7, 6);
      PoolVec m = pool_vmax(pool_vmax(va, sa), pool_vmax(vb, sb));  // in the scalar order on the even lanes
      m = __builtin_shufflevector(m, m, 0, 0, 2, 2, 4, 4, 6, 6);
      const PoolMask ea = va == m, eb = vb == m;
      const PoolMask eas = __builtin_shufflevector(ea, ea, 1, 0, 3, 2, 5, 4, 7, 6);
      const PoolMask ebs = __builtin_shufflevector(eb, eb, 1, 0, 3, 2, 5, 4, 7, 6);
      const PoolMask any_a = ea | eas;
      const PoolMask win_a = ea & ~(odd & eas);                      // a0 first; a1 if a0 is not the max
      const PoolMask win_b = ~any_a & ((eb & ~odd) | (odd & ~ebs));  // b0 if no a; b1 if no other tap
      store<float>(da + j, std::bit_cast<PoolVec>(std::bit_cast<PoolMask>(vg) & win_a));
      store<float>(db + j, std::bit_cast<PoolVec>(std::bit_cast<PoolMask>(vg) & win_b));
    }
    for (int64_t ox = full / 2; ox < ow; ++ox) pool2x2_max_bwd_window(a, b, g, ox, da, db);
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

template <class T>
void pool_fwd_t(PoolKind kind, const Tensor& x, const Window2d& k, Tensor& y) {
  const int64_t planes = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3), oh = y.dim(2), ow = y.dim(3);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  if (is_2x2(k)) {
    parallel_for(planes * oh, std::max<int64_t>(1, 8192 / w), [&](int64_t r0, int64_t r1) {
      if constexpr (std::is_same_v<T, float>)
        pool2x2_fwd_rows_f32(kind == PoolKind::max, px, h, w, oh, ow, py, r0, r1);
      else
        pool2x2_fwd_rows<T>(kind == PoolKind::max, px, h, w, oh, ow, py, r0, r1);
    });
    return;
  }
  const T inv_area = T(1) / static_cast<T>(k.kh * k.kw);  // count_include_pad=True, as PyTorch's default
  parallel_for(planes, std::max<int64_t>(1, 8192 / (h * w)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* src = px + p * h * w;
      T* dst = py + p * oh * ow;
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          const Taps t = taps(k, h, w, oy, ox);
          T acc = kind == PoolKind::max ? -std::numeric_limits<T>::infinity() : T(0);
          if (kind == PoolKind::max) {
            for (int64_t iy = t.y0; iy < t.y1; ++iy)
              for (int64_t ix = t.x0; ix < t.x1; ++ix) acc = std::max(acc, src[iy * w + ix]);
          } else {
            for (int64_t iy = t.y0; iy < t.y1; ++iy)
              for (int64_t ix = t.x0; ix < t.x1; ++ix) acc += src[iy * w + ix];
            acc *= inv_area;
          }
          dst[oy * ow + ox] = acc;
        }
    }
  });
}

template <class T>
void pool_bwd_t(PoolKind kind, const Tensor& x, const Tensor& dy, const Window2d& k, Tensor& dx) {
  const int64_t planes = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3), oh = dy.dim(2), ow = dy.dim(3);
  const T *px = x.data<T>(), *pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  if (is_2x2(k)) {  // every input belongs to at most one window: no accumulation
    parallel_for(planes * oh, std::max<int64_t>(1, 8192 / w), [&](int64_t r0, int64_t r1) {
      if constexpr (std::is_same_v<T, float>)
        pool2x2_bwd_rows_f32(kind == PoolKind::max, px, pdy, h, w, oh, ow, pdx, r0, r1);
      else
        pool2x2_bwd_rows<T>(kind == PoolKind::max, px, pdy, h, w, oh, ow, pdx, r0, r1);
    });
    return;
  }
  const T inv_area = T(1) / static_cast<T>(k.kh * k.kw);
  parallel_for(planes, std::max<int64_t>(1, 8192 / (h * w)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* src = px + p * h * w;
      const T* g = pdy + p * oh * ow;
      T* dst = pdx + p * h * w;
      std::fill(dst, dst + h * w, T(0));
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          const Taps t = taps(k, h, w, oy, ox);
          const T go = g[oy * ow + ox];
          if (kind == PoolKind::avg) {
            for (int64_t iy = t.y0; iy < t.y1; ++iy)
              for (int64_t ix = t.x0; ix < t.x1; ++ix) dst[iy * w + ix] += go * inv_area;
            continue;
          }
          // The gradient goes to the first maximum of the window, as PyTorch's does.
          int64_t best = t.y0 * w + t.x0;
          for (int64_t iy = t.y0; iy < t.y1; ++iy)
            for (int64_t ix = t.x0; ix < t.x1; ++ix)
              if (src[iy * w + ix] > src[best]) best = iy * w + ix;
          dst[best] += go;
        }
    }
  });
}

}  // namespace

void pool2d_forward(PoolKind kind, const Tensor& x, const Window2d& win, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) { pool_fwd_t<decltype(t)>(kind, x, win, y); });
}
void pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Window2d& win, Tensor& dx) {
  for_float_type(x.dtype(), [&](auto t) { pool_bwd_t<decltype(t)>(kind, x, dy, win, dx); });
}

}  // namespace gt::cpu
