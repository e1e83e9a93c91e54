// CPU batch normalisation (ops/batchnorm.h), channels in parallel, plain and synchronised over the ranks.
#include "ops/batchnorm.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/vec_math.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace gt::cpu {
namespace {

// Channel c of a batch-norm forward from its statistics: the running statistics moved towards them (training;
// the running variance unbiased over `n` values, as PyTorch keeps it), the saved mean and inverse std, and y.
template <class T>
GT_INLINE void bn_normalize_channel(int64_t c, double mean, double var, double n, bool update_running, double momentum,
                          double eps, const T* px, const T* pg, const T* pb, int64_t batch, int64_t ch, int64_t sp,
                          T* rm, T* rv, T* sm, T* si, T* py) {
  if (update_running) {
    rm[c] = static_cast<T>((1 - momentum) * rm[c] + momentum * mean);
    rv[c] = static_cast<T>((1 - momentum) * rv[c] + momentum * var * n / std::max(n - 1, 1.0));
  }
  const double inv = 1.0 / std::sqrt(var + eps);
  sm[c] = static_cast<T>(mean);
  si[c] = static_cast<T>(inv);
  const T scale = static_cast<T>(pg[c] * inv), shift = static_cast<T>(pb[c] - mean * pg[c] * inv);
  for (int64_t b = 0; b < batch; ++b) {
    const T* row = px + (b * ch + c) * sp;
    T* out = py + (b * ch + c) * sp;
    for (int64_t i = 0; i < sp; ++i) out[i] = row[i] * scale + shift;
  }
}

// Σ f(i) for i < n as sixteen interleaved partial sums in T (side by side in vector registers instead of one chain of
// n dependent additions), combined in a fixed order so the result is the same on every run, returned in double.
template <class T, class F>
GT_INLINE double bn_lane_sum(int64_t n, F&& f) {
  T acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += f(i + k);
  for (int k = 0; i < n; ++i, ++k) acc[k] += f(i);
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return static_cast<double>(acc[0]);
}

// Channels [c0, c1) of the forward. x viewed as (B, C, S): channel c of sample b is the run x[(b·C + c)·S, +S). Row
// sums in T as lanes, rows combined in double; the variance from a second pass about the mean, which keeps it exact
// for data far from zero.
template <class T>
GT_INLINE void bn_fwd_channels(const T* px, const T* pg, const T* pb, int64_t batch, int64_t ch, int64_t sp,
                               double momentum, double eps, bool training, T* rm, T* rv, T* sm, T* si, T* py,
                               int64_t c0, int64_t c1) {
  const int64_t n = batch * sp;
  for (int64_t c = c0; c < c1; ++c) {
    double mean, var;
    if (training) {
      double s = 0, s2 = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const T* row = px + (b * ch + c) * sp;
        s += bn_lane_sum<T>(sp, [&](int64_t i) { return row[i]; });
      }
      mean = s / static_cast<double>(n);
      const T m = static_cast<T>(mean);
      for (int64_t b = 0; b < batch; ++b) {
        const T* row = px + (b * ch + c) * sp;
        s2 += bn_lane_sum<T>(sp, [&](int64_t i) { return (row[i] - m) * (row[i] - m); });
      }
      var = s2 / static_cast<double>(n);
    } else {
      mean = rm[c];
      var = rv[c];
    }
    bn_normalize_channel(c, mean, var, static_cast<double>(n), training, momentum, eps, px, pg, pb, batch, ch, sp, rm,
                         rv, sm, si, py);
  }
}

// Channels [c0, c1) of the backward: dγ, dβ and (when pdx) dx.
template <class T>
GT_INLINE void bn_bwd_channels(const T* px, const T* pg, const T* pdy, const T* sm, const T* si, int64_t batch,
                               int64_t ch, int64_t sp, bool training, double beta_acc, T* dg, T* db, T* pdx,
                               int64_t c0, int64_t c1) {
  const int64_t n = batch * sp;
  for (int64_t c = c0; c < c1; ++c) {
    const double mean = sm[c], inv = si[c];
    double sum_dy = 0, sum_dy_xhat = 0;
    const T m = static_cast<T>(mean), iv = static_cast<T>(inv);
    for (int64_t b = 0; b < batch; ++b) {
      const T *row = px + (b * ch + c) * sp, *g = pdy + (b * ch + c) * sp;
      sum_dy += bn_lane_sum<T>(sp, [&](int64_t i) { return g[i]; });
      sum_dy_xhat += bn_lane_sum<T>(sp, [&](int64_t i) { return g[i] * (row[i] - m); }) * inv;
    }
    dg[c] = static_cast<T>(sum_dy_xhat + (beta_acc != 0 ? beta_acc * dg[c] : 0.0));
    db[c] = static_cast<T>(sum_dy + (beta_acc != 0 ? beta_acc * db[c] : 0.0));
    if (!pdx) continue;
    const T k = static_cast<T>(pg[c] * inv), mean_dy = static_cast<T>(sum_dy / static_cast<double>(n)),
            mean_dyx = static_cast<T>(sum_dy_xhat / static_cast<double>(n));
    for (int64_t b = 0; b < batch; ++b) {
      const T *row = px + (b * ch + c) * sp, *g = pdy + (b * ch + c) * sp;
      T* out = pdx + (b * ch + c) * sp;
      if (training)  // dx = γ·invstd · (dy − mean(dy) − x̂·mean(dy·x̂))
        for (int64_t i = 0; i < sp; ++i) out[i] = k * (g[i] - mean_dy - (row[i] - m) * iv * mean_dyx);
      else  // evaluation: the statistics are constants
        for (int64_t i = 0; i < sp; ++i) out[i] = k * g[i];
    }
  }
}

