// CPU batch normalisation (ops/batchnorm.h), plain (rows in memory order) and synchronised over the ranks (channels in
// parallel).
#include "ops/batchnorm.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/pool2x2.h"
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
                                    double eps, const T* px, const T* pg, const T* pb, int64_t batch, int64_t ch,
                                    int64_t sp, T* rm, T* rv, T* sm, T* si, T* py) {
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

// lane_sum16 (ops/cpu/vec_math.h) in double.
template <class T, class F>
GT_INLINE double bn_lane_sum(int64_t n, F&& f) {
  return static_cast<double>(lane_sum16<T>(n, f));
}

// x viewed as (B, C, S): channel c of sample b is the row x[(b·C + c)·S, +S). The plain (unsynchronised) kernels
// walk the rows in memory order, the batch cut into kBnChunks fixed chunks whose per-channel partial sums are added
// in chunk order: the same bits for any thread count. Training statistics come from one pass of sums about a shift
// K_c, the channel's first value: var = E[(x − K)²] − E[x − K]², exact enough for data far from zero because K is one
// of the channel's own values.
constexpr int64_t kBnChunks = 8;

// Rows of samples [b0, b1): per-channel Σ(x − K) into s1 and Σ(x − K)² into s2 (doubles, added to).
template <class T>
GT_INLINE void bn_shifted_sums(const T* px, int64_t ch, int64_t sp, const T* k, int64_t b0, int64_t b1, double* s1,
                               double* s2) {
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t c = 0; c < ch; ++c) {
      const T* row = px + (b * ch + c) * sp;
      const T kc = k[c];
      s1[c] += bn_lane_sum<T>(sp, [&](int64_t i) { return row[i] - kc; });
      s2[c] += bn_lane_sum<T>(sp, [&](int64_t i) { return (row[i] - kc) * (row[i] - kc); });
    }
}

// Rows of samples [b0, b1): per-channel Σdy into s1 and Σdy·(x − mean) into s2 (added to).
template <class T>
GT_INLINE void bn_grad_sums(const T* px, const T* pdy, int64_t ch, int64_t sp, const T* sm, int64_t b0, int64_t b1,
                            double* s1, double* s2) {
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t c = 0; c < ch; ++c) {
      const T *row = px + (b * ch + c) * sp, *g = pdy + (b * ch + c) * sp;
      const T m = sm[c];
      s1[c] += bn_lane_sum<T>(sp, [&](int64_t i) { return g[i]; });
      s2[c] += bn_lane_sum<T>(sp, [&](int64_t i) { return g[i] * (row[i] - m); });
    }
}

// Rows [r0, r1) of y = x·scale_c + shift_c.
template <class T>
GT_INLINE void bn_scale_rows(const T* px, const T* scale, const T* shift, int64_t ch, int64_t sp, int64_t r0,
                             int64_t r1, T* py) {
  for (int64_t r = r0; r < r1; ++r) {
    const T a = scale[r % ch], b = shift[r % ch];
    const T* row = px + r * sp;
    T* out = py + r * sp;
    for (int64_t i = 0; i < sp; ++i) out[i] = row[i] * a + b;
  }
}

// Rows [r0, r1) of dx (which may be dy: a fused chain's dz is turned into dx in place): training dx = k·(dy − mean(dy)
// − (x − mean)·invstd·mean(dy·x̂)), evaluation dx = k·dy, with k = γ·invstd; per channel the coefficients k, mean(dy),
// mean, invstd·mean(dy·x̂) (the last two unused in evaluation).
template <class T>
GT_INLINE void bn_dx_rows(const T* px, const T* pdy, const T* coef, int64_t ch, int64_t sp, bool training, int64_t r0,
                          int64_t r1, T* pdx) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* q = coef + 4 * (r % ch);
    const T k = q[0], mean_dy = q[1], m = q[2], ivx = q[3];
    const T *row = px + r * sp, *g = pdy + r * sp;
    T* out = pdx + r * sp;
    if (training) {
      GT_SIMD for (int64_t i = 0; i < sp; ++i) out[i] = k * (g[i] - mean_dy - (row[i] - m) * ivx);
    } else {
      GT_SIMD for (int64_t i = 0; i < sp; ++i) out[i] = k * g[i];
    }
  }
}

GT_CPU_KERNEL(bn_shifted_sums_f32,
              (const float* px, int64_t ch, int64_t sp, const float* k, int64_t b0, int64_t b1, double* s1, double* s2),
              (px, ch, sp, k, b0, b1, s1, s2), bn_shifted_sums<float>)
