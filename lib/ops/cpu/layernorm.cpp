// CPU layer normalisation (ops/layernorm.h): rows in parallel over ops/math.h's per-element math, row sums in double
// as eight interleaved partial sums; the parameter gradients summed per column in row order. The f32 loops are
// compiled per instruction set (GT_CPU_KERNEL in ops/cpu/vec_math.h).
#include "ops/layernorm.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/vec_math.h"
#include "ops/math.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace gt::cpu {
namespace {

// Rows [r0, r1) of the forward: each row's mean and 1/σ (saved), then y.
template <class T>
[[gnu::always_inline]] inline void ln_fwd_rows(const T* px, const T* pg, const T* pb, int64_t d, double eps, int64_t r0,
                                               int64_t r1, T* py, T* sm, T* si) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = px + r * d;
    const double mean = lane_sum(d, [&](int64_t i) { return static_cast<double>(row[i]); }) / static_cast<double>(d);
    const double s2 = lane_sum(d, [&](int64_t i) {
      const double c = row[i] - mean;
      return c * c;
    });
    const double inv = 1.0 / std::sqrt(s2 / static_cast<double>(d) + eps);
    sm[r] = static_cast<T>(mean);
    si[r] = static_cast<T>(inv);
    T* out = py + r * d;
    for (int64_t i = 0; i < d; ++i) out[i] = layernorm_y<T>(row[i], mean, inv, pg[i], pb[i]);
  }
}

// Rows [r0, r1) of dx.
template <class T>
[[gnu::always_inline]] inline void ln_dx_rows(const T* px, const T* pg, const T* pdy, const T* sm, const T* si,
                                              int64_t d, int64_t r0, int64_t r1, T* pdx) {
  for (int64_t r = r0; r < r1; ++r) {
    const T *row = px + r * d, *g = pdy + r * d;
    const double mean = sm[r], inv = si[r];
    // Σ dx̂ and Σ dx̂·x̂ with dx̂ = dy·γ
    const double a = lane_sum(d, [&](int64_t i) { return static_cast<double>(g[i] * pg[i]); });
    const double b = lane_sum(d, [&](int64_t i) { return static_cast<double>(g[i] * pg[i]) * (row[i] - mean) * inv; });
    T* out = pdx + r * d;
    for (int64_t i = 0; i < d; ++i) out[i] = layernorm_dx<T>(row[i], g[i], pg[i], mean, inv, a, b, d);
  }
}

// Columns [i0, i1) of dγ and dβ: each column summed over every row in row order (deterministic), the rows walked in
// memory order so the loads are contiguous and the column sums vectorise.
template <class T>
[[gnu::always_inline]] inline void ln_param_cols(const T* px, const T* pdy, const T* sm, const T* si, int64_t d,
                                                 int64_t rows, int64_t i0, int64_t i1, double beta_acc, T* dg, T* db) {
  const int64_t w = i1 - i0;
  std::vector<double> sg(static_cast<size_t>(w)), sb(static_cast<size_t>(w));
  for (int64_t r = 0; r < rows; ++r) {
    const T *xr = px + r * d + i0, *gr = pdy + r * d + i0;
    const T m = sm[r], s = si[r];
    for (int64_t i = 0; i < w; ++i) {
      const double g = gr[i];
      sg[i] += g * (xr[i] - m) * s;
      sb[i] += g;
    }
  }
  for (int64_t i = 0; i < w; ++i) {
    dg[i0 + i] = static_cast<T>(sg[i] + (beta_acc != 0 ? beta_acc * dg[i0 + i] : 0.0));
    db[i0 + i] = static_cast<T>(sb[i] + (beta_acc != 0 ? beta_acc * db[i0 + i] : 0.0));
  }
}

GT_CPU_KERNEL(ln_fwd_rows_f32,
              (const float* px, const float* pg, const float* pb, int64_t d, double eps, int64_t r0, int64_t r1,
               float* py, float* sm, float* si),
              (px, pg, pb, d, eps, r0, r1, py, sm, si), ln_fwd_rows<float>)
GT_CPU_KERNEL(ln_dx_rows_f32,
              (const float* px, const float* pg, const float* pdy, const float* sm, const float* si, int64_t d,
               int64_t r0, int64_t r1, float* pdx),
              (px, pg, pdy, sm, si, d, r0, r1, pdx), ln_dx_rows<float>)
GT_CPU_KERNEL(ln_param_cols_f32,
              (const float* px, const float* pdy, const float* sm, const float* si, int64_t d, int64_t rows, int64_t i0,
               int64_t i1, double beta_acc, float* dg, float* db),
              (px, pdy, sm, si, d, rows, i0, i1, beta_acc, dg, db), ln_param_cols<float>)

template <class T>
void ln_fwd_t(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
              Tensor& save_invstd, Tensor& y) {
  const int64_t d = gamma.numel(), rows = x.numel() / d;
  const T *px = x.data<T>(), *pg = gamma.data<T>(), *pb = beta.data<T>();
  T *py = y.data<T>(), *sm = save_mean.data<T>(), *si = save_invstd.data<T>();
  parallel_for(rows, std::max<int64_t>(1, 8192 / d), [&](int64_t r0, int64_t r1) {
    if constexpr (std::is_same_v<T, float>)
      ln_fwd_rows_f32(px, pg, pb, d, eps, r0, r1, py, sm, si);
    else
      ln_fwd_rows<T>(px, pg, pb, d, eps, r0, r1, py, sm, si);
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
      if constexpr (std::is_same_v<T, float>)
        ln_dx_rows_f32(px, pg, pdy, sm, si, d, r0, r1, pdx);
      else
        ln_dx_rows<T>(px, pg, pdy, sm, si, d, r0, r1, pdx);
    });
  }
  T *dg = dgamma.data<T>(), *db = dbeta.data<T>();
  parallel_for(d, std::max<int64_t>(1, 8192 / std::max<int64_t>(rows, 1)), [&](int64_t i0, int64_t i1) {
    if constexpr (std::is_same_v<T, float>)
      ln_param_cols_f32(px, pdy, sm, si, d, rows, i0, i1, beta_acc, dg, db);
    else
      ln_param_cols<T>(px, pdy, sm, si, d, rows, i0, i1, beta_acc, dg, db);
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
