// CPU 2-D max and average pooling (ops/pool2d.h), planes in parallel; the common 2×2 window has its own loop.
#include "ops/pool2d.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/pool2x2.h"
#include "ops/cpu/vec_math.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

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
        pool2x2_bwd_rows_f32(kind == PoolKind::max, px, pdy + r0 * ow, h, w, oh, ow, pdx, r0, r1);
      else
        pool2x2_bwd_rows<T>(kind == PoolKind::max, px, pdy + r0 * ow, h, w, oh, ow, pdx, r0, r1);
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

// max_pool_relu_*: output rows in blocks of about kChainBlock values, so that the relu (forward) or its gradient
// (backward) is made right before or after the pool reads or writes them, in cache.
constexpr int64_t kChainBlock = 4096;

template <class T>
void max_pool_relu_fwd_t(const Tensor& x, Tensor& y) {
  const int64_t planes = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3), oh = y.dim(2), ow = y.dim(3);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const int64_t block = std::max<int64_t>(1, kChainBlock / ow);
  parallel_for(planes * oh, std::max<int64_t>(1, 8192 / w), [&](int64_t r0, int64_t r1) {
    for (int64_t b0 = r0; b0 < r1; b0 += block) {
      const int64_t b1 = std::min(r1, b0 + block);
      if constexpr (std::is_same_v<T, float>) {
        pool2x2_fwd_rows_f32(true, px, h, w, oh, ow, py, b0, b1);
        chain_relu_fwd_f32(py + b0 * ow, py + b0 * ow, (b1 - b0) * ow);
      } else {
        pool2x2_fwd_rows<T>(true, px, h, w, oh, ow, py, b0, b1);
        chain_relu_fwd<T>(py + b0 * ow, py + b0 * ow, (b1 - b0) * ow);
      }
    }
  });
}

// relu's gradient of a block of output rows from y = relu(m) instead of m, the pool's output: y > 0 exactly where
// m > 0 (NaN in neither), which is all relu's backward reads.
template <class T>
void max_pool_relu_bwd_t(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const int64_t planes = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3), oh = y.dim(2), ow = y.dim(3);
  const T *px = x.data<T>(), *py = y.data<T>(), *pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  const int64_t block = std::max<int64_t>(1, kChainBlock / ow);
  parallel_for(planes * oh, std::max<int64_t>(1, 8192 / w), [&](int64_t r0, int64_t r1) {
    std::vector<T> g(static_cast<size_t>(std::min(block, r1 - r0) * ow));
    for (int64_t b0 = r0; b0 < r1; b0 += block) {
      const int64_t b1 = std::min(r1, b0 + block);
      if constexpr (std::is_same_v<T, float>) {
        chain_relu_bwd_f32(py + b0 * ow, pdy + b0 * ow, g.data(), (b1 - b0) * ow);
        pool2x2_bwd_rows_f32(true, px, g.data(), h, w, oh, ow, pdx, b0, b1);
      } else {
        chain_relu_bwd<T>(py + b0 * ow, pdy + b0 * ow, g.data(), (b1 - b0) * ow);
        pool2x2_bwd_rows<T>(true, px, g.data(), h, w, oh, ow, pdx, b0, b1);
      }
    }
  });
}

}  // namespace

void max_pool_relu_forward(const Tensor& x, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) { max_pool_relu_fwd_t<decltype(t)>(x, y); });
}
void max_pool_relu_backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  for_float_type(x.dtype(), [&](auto t) { max_pool_relu_bwd_t<decltype(t)>(x, y, dy, dx); });
}

void pool2d_forward(PoolKind kind, const Tensor& x, const Window2d& win, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) { pool_fwd_t<decltype(t)>(kind, x, win, y); });
}
void pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Window2d& win, Tensor& dx) {
  for_float_type(x.dtype(), [&](auto t) { pool_bwd_t<decltype(t)>(kind, x, dy, win, dx); });
}

}  // namespace gt::cpu
