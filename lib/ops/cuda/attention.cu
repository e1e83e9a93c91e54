// CUDA causal attention (ops/attention.h). One warp per query row walks the keys with an online softmax (running
// max and sum, the output rescaled as the max grows), so no score matrix reaches device memory; the backward
// recomputes the probabilities from lse. dq is summed by a warp per query row and dk, dv by a warp per key row: every
// output has one writer and a fixed order, as on the CPU, with dot products and sums in double. Dropout draws the
// CPU's mask (ops/math.h dropout_keep at attention_dropout_index) for each (query, key) pair it visits, in the
// forward and again in the backward; with p = 0 nothing is drawn and the multiplier is 1 (exact).
// Not tiled through shared memory yet: correct and deterministic first; the speed issue owns a tiled kernel.
//
// Under a bf16/fp16 product precision (ops/precision.h) the products multiply operands rounded to the format (nearest
// even) with the sums kept wide, as the CPU kernel does: q, k, v and dout as they are read, each probability (after
// dropout) before it multiplies v or dout, and each dS before it multiplies k or q. The softmax, its statistics and
// delta stay wide. The forward's online softmax rounds exp(s − running max), where the CPU rounds the normalised
// probability: the two differ by the rounding of a rescaling, within the [cuda] tests' tolerance.
#include "ops/attention.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/math.h"
#include "ops/precision.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kMaxPerLane = 8;  // head size ≤ 8 × 32 = 256
constexpr int kRowThreads = 128;

// The packed [B, T, 3C] layout and the warp's row.
struct Rows {
  int64_t nb, t, c, heads, d;
  __device__ int64_t qkv_row(int64_t b, int64_t i) const { return (b * t + i) * 3 * c; }
  __device__ int64_t out_row(int64_t b, int64_t i) const { return (b * t + i) * c; }
};

// Dropout on the probabilities: p > 0 draws the mask, keep_scale is 1/(1 − p) rounded to the element type as the
// CPU rounds it, so both sides multiply by the same number.
struct Drop {
  ops::AttentionDropout d;
  double keep_scale;
  // m_ij for query i and key j of (b, h): keep_scale or 0, and 1 without dropout. Uniform across a warp.
  __device__ double mult(const Rows& r, int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (!(d.p > 0)) return 1.0;
    return dropout_keep(d.key, d.step, attention_dropout_index(b, h, i, j, r.heads, r.t), d.p) ? keep_scale : 0.0;
  }
};

template <class T>
Drop drop_of(const ops::AttentionDropout& d) {
  return Drop{d, d.p > 0 ? static_cast<double>(static_cast<T>(1.0 / (1.0 - d.p))) : 1.0};
}

// Operand rounding: none (fp32, f64), or to bf16 / fp16 through f32.
struct Exact {
  __device__ static double r(double v) { return v; }
};
struct ToBf16 {
  __device__ static double r(double v) { return __bfloat162float(__float2bfloat16_rn(static_cast<float>(v))); }
};
struct ToFp16 {
  __device__ static double r(double v) { return __half2float(__float2half_rn(static_cast<float>(v))); }
};

// Calls f with the rounding policy of the calling thread's product precision (Exact for f64 data).
template <class F>
void with_rounding(bool is_double, F&& f) {
  const std::optional<HalfFormat> half = is_double ? std::nullopt : half_format(product_precision());
  if (!half)
    f(Exact{});
  else if (*half == HalfFormat::bf16)
    f(ToBf16{});
  else
    f(ToFp16{});
}

__device__ __forceinline__ int64_t warp_index() { return global_index() / kWarp; }
__device__ __forceinline__ int lane_index() { return static_cast<int>(threadIdx.x) % kWarp; }

template <class R, class T>
__device__ double warp_dot(const T* a, const T* b, int64_t d, int lane) {
  double part = 0;
  for (int64_t e = lane; e < d; e += kWarp) part += R::r(static_cast<double>(a[e])) * R::r(static_cast<double>(b[e]));
  return warp_sum(part);
}

// Query rows [first, first + n) of each sequence (all of them for the forward, the new ones for a decode step); out
// is [B, n, C], lse [B, heads, T] is written when given. The running sum is the softmax's (before dropout); the
// output accumulates the dropped probabilities m_ij e_ij.
template <class R, class T>
__global__ void attn_fwd_kernel(const T* __restrict__ qkv, Rows r, int64_t first, int64_t n, Drop drop,
                                T* __restrict__ out, T* lse) {
  const int64_t w = warp_index();
  if (w >= r.nb * r.heads * n) return;  // the whole warp leaves together
  const int lane = lane_index();
  const int64_t i = first + w % n, h = (w / n) % r.heads, b = w / (n * r.heads);
  const double scale = 1.0 / sqrt(static_cast<double>(r.d));
  const T* q = qkv + r.qkv_row(b, i) + h * r.d;
  double acc[kMaxPerLane] = {};
  double m = -infinity<double>(), sum = 0;
  for (int64_t j = 0; j <= i; ++j) {
    const T* k = qkv + r.qkv_row(b, j) + r.c + h * r.d;
    const T* v = k + r.c;
    const double s = scale * warp_dot<R>(q, k, r.d, lane);
    const double m_new = s > m ? s : m;
    const double corr = exp(m - m_new), e = exp(s - m_new);
    sum = sum * corr + e;
    const double ev = R::r(e * drop.mult(r, b, h, i, j));
#pragma unroll
    for (int x = 0; x < kMaxPerLane; ++x) {
      const int64_t col = lane + int64_t{x} * kWarp;
      if (col < r.d) acc[x] = acc[x] * corr + ev * R::r(static_cast<double>(v[col]));
    }
    m = m_new;
  }
  T* o = out + (b * n + i - first) * r.c + h * r.d;
#pragma unroll
  for (int x = 0; x < kMaxPerLane; ++x) {
    const int64_t col = lane + int64_t{x} * kWarp;
    if (col < r.d) o[col] = static_cast<T>(acc[x] / sum);
  }
  if (lse && lane == 0) lse[(b * r.heads + h) * r.t + i] = static_cast<T>(m + log(sum));
}