GT_CPU_KERNEL(bn_grad_sums_f32,
              (const float* px, const float* pdy, int64_t ch, int64_t sp, const float* sm, int64_t b0, int64_t b1,
               double* s1, double* s2),
              (px, pdy, ch, sp, sm, b0, b1, s1, s2), bn_grad_sums<float>)
GT_CPU_KERNEL(bn_scale_rows_f32,
              (const float* px, const float* scale, const float* shift, int64_t ch, int64_t sp, int64_t r0, int64_t r1,
               float* py),
              (px, scale, shift, ch, sp, r0, r1, py), bn_scale_rows<float>)
GT_CPU_KERNEL(bn_dx_rows_f32,
              (const float* px, const float* pdy, const float* coef, int64_t ch, int64_t sp, bool training, int64_t r0,
               int64_t r1, float* pdx),
              (px, pdy, coef, ch, sp, training, r0, r1, pdx), bn_dx_rows<float>)

// Per-channel sums over the batch: sums(b0, b1, s1, s2) adds samples [b0, b1)'s to s1 and s2 (ch doubles each); it
// runs on kBnChunks fixed chunks in parallel, whose partials are added in chunk order into s1 and s2.
template <class F>
void bn_chunked_sums(int64_t batch, int64_t ch, F&& sums, std::vector<double>& s1, std::vector<double>& s2) {
  const int64_t chunks = std::min(batch, kBnChunks);
  std::vector<double> p1(static_cast<size_t>(chunks * ch)), p2(static_cast<size_t>(chunks * ch));
  parallel_for(chunks, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j)
      sums(batch * j / chunks, batch * (j + 1) / chunks, p1.data() + j * ch, p2.data() + j * ch);
  });
  s1.assign(static_cast<size_t>(ch), 0.0);
  s2.assign(static_cast<size_t>(ch), 0.0);
  for (int64_t j = 0; j < chunks; ++j)
    for (int64_t c = 0; c < ch; ++c) {
      s1[static_cast<size_t>(c)] += p1[static_cast<size_t>(j * ch + c)];
      s2[static_cast<size_t>(c)] += p2[static_cast<size_t>(j * ch + c)];
    }
}

// The per-channel affine map of a batch-norm forward, y = x·scale + shift, from the batch's statistics (training,
// moving the running ones towards them) or the running ones (evaluation); save_mean and save_invstd keep what the
// backward pass needs.
template <class T>
void bn_affine(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean, Tensor& running_var,
               double momentum, double eps, bool training, Tensor& save_mean, Tensor& save_invstd, T* scale, T* shift) {
  const int64_t batch = x.dim(0), ch = gamma.numel(), sp = x.numel() / (batch * ch);
  const T *px = x.data<T>(), *pg = gamma.data<T>(), *pb = beta.data<T>();
  T *rm = running_mean.data<T>(), *rv = running_var.data<T>();
  T *sm = save_mean.data<T>(), *si = save_invstd.data<T>();
  const double n = static_cast<double>(batch * sp);
  std::vector<double> mean(static_cast<size_t>(ch)), var(static_cast<size_t>(ch));
  if (training) {
    std::vector<T> k(static_cast<size_t>(ch));  // K_c: channel c's first value
    for (int64_t c = 0; c < ch; ++c) k[static_cast<size_t>(c)] = px[c * sp];
    std::vector<double> s1, s2;
    bn_chunked_sums(
        batch, ch,
        [&](int64_t b0, int64_t b1, double* q1, double* q2) {
          if constexpr (std::is_same_v<T, float>)
            bn_shifted_sums_f32(px, ch, sp, k.data(), b0, b1, q1, q2);
          else
            bn_shifted_sums<T>(px, ch, sp, k.data(), b0, b1, q1, q2);
        },
        s1, s2);
    for (int64_t c = 0; c < ch; ++c) {
      const double d = s1[static_cast<size_t>(c)] / n;
      mean[static_cast<size_t>(c)] = static_cast<double>(k[static_cast<size_t>(c)]) + d;
      var[static_cast<size_t>(c)] = std::max(s2[static_cast<size_t>(c)] / n - d * d, 0.0);
    }
  } else {
    for (int64_t c = 0; c < ch; ++c) {
      mean[static_cast<size_t>(c)] = rm[c];
      var[static_cast<size_t>(c)] = rv[c];
    }
  }
  for (int64_t c = 0; c < ch; ++c) {
    const double mu = mean[static_cast<size_t>(c)], v = var[static_cast<size_t>(c)];
    if (training) {  // the running variance unbiased over n values, as PyTorch keeps it
      rm[c] = static_cast<T>((1 - momentum) * rm[c] + momentum * mu);
      rv[c] = static_cast<T>((1 - momentum) * rv[c] + momentum * v * n / std::max(n - 1, 1.0));
    }
    const double inv = 1.0 / std::sqrt(v + eps);
    sm[c] = static_cast<T>(mu);
    si[c] = static_cast<T>(inv);
    scale[c] = static_cast<T>(pg[c] * inv);
    shift[c] = static_cast<T>(pb[c] - mu * pg[c] * inv);
  }
}