GT_CPU_CLONES void bn_fwd_channels_f32(const float* px, const float* pg, const float* pb, int64_t batch, int64_t ch,
                                       int64_t sp, double momentum, double eps, bool training, float* rm, float* rv,
                                       float* sm, float* si, float* py, int64_t c0, int64_t c1) {
  bn_fwd_channels<float>(px, pg, pb, batch, ch, sp, momentum, eps, training, rm, rv, sm, si, py, c0, c1);
}
GT_CPU_CLONES void bn_bwd_channels_f32(const float* px, const float* pg, const float* pdy, const float* sm,
                                       const float* si, int64_t batch, int64_t ch, int64_t sp, bool training,
                                       double beta_acc, float* dg, float* db, float* pdx, int64_t c0, int64_t c1) {
  bn_bwd_channels<float>(px, pg, pdy, sm, si, batch, ch, sp, training, beta_acc, dg, db, pdx, c0, c1);
}

template <class T>
void bn_fwd_t(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean, Tensor& running_var,
              double momentum, double eps, bool training, Tensor& save_mean, Tensor& save_invstd, Tensor& y) {
  const int64_t batch = x.dim(0), ch = gamma.numel(), sp = x.numel() / (batch * ch);
  const T *px = x.data<T>(), *pg = gamma.data<T>(), *pb = beta.data<T>();
  T *py = y.data<T>(), *rm = running_mean.data<T>(), *rv = running_var.data<T>();
  T *sm = save_mean.data<T>(), *si = save_invstd.data<T>();
  parallel_for(ch, 1, [&](int64_t c0, int64_t c1) {
    if constexpr (std::is_same_v<T, float>)
      bn_fwd_channels_f32(px, pg, pb, batch, ch, sp, momentum, eps, training, rm, rv, sm, si, py, c0, c1);
    else
      bn_fwd_channels<T>(px, pg, pb, batch, ch, sp, momentum, eps, training, rm, rv, sm, si, py, c0, c1);
  });
}

template <class T>
void bn_bwd_t(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
              const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta_acc) {
  const int64_t batch = x.dim(0), ch = gamma.numel(), sp = x.numel() / (batch * ch);
  const T *px = x.data<T>(), *pg = gamma.data<T>(), *pdy = dy.data<T>();
  const T *sm = save_mean.data<T>(), *si = save_invstd.data<T>();
  T* pdx = dx.defined() ? dx.data<T>() : nullptr;
  T *dg = dgamma.data<T>(), *db = dbeta.data<T>();
  parallel_for(ch, 1, [&](int64_t c0, int64_t c1) {
    if constexpr (std::is_same_v<T, float>)
      bn_bwd_channels_f32(px, pg, pdy, sm, si, batch, ch, sp, training, beta_acc, dg, db, pdx, c0, c1);
    else
      bn_bwd_channels<T>(px, pg, pdy, sm, si, batch, ch, sp, training, beta_acc, dg, db, pdx, c0, c1);
  });
}

// Synchronised batch norm (dist.sync_batchnorm): the local sums first, one all-reduce, then the normalisation with
// the global statistics. Σx and Σx² in double: the variance E[x²] − E[x]² loses digits only when |mean| is many
// orders of magnitude above the spread, which activations are not.
template <class T>
int64_t bn_fwd_sync_t(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                      Tensor& running_var, double momentum, double eps, Tensor& save_mean, Tensor& save_invstd,
                      Tensor& y, const std::function<void(double*, size_t)>& sum_over_ranks) {
  const int64_t batch = x.dim(0), ch = gamma.numel(), sp = x.numel() / (batch * ch);
  const T *px = x.data<T>(), *pg = gamma.data<T>(), *pb = beta.data<T>();
  T *py = y.data<T>(), *rm = running_mean.data<T>(), *rv = running_var.data<T>();
  T *sm = save_mean.data<T>(), *si = save_invstd.data<T>();
  std::vector<double> sums(static_cast<size_t>(2 * ch + 1));  // Σx per channel, Σx² per channel, values per channel
  parallel_for(ch, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double s = 0, s2 = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const T* row = px + (b * ch + c) * sp;
        for (int64_t i = 0; i < sp; ++i) {
          const double v = row[i];
          s += v;
          s2 += v * v;
        }
      }
      sums[static_cast<size_t>(c)] = s;
      sums[static_cast<size_t>(ch + c)] = s2;
    }
  });
  sums[static_cast<size_t>(2 * ch)] = static_cast<double>(batch * sp);
  sum_over_ranks(sums.data(), sums.size());
  const double n = sums[static_cast<size_t>(2 * ch)];
  parallel_for(ch, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const double mean = sums[static_cast<size_t>(c)] / n;
      const double var = std::max(sums[static_cast<size_t>(ch + c)] / n - mean * mean, 0.0);
      bn_normalize_channel(c, mean, var, n, true, momentum, eps, px, pg, pb, batch, ch, sp, rm, rv, sm, si, py);
    }
  });
  return static_cast<int64_t>(n);
}