// delta[b, h, i] = Σ dout·out over the head's columns of row i.
template <class T>
__global__ void attn_delta_kernel(const T* __restrict__ out, const T* __restrict__ dout, Rows r,
                                  T* __restrict__ delta) {
  const int64_t w = warp_index();
  if (w >= r.nb * r.heads * r.t) return;
  const int64_t i = w % r.t, h = (w / r.t) % r.heads, b = w / (r.t * r.heads);
  const int64_t o = r.out_row(b, i) + h * r.d;
  const double s = warp_dot<Exact>(dout + o, out + o, r.d, lane_index());
  if (lane_index() == 0) delta[(b * r.heads + h) * r.t + i] = static_cast<T>(s);
}

// ds_ij / √d for one (query i, key j) pair of a head: p_ij (m_ij dout_i·v_j − delta_i) / √d; also returns m_ij p_ij
// (what dv sums). A dropped pair (m_ij = 0, the same for the whole warp) skips the dot product with v_j.
template <class R, class T>
__device__ double pair_grad(const T* qkv, const T* dout, const T* lse, const T* delta, const Rows& r, const Drop& drop,
                            int64_t b, int64_t h, int64_t i, int64_t j, int lane, double* p) {
  const double scale = 1.0 / sqrt(static_cast<double>(r.d));
  const T* q = qkv + r.qkv_row(b, i) + h * r.d;
  const T* k = qkv + r.qkv_row(b, j) + r.c + h * r.d;
  const T* g = dout + r.out_row(b, i) + h * r.d;
  const int64_t li = (b * r.heads + h) * r.t + i;
  const double pij = exp(scale * warp_dot<R>(q, k, r.d, lane) - static_cast<double>(lse[li]));
  const double m = drop.mult(r, b, h, i, j);
  *p = R::r(m * pij);
  const double dp = m != 0 ? m * warp_dot<R>(g, k + r.c, r.d, lane) : 0.0;
  return R::r(pij * (dp - static_cast<double>(delta[li])) * scale);
}

// dq_i = Σ_{j≤i} ds_ij k_j / √d: one warp per query row.
template <class R, class T>
__global__ void attn_dq_kernel(const T* __restrict__ qkv, const T* __restrict__ dout, const T* __restrict__ lse,
                               const T* __restrict__ delta, Rows r, Drop drop, T* __restrict__ dqkv) {
  const int64_t w = warp_index();
  if (w >= r.nb * r.heads * r.t) return;
  const int lane = lane_index();
  const int64_t i = w % r.t, h = (w / r.t) % r.heads, b = w / (r.t * r.heads);
  double acc[kMaxPerLane] = {};
  for (int64_t j = 0; j <= i; ++j) {
    double p = 0;
    const double ds = pair_grad<R>(qkv, dout, lse, delta, r, drop, b, h, i, j, lane, &p);
    const T* k = qkv + r.qkv_row(b, j) + r.c + h * r.d;
#pragma unroll
    for (int x = 0; x < kMaxPerLane; ++x) {
      const int64_t col = lane + int64_t{x} * kWarp;
      if (col < r.d) acc[x] += ds * R::r(static_cast<double>(k[col]));
    }
  }
  T* dq = dqkv + r.qkv_row(b, i) + h * r.d;
#pragma unroll
  for (int x = 0; x < kMaxPerLane; ++x) {
    const int64_t col = lane + int64_t{x} * kWarp;
    if (col < r.d) dq[col] = static_cast<T>(acc[x]);
  }
}