// Rows [r0, r1) of y = x·scale_c + shift_c (bn_scale_rows, on f32 compiled per instruction set).
template <class T>
void bn_scale(const T* px, const T* scale, const T* shift, int64_t ch, int64_t sp, int64_t r0, int64_t r1, T* py) {
  if constexpr (std::is_same_v<T, float>)
    bn_scale_rows_f32(px, scale, shift, ch, sp, r0, r1, py);
  else
    bn_scale_rows<T>(px, scale, shift, ch, sp, r0, r1, py);
}

template <class T>
void bn_fwd_t(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean, Tensor& running_var,
              double momentum, double eps, bool training, Tensor& save_mean, Tensor& save_invstd, Tensor& y) {
  const int64_t batch = x.dim(0), ch = gamma.numel(), sp = x.numel() / (batch * ch);
  std::vector<T> scale(static_cast<size_t>(ch)), shift(static_cast<size_t>(ch));
  bn_affine<T>(x, gamma, beta, running_mean, running_var, momentum, eps, training, save_mean, save_invstd, scale.data(),
               shift.data());
  const T* px = x.data<T>();
  T* py = y.data<T>();
  parallel_for(batch * ch, std::max<int64_t>(1, kGrain / std::max<int64_t>(sp, 1)),
               [&](int64_t r0, int64_t r1) { bn_scale<T>(px, scale.data(), shift.data(), ch, sp, r0, r1, py); });
}

// Per channel, from Σdy (s1) and Σdy·(x − mean) (s2) over n values: dgamma and dbeta (plus beta_acc times what they
// hold), and bn_dx_rows' four coefficients.
template <class T>
void bn_grad_coefficients(int64_t ch, double n, const std::vector<double>& s1, const std::vector<double>& s2,
                          const T* pg, const T* sm, const T* si, double beta_acc, T* dg, T* db, T* coef) {
  for (int64_t c = 0; c < ch; ++c) {
    const double sum_dy = s1[static_cast<size_t>(c)], sum_dy_xhat = s2[static_cast<size_t>(c)] * si[c];
    dg[c] = static_cast<T>(sum_dy_xhat + (beta_acc != 0 ? beta_acc * dg[c] : 0.0));
    db[c] = static_cast<T>(sum_dy + (beta_acc != 0 ? beta_acc * db[c] : 0.0));
    T* q = coef + 4 * c;
    q[0] = static_cast<T>(pg[c] * si[c]);
    q[1] = static_cast<T>(sum_dy / n);
    q[2] = sm[c];
    q[3] = static_cast<T>(si[c] * (sum_dy_xhat / n));
  }
}

// bn_grad_sums and bn_dx_rows, on f32 compiled per instruction set.
template <class T>
void bn_sums(const T* px, const T* pdy, int64_t ch, int64_t sp, const T* sm, int64_t b0, int64_t b1, double* s1,
             double* s2) {
  if constexpr (std::is_same_v<T, float>)
    bn_grad_sums_f32(px, pdy, ch, sp, sm, b0, b1, s1, s2);
  else
    bn_grad_sums<T>(px, pdy, ch, sp, sm, b0, b1, s1, s2);
}
template <class T>
void bn_dx(const T* px, const T* pdy, const T* coef, int64_t ch, int64_t sp, bool training, int64_t r0, int64_t r1,
           T* pdx) {
  if constexpr (std::is_same_v<T, float>)
    bn_dx_rows_f32(px, pdy, coef, ch, sp, training, r0, r1, pdx);
  else
    bn_dx_rows<T>(px, pdy, coef, ch, sp, training, r0, r1, pdx);
}

