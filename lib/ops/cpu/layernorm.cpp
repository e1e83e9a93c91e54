// CPU layer normalisation (ops/layernorm.h): rows in parallel, row sums in double as eight interleaved partial sums;
// the parameter gradients summed per column in row order. f64 runs ops/math.h's per-element math; f32 its own
// vector loops (per-element arithmetic in f32, below), compiled per instruction set (GT_CPU_KERNEL in
// ops/cpu/vec_math.h).
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

// The f32 rows on vectors: 64-byte vectors of f32 for the element-wise passes, of f64 for the sums.
//
// The sums are lane_sum's (eight interleaved partial sums in double, element i in lane i mod 8, combined in the same
// tree), so the saved mean and 1/σ are the f64 formula's; only the per-element arithmetic is f32: the plain loops
// ran it in double, one conversion each way per element and half the lanes (the forward 2.3 cycles an element, the
// largest of a GPT step's non-GEMM costs after attention and GELU). The row's mean enters as two floats whose sum is
// the double (m_hi + m_lo: x − m_hi is exact where they are close, then m_lo), so x̂ keeps the f64 formula's
// accuracy where x sits far from zero relative to its spread; y and dx come out within a few ulp of the f64
// formula rounded once (tests/test_ops.cpp's f32-against-f64 case holds them to 1e-6 and 1e-5, the CUDA test's
// tolerances against this kernel).
using VF = Vec64<float>;
using VD = Vec64<double>;
constexpr int kFl = kLanes64<float>, kDl = kLanes64<double>;

GT_INLINE double lanes_total(VD acc) {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
// The widened lanes [8h, 8h + 8) of a vector of f32.
GT_INLINE VD f64_lanes(VF v, int h) {
  VecN<float, 32> half;
  __builtin_memcpy(&half, reinterpret_cast<const float*>(&v) + h * kDl, sizeof half);
  return __builtin_convertvector(half, VD);
}
// lane_sum(d, f) for f(i) = g(x[i]) with g on doubles, on vectors: the same partial sums in the same order.
template <class G>
GT_INLINE double lane_sum_vec(const float* x, int64_t d, G&& g) {
  VD acc{};
  int64_t i = 0;
  for (; i + kDl <= d; i += kDl) {
    VecN<float, 32> v;
    __builtin_memcpy(&v, x + i, sizeof v);
    acc += g(__builtin_convertvector(v, VD));
  }
  for (int k = 0; i < d; ++i, ++k) acc[k] += g(VD{} + static_cast<double>(x[i]))[0];
  return lanes_total(acc);
}

GT_INLINE void ln_fwd_rows_vec(const float* px, const float* pg, const float* pb, int64_t d, double eps, int64_t r0,
                               int64_t r1, float* py, float* sm, float* si) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = px + r * d;
    const double mean = lane_sum_vec(row, d, [](VD v) { return v; }) / static_cast<double>(d);
    const double s2 = lane_sum_vec(row, d, [&](VD v) {
      const VD c = v - mean;
      return c * c;
    });
    const double inv = 1.0 / std::sqrt(s2 / static_cast<double>(d) + eps);
    sm[r] = static_cast<float>(mean);
    si[r] = static_cast<float>(inv);
    const float m_hi = static_cast<float>(mean), m_lo = static_cast<float>(mean - m_hi), fi = static_cast<float>(inv);
    float* out = py + r * d;
    int64_t i = 0;
    for (; i + kFl <= d; i += kFl)
      store<float>(out + i, ((load64(row + i) - m_hi) - m_lo) * fi * load64(pg + i) + load64(pb + i));
    for (; i < d; ++i) out[i] = ((row[i] - m_hi) - m_lo) * fi * pg[i] + pb[i];
  }
}

GT_INLINE void ln_dx_rows_vec(const float* px, const float* pg, const float* pdy, const float* sm, const float* si,
                              int64_t d, int64_t r0, int64_t r1, float* pdx) {
  for (int64_t r = r0; r < r1; ++r) {
    const float *row = px + r * d, *g = pdy + r * d;
    const float m = sm[r], fi = si[r];
    const double mean = m, inv = fi;
    // Σ dx̂ and Σ dx̂·x̂ with dx̂ = dy·γ (an f32 product, as the plain loop's), in lane_sum's order
    VD sa{}, sb{};
    int64_t i = 0;
    for (; i + kFl <= d; i += kFl) {
      const VF gg = load64(g + i) * load64(pg + i), x = load64(row + i);
      for (int h = 0; h < 2; ++h) {
        const VD gd = f64_lanes(gg, h);
        sa += gd;
        sb += gd * (f64_lanes(x, h) - mean) * inv;
      }
    }
    for (int k = 0; i < d; ++i, k = (k + 1) % kDl) {
      const double gd = g[i] * pg[i];
      sa[k] += gd;
      sb[k] += gd * (row[i] - mean) * inv;
    }
    const float a = static_cast<float>(lanes_total(sa) / static_cast<double>(d)),
                b = static_cast<float>(lanes_total(sb) / static_cast<double>(d));
    float* out = pdx + r * d;
    i = 0;
    for (; i + kFl <= d; i += kFl) {
      const VF xh = (load64(row + i) - m) * fi;
      store<float>(out + i, fi * (load64(g + i) * load64(pg + i) - a - xh * b));
    }
    for (; i < d; ++i) out[i] = fi * (g[i] * pg[i] - a - (row[i] - m) * fi * b);
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
              (px, pg, pb, d, eps, r0, r1, py, sm, si), ln_fwd_rows_vec)
GT_CPU_KERNEL(ln_dx_rows_f32,
              (const float* px, const float* pg, const float* pdy, const float* sm, const float* si, int64_t d,
               int64_t r0, int64_t r1, float* pdx),
              (px, pg, pdy, sm, si, d, r0, r1, pdx), ln_dx_rows_vec)
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
