// CPU softmax over rows (ops/softmax.h), rows in parallel.
#include "ops/softmax.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/math.h"

#include <algorithm>
#include <cmath>

namespace gt::cpu {
namespace {

template <class T>
void softmax_fwd_t(const Tensor& x, int64_t d, Tensor& y) {
  const int64_t rows = x.numel() / d;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  parallel_for(rows, std::max<int64_t>(1, 8192 / d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = px + r * d;
      T* out = py + r * d;
      const T mx = *std::max_element(row, row + d);
      double s = 0;
      for (int64_t i = 0; i < d; ++i) s += (out[i] = std::exp(row[i] - mx));
      const T inv = static_cast<T>(1.0 / s);
      for (int64_t i = 0; i < d; ++i) out[i] *= inv;
    }
  });
}

template <class T>
void softmax_bwd_t(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx) {
  const int64_t rows = y.numel() / d;
  const T *py = y.data<T>(), *pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  parallel_for(rows, std::max<int64_t>(1, 8192 / d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double dot = 0;
      for (int64_t i = 0; i < d; ++i) dot += py[r * d + i] * pdy[r * d + i];
      for (int64_t i = 0; i < d; ++i) pdx[r * d + i] = softmax_dx<T>(py[r * d + i], pdy[r * d + i], dot);
    }
  });
}

}  // namespace

void softmax_forward(const Tensor& x, int64_t d, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) { softmax_fwd_t<decltype(t)>(x, d, y); });
}
void softmax_backward(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx) {
  for_float_type(y.dtype(), [&](auto t) { softmax_bwd_t<decltype(t)>(y, dy, d, dx); });
}

}  // namespace gt::cpu