template <class T>
void bn_bwd_t(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
              const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta_acc) {
  const int64_t batch = x.dim(0), ch = gamma.numel(), sp = x.numel() / (batch * ch);
  const T *px = x.data<T>(), *pdy = dy.data<T>(), *sm = save_mean.data<T>();
  std::vector<double> s1, s2;
  bn_chunked_sums(
      batch, ch,
      [&](int64_t b0, int64_t b1, double* q1, double* q2) { bn_sums<T>(px, pdy, ch, sp, sm, b0, b1, q1, q2); }, s1, s2);
  std::vector<T> coef(static_cast<size_t>(4 * ch));
  bn_grad_coefficients<T>(ch, static_cast<double>(batch * sp), s1, s2, gamma.data<T>(), sm, save_invstd.data<T>(),
                          beta_acc, dgamma.data<T>(), dbeta.data<T>(), coef.data());
  if (!dx.defined()) return;
  T* pdx = dx.data<T>();
  parallel_for(batch * ch, std::max<int64_t>(1, kGrain / std::max<int64_t>(sp, 1)),
               [&](int64_t r0, int64_t r1) { bn_dx<T>(px, pdy, coef.data(), ch, sp, training, r0, r1, pdx); });
}

// Batch norm with an epilogue (a 2×2 max pool, relu, or both): one sample at a time, its normalised values z (C·S)
// live in a scratch that stays in cache. The forward writes the epilogue's output; the backward makes z again from
// x and the saved affine map (the same expression, so the same bits), then dz, z's gradient, from the epilogue's
// output and gradient, through the same row loops the separate layers run; the per-channel sums and dx then read
// that dz as batchnorm_backward reads its dy. Every value is the unfused chain's, bit for bit.
template <class T>
struct BnEpilogue {
  const T *px, *scale, *shift;
  int64_t ch, sp, h, w, oh, ow;
  ops::Epilogue ep;
  int64_t out_per_sample() const { return ep.max_pool_2x2 ? ch * oh * ow : ch * sp; }

  // Sample b's output at yb (z: C·S of scratch).
  void forward(int64_t b, T* z, T* yb) const {
    const T* xb = px + b * ch * sp;
    if (ep.max_pool_2x2) {
      bn_scale<T>(xb, scale, shift, ch, sp, 0, ch, z);
      if constexpr (std::is_same_v<T, float>)
        pool2x2_fwd_rows_f32(true, z, h, w, oh, ow, yb, 0, ch * oh);
      else
        pool2x2_fwd_rows<T>(true, z, h, w, oh, ow, yb, 0, ch * oh);
    } else {
      bn_scale<T>(xb, scale, shift, ch, sp, 0, ch, yb);
    }
    if (ep.relu) relu_fwd(yb, out_per_sample());
  }
  // Sample b's dz (C·S) from its output yb and gradient dyb (z: C·S and g: out_per_sample() of scratch). Relu's
  // gradient after a pool is taken from the pool's output through relu, yb: positive exactly where the pool's is.
  void dz(int64_t b, const T* yb, const T* dyb, T* z, T* g, T* dz) const {
    bn_scale<T>(px + b * ch * sp, scale, shift, ch, sp, 0, ch, z);
    if (!ep.max_pool_2x2) {
      relu_bwd(z, dyb, dz, ch * sp);
      return;
    }
    const T* gp = dyb;
    if (ep.relu) {
      relu_bwd(yb, dyb, g, out_per_sample());
      gp = g;
    }
    if constexpr (std::is_same_v<T, float>)
      pool2x2_bwd_rows_f32(true, z, gp, h, w, oh, ow, dz, 0, ch * oh);
    else
      pool2x2_bwd_rows<T>(true, z, gp, h, w, oh, ow, dz, 0, ch * oh);
  }
  static void relu_fwd(T* y, int64_t n) {
    if constexpr (std::is_same_v<T, float>)
      chain_relu_fwd_f32(y, y, n);
    else
      chain_relu_fwd<T>(y, y, n);
  }
  static void relu_bwd(const T* x, const T* dy, T* dx, int64_t n) {
    if constexpr (std::is_same_v<T, float>)
      chain_relu_bwd_f32(x, dy, dx, n);
    else
      chain_relu_bwd<T>(x, dy, dx, n);
  }
};

template <class T>
BnEpilogue<T> bn_epilogue(const Tensor& x, int64_t ch, const T* scale, const T* shift, const ops::Epilogue& ep) {
  const int64_t batch = x.dim(0), sp = x.numel() / (batch * ch);
  const int64_t h = ep.max_pool_2x2 ? x.dim(2) : sp, w = ep.max_pool_2x2 ? x.dim(3) : 1;
  return {x.data<T>(), scale, shift, ch, sp, h, w, h / 2, w / 2, ep};
}