// dk_j = Σ_{i≥j} ds_ij q_i / √d and dv_j = Σ_{i≥j} m_ij p_ij dout_i: one warp per key row.
template <class R, class T>
__global__ void attn_dkv_kernel(const T* __restrict__ qkv, const T* __restrict__ dout, const T* __restrict__ lse,
                                const T* __restrict__ delta, Rows r, Drop drop, T* __restrict__ dqkv) {
  const int64_t w = warp_index();
  if (w >= r.nb * r.heads * r.t) return;
  const int lane = lane_index();
  const int64_t j = w % r.t, h = (w / r.t) % r.heads, b = w / (r.t * r.heads);
  double ak[kMaxPerLane] = {}, av[kMaxPerLane] = {};
  for (int64_t i = j; i < r.t; ++i) {
    double p = 0;
    const double ds = pair_grad<R>(qkv, dout, lse, delta, r, drop, b, h, i, j, lane, &p);
    const T* q = qkv + r.qkv_row(b, i) + h * r.d;
    const T* g = dout + r.out_row(b, i) + h * r.d;
#pragma unroll
    for (int x = 0; x < kMaxPerLane; ++x) {
      const int64_t col = lane + int64_t{x} * kWarp;
      if (col < r.d) {
        ak[x] += ds * R::r(static_cast<double>(q[col]));
        av[x] += p * R::r(static_cast<double>(g[col]));
      }
    }
  }
  T* dk = dqkv + r.qkv_row(b, j) + r.c + h * r.d;
#pragma unroll
  for (int x = 0; x < kMaxPerLane; ++x) {
    const int64_t col = lane + int64_t{x} * kWarp;
    if (col < r.d) {
      dk[col] = static_cast<T>(ak[x]);
      dk[col + r.c] = static_cast<T>(av[x]);
    }
  }
}

Rows rows_of(const Tensor& qkv, int64_t heads) {
  const int64_t c = qkv.dim(2) / 3;
  GT_CHECK(c / heads <= kMaxPerLane * kWarp, "attention on CUDA takes heads of at most {} channels, got {}",
           kMaxPerLane * kWarp, c / heads);
  return Rows{qkv.dim(0), qkv.dim(1), c, heads, c / heads};
}

// Blocks for one warp per (batch, head, row) over `rows` rows of each sequence (default: all T).
unsigned warp_blocks(const Rows& r, int64_t rows = -1) {
  const int64_t threads = r.nb * r.heads * (rows < 0 ? r.t : rows) * kWarp;
  return static_cast<unsigned>((threads + kRowThreads - 1) / kRowThreads);
}

}  // namespace

void attention_forward(const Tensor& qkv, int64_t heads, const ops::AttentionDropout& dropout, Tensor& out,
                       Tensor& lse) {
  const Rows r = rows_of(qkv, heads);
  if (r.nb * r.t == 0) return;
  const bool f64 = is_f64("attention_forward", qkv);
  with_float_type(f64, [&](auto t) {
    using T = decltype(t);
    with_rounding(f64, [&](auto round) {
      using R = decltype(round);
      attn_fwd_kernel<R, T><<<warp_blocks(r), kRowThreads, 0, stream(qkv.device().index)>>>(
          static_cast<const T*>(qkv.raw()), r, 0, r.t, drop_of<T>(dropout), static_cast<T*>(out.raw()),
          static_cast<T*>(lse.raw()));
    });
  });
  GT_CHECK_LAUNCH();
}

void attention_decode(const Tensor& qkv, int64_t heads, int64_t first, Tensor& out) {
  const Rows r = rows_of(qkv, heads);
  const int64_t n = out.dim(1);
  if (r.nb * n == 0) return;
  const bool f64 = is_f64("attention_decode", qkv);
  with_float_type(f64, [&](auto t) {
    using T = decltype(t);
    with_rounding(f64, [&](auto round) {
      using R = decltype(round);
      attn_fwd_kernel<R, T><<<warp_blocks(r, n), kRowThreads, 0, stream(qkv.device().index)>>>(
          static_cast<const T*>(qkv.raw()), r, first, n, drop_of<T>({}), static_cast<T*>(out.raw()),
          static_cast<T*>(nullptr));
    });
  });
  GT_CHECK_LAUNCH();
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, int64_t heads,
                        const ops::AttentionDropout& dropout, Tensor& delta, Tensor& dqkv) {
  const Rows r = rows_of(qkv, heads);
  if (r.nb * r.t == 0) return;
  cudaStream_t s = stream(qkv.device().index);
  const bool f64 = is_f64("attention_backward", qkv);
  with_float_type(f64, [&](auto t) {
    using T = decltype(t);
    const T *x = static_cast<const T*>(qkv.raw()), *o = static_cast<const T*>(out.raw()),
            *l = static_cast<const T*>(lse.raw()), *g = static_cast<const T*>(dout.raw());
    T* dl = static_cast<T*>(delta.raw());
    T* dx = static_cast<T*>(dqkv.raw());
    const Drop drop = drop_of<T>(dropout);
    attn_delta_kernel<T><<<warp_blocks(r), kRowThreads, 0, s>>>(o, g, r, dl);
    GT_CHECK_LAUNCH();
    with_rounding(f64, [&](auto round) {
      using R = decltype(round);
      attn_dq_kernel<R, T><<<warp_blocks(r), kRowThreads, 0, s>>>(x, g, l, dl, r, drop, dx);
      GT_CHECK_LAUNCH();
      attn_dkv_kernel<R, T><<<warp_blocks(r), kRowThreads, 0, s>>>(x, g, l, dl, r, drop, dx);
    });
  });
  GT_CHECK_LAUNCH();
}

}  // namespace gt::cuda
