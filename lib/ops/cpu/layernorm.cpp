// CPU layer normalisation (ops/layernorm.h): rows in parallel over ops/math.h's per-element math; the parameter
// gradients summed per column in row order.
#include "ops/layernorm.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/math.h"

#include <algorithm>
#include <cmath>

namespace gt::cpu {
namespace {

template <class T>
void ln_fwd_t(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
              Tensor& save_invstd, Tensor& y) {
  const int64_t d = gamma.numel(), rows = x.numel() / d;
  const T *px = x.data<T>(), *pg = gamma.data<T>(), *pb = beta.data<T>();
  T *py = y.data<T>(), *sm = save_mean.data<T>(), *si = save_invstd.data<T>();
  parallel_for(rows, std::max<int64_t>(1, 8192 / d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = px + r * d;
      double s = 0, s2 = 0;
      for (int64_t i = 0; i < d; ++i) s += row[i];
      const double mean = s / static_cast<double>(d);
      for (int64_t i = 0; i < d; ++i) s2 += (row[i] - mean) * (row[i] - mean);
      const double inv = 1.0 / std::sqrt(s2 / static_cast<double>(d) + eps);
      sm[r] = static_cast<T>(mean);
      si[r] = static_cast<T>(inv);
      for (int64_t i = 0; i < d; ++i) py[r * d + i] = layernorm_y<T>(row[i], mean, inv, pg[i], pb[i]);
    }
  });
}

template <class T>
void ln_bwd_t(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
              const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta_acc) {
  const int64_t d = gamma.numel(), rows = x.numel() / d;
  const T *px = x.data<T>(), *pg = gamma.data<T>(), *pdy = dy.data<T>();
  const T *sm = save_mean.data<T>(), *si = save_invstd.data<T>();
  if (dx.defined()) {
    T* pdx = dx.data<T>();
    parallel_for(rows, std::max<int64_t>(1, 8192 / d), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T *row = px + r * d, *g = pdy + r * d;
        const double mean = sm[r], inv = si[r];
        double a = 0, b = 0;  // Σ dx̂ and Σ dx̂·x̂ with dx̂ = dy·γ
        for (int64_t i = 0; i < d; ++i) {
          const double dxh = g[i] * pg[i];
          a += dxh;
          b += dxh * (row[i] - mean) * inv;
        }
        for (int64_t i = 0; i < d; ++i) pdx[r * d + i] = layernorm_dx<T>(row[i], g[i], pg[i], mean, inv, a, b, d);
      }
    });
  }
  // Parameter gradients: one column per output, summed over rows in order (deterministic).
  T *dg = dgamma.data<T>(), *db = dbeta.data<T>();
  parallel_for(d, std::max<int64_t>(1, 8192 / std::max<int64_t>(rows, 1)), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      double sg = 0, sb = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const double g = pdy[r * d + i];
        sg += g * (px[r * d + i] - sm[r]) * si[r];
        sb += g;
      }
      dg[i] = static_cast<T>(sg + (beta_acc != 0 ? beta_acc * dg[i] : 0.0));
      db[i] = static_cast<T>(sb + (beta_acc != 0 ? beta_acc * db[i] : 0.0));
    }
  });
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) { ln_fwd_t<decltype(t)>(x, gamma, beta, eps, save_mean, save_invstd, y); });
}
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta) {
  for_float_type(x.dtype(),
                 [&](auto t) { ln_bwd_t<decltype(t)>(x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta, beta); });
}

}  // namespace gt::cpu