template <class T>
void bn_epilogue_fwd_t(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& save_scale, Tensor& save_shift, const ops::Epilogue& ep,
                       Tensor& y) {
  const int64_t batch = x.dim(0), ch = gamma.numel();
  T *scale = save_scale.data<T>(), *shift = save_shift.data<T>();
  bn_affine<T>(x, gamma, beta, running_mean, running_var, momentum, eps, training, save_mean, save_invstd, scale,
               shift);
  const BnEpilogue<T> chain = bn_epilogue<T>(x, ch, scale, shift, ep);
  T* py = y.data<T>();
  parallel_for(batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<T> z(static_cast<size_t>(ep.max_pool_2x2 ? ch * chain.sp : 0));
    for (int64_t b = b0; b < b1; ++b) chain.forward(b, z.data(), py + b * chain.out_per_sample());
  });
}

template <class T>
void bn_epilogue_bwd_t(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                       const Tensor& save_scale, const Tensor& save_shift, const ops::Epilogue& ep, const Tensor& y,
                       const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta_acc) {
  const int64_t batch = x.dim(0), ch = gamma.numel();
  const BnEpilogue<T> chain = bn_epilogue<T>(x, ch, save_scale.data<T>(), save_shift.data<T>(), ep);
  const int64_t sp = chain.sp, out = chain.out_per_sample();
  const T *px = x.data<T>(), *py = y.data<T>(), *pdy = dy.data<T>(), *sm = save_mean.data<T>();
  // Scratch for one sample: z, dz (when there is no dx to hold it) and relu's gradient before a pool.
  struct Scratch {
    std::vector<T> z, dz, g;
  };
  auto scratch = [&] {
    return Scratch{std::vector<T>(static_cast<size_t>(ch * sp)),
                   std::vector<T>(static_cast<size_t>(dx.defined() ? 0 : ch * sp)),
                   std::vector<T>(static_cast<size_t>(ep.max_pool_2x2 && ep.relu ? out : 0))};
  };
  // dz goes to dx's buffer (when dx is wanted) for the second pass, which turns it into dx in place: computing it
  // again there would run the pool's backward twice, which costs more in cache than one more pass through memory.
  T* pdx = dx.defined() ? dx.data<T>() : nullptr;
  std::vector<double> s1, s2;
  bn_chunked_sums(
      batch, ch,
      [&](int64_t b0, int64_t b1, double* q1, double* q2) {
        Scratch t = scratch();
        for (int64_t b = b0; b < b1; ++b) {
          T* dz = pdx ? pdx + b * ch * sp : t.dz.data();
          chain.dz(b, py + b * out, pdy + b * out, t.z.data(), t.g.data(), dz);
          bn_sums<T>(px + b * ch * sp, dz, ch, sp, sm, 0, 1, q1, q2);
        }
      },
      s1, s2);
  std::vector<T> coef(static_cast<size_t>(4 * ch));
  bn_grad_coefficients<T>(ch, static_cast<double>(batch * sp), s1, s2, gamma.data<T>(), sm, save_invstd.data<T>(),
                          beta_acc, dgamma.data<T>(), dbeta.data<T>(), coef.data());
  if (!pdx) return;
  parallel_for(batch * ch, std::max<int64_t>(1, kGrain / std::max<int64_t>(sp, 1)),
               [&](int64_t r0, int64_t r1) { bn_dx<T>(px, pdx, coef.data(), ch, sp, training, r0, r1, pdx); });
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
void batchnorm_epilogue_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                                Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                                Tensor& save_invstd, Tensor& save_scale, Tensor& save_shift, const ops::Epilogue& ep,
                                Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) {
    bn_epilogue_fwd_t<decltype(t)>(x, gamma, beta, running_mean, running_var, momentum, eps, training, save_mean,
                                   save_invstd, save_scale, save_shift, ep, y);
  });
}
void batchnorm_epilogue_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                                 const Tensor& save_invstd, const Tensor& save_scale, const Tensor& save_shift,
                                 const ops::Epilogue& ep, const Tensor& y, const Tensor& dy, bool training, Tensor& dx,
                                 Tensor& dgamma, Tensor& dbeta, double beta) {
  for_float_type(x.dtype(), [&](auto t) {
    bn_epilogue_bwd_t<decltype(t)>(x, gamma, save_mean, save_invstd, save_scale, save_shift, ep, y, dy, training, dx,
                                   dgamma, dbeta, beta);
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
