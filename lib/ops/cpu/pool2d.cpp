// CPU 2-D max and average pooling (ops/pool2d.h), planes in parallel; the common 2×2 window has its own loop.
#include "ops/pool2d.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"

#include <algorithm>
#include <limits>

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

template <class T>
void pool_fwd_t(PoolKind kind, const Tensor& x, const Window2d& k, Tensor& y) {
  const int64_t planes = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3), oh = y.dim(2), ow = y.dim(3);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  if (is_2x2(k)) {
    parallel_for(planes * oh, std::max<int64_t>(1, 8192 / w), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t p = r / oh, oy = r % oh;
        const T* a = px + (p * h + 2 * oy) * w;
        const T* b = a + w;
        T* dst = py + r * ow;
        for (int64_t ox = 0; ox < ow; ++ox) {
          const T a0 = a[2 * ox], a1 = a[2 * ox + 1], b0 = b[2 * ox], b1 = b[2 * ox + 1];
          dst[ox] =
              kind == PoolKind::max ? std::max(std::max(a0, a1), std::max(b0, b1)) : (a0 + a1 + b0 + b1) * T(0.25);
        }
      }
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
  if (is_2x2(k) && h % 2 == 0 && w % 2 == 0) {  // every input belongs to exactly one window: no zero fill needed
    parallel_for(planes * oh, std::max<int64_t>(1, 8192 / w), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t p = r / oh, oy = r % oh;
        const T* a = px + (p * h + 2 * oy) * w;
        const T* b = a + w;
        T* da = pdx + (p * h + 2 * oy) * w;
        T* db = da + w;
        const T* g = pdy + r * ow;
        for (int64_t ox = 0; ox < ow; ++ox) {
          const int64_t i = 2 * ox;
          if (kind == PoolKind::avg) {
            const T v = g[ox] * T(0.25);
            da[i] = da[i + 1] = db[i] = db[i + 1] = v;
            continue;
          }
          // The first maximum in reading order takes the gradient.
          const T m = std::max(std::max(a[i], a[i + 1]), std::max(b[i], b[i + 1]));
          const int which = a[i] == m ? 0 : a[i + 1] == m ? 1 : b[i] == m ? 2 : 3;
          da[i] = which == 0 ? g[ox] : T(0);
          da[i + 1] = which == 1 ? g[ox] : T(0);
          db[i] = which == 2 ? g[ox] : T(0);
          db[i + 1] = which == 3 ? g[ox] : T(0);
        }
      }
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