template <class T>
void bn_bwd_sync_t(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                   const Tensor& dy, int64_t global_count, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta_acc,
                   const std::function<void(double*, size_t)>& sum_over_ranks) {
  const int64_t batch = x.dim(0), ch = gamma.numel(), sp = x.numel() / (batch * ch);
  const T *px = x.data<T>(), *pg = gamma.data<T>(), *pdy = dy.data<T>();
  const T *sm = save_mean.data<T>(), *si = save_invstd.data<T>();
  T *dg = dgamma.data<T>(), *db = dbeta.data<T>();
  std::vector<double> sums(static_cast<size_t>(2 * ch));  // Σdy per channel, Σdy·x̂ per channel
  parallel_for(ch, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const double mean = sm[c], inv = si[c];
      double sum_dy = 0, sum_dy_xhat = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const T *row = px + (b * ch + c) * sp, *g = pdy + (b * ch + c) * sp;
        for (int64_t i = 0; i < sp; ++i) {
          sum_dy += g[i];
          sum_dy_xhat += g[i] * (row[i] - mean) * inv;
        }
      }
      dg[c] = static_cast<T>(sum_dy_xhat + (beta_acc != 0 ? beta_acc * dg[c] : 0.0));
      db[c] = static_cast<T>(sum_dy + (beta_acc != 0 ? beta_acc * db[c] : 0.0));
      sums[static_cast<size_t>(c)] = sum_dy;
      sums[static_cast<size_t>(ch + c)] = sum_dy_xhat;
    }
  });
  if (!dx.defined()) return;  // nothing below needs the global sums (the same on every rank: one model)
  sum_over_ranks(sums.data(), sums.size());
  T* pdx = dx.data<T>();
  const double n = static_cast<double>(global_count);
  parallel_for(ch, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      // dx = γ·invstd · (dy − mean(dy) − x̂·mean(dy·x̂)), the means over the global batch
      const T k = static_cast<T>(pg[c] * si[c]), mean_dy = static_cast<T>(sums[static_cast<size_t>(c)] / n),
              mean_dyx = static_cast<T>(sums[static_cast<size_t>(ch + c)] / n), m = sm[c], iv = si[c];
      for (int64_t b = 0; b < batch; ++b) {
        const T *row = px + (b * ch + c) * sp, *g = pdy + (b * ch + c) * sp;
        T* out = pdx + (b * ch + c) * sp;
        for (int64_t i = 0; i < sp; ++i) out[i] = k * (g[i] - mean_dy - (row[i] - m) * iv * mean_dyx);
      }
    }
  });
}

}  // namespace

void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) {
    bn_fwd_t<decltype(t)>(x, gamma, beta, running_mean, running_var, momentum, eps, training, save_mean, save_invstd,
                          y);
  });
}
void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta) {
  for_float_type(x.dtype(), [&](auto t) {
    bn_bwd_t<decltype(t)>(x, gamma, save_mean, save_invstd, dy, training, dx, dgamma, dbeta, beta);
  });
}
int64_t batchnorm_forward_sync(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                               Tensor& running_var, double momentum, double eps, Tensor& save_mean, Tensor& save_invstd,
                               Tensor& y, const std::function<void(double*, size_t)>& sum_over_ranks) {
  int64_t n = 0;
  for_float_type(x.dtype(), [&](auto t) {
    n = bn_fwd_sync_t<decltype(t)>(x, gamma, beta, running_mean, running_var, momentum, eps, save_mean, save_invstd, y,
                                   sum_over_ranks);
  });
  return n;
}
void batchnorm_backward_sync(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                             const Tensor& dy, int64_t global_count, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                             double beta, const std::function<void(double*, size_t)>& sum_over_ranks) {
  for_float_type(x.dtype(), [&](auto t) {
    bn_bwd_sync_t<decltype(t)>(x, gamma, save_mean, save_invstd, dy, global_count, dx, dgamma, dbeta, beta,
                               sum_over_ranks);
  });
}

}  // namespace gt::cpu
