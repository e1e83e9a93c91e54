// CUDA causal attention (ops/attention.h). One warp per query row walks the keys with an online softmax (running
// max and sum, the output rescaled as the max grows), so no score matrix reaches device memory; the backward
// recomputes the probabilities from lse. dq is summed by a warp per query row and dk, dv by a warp per key row: every
// output has one writer and a fixed order, as on the CPU, with dot products and sums in double. Dropout draws the
// CPU's mask (ops/math.h dropout_keep at attention_dropout_index) for each (query, key) pair it visits, in the
// forward and again in the backward; with p = 0 nothing is drawn and the multiplier is 1 (exact).
// Heads of at most 32 channels in f32 (the small GPTs: gpt_bytes has 4 heads of 32) take the row kernels instead:
// one thread per row, its own row in registers (forward) or in padded shared memory (backward), the other side's
// rows staged through shared memory 32 at a time and read by every thread of the warp at once (a broadcast); no
// shuffles, and one exp per pair in the forward unless the maximum grows. The same arithmetic in the same double sums,
// pair by pair in the same order (only a dot product's own sum is serial instead of lane-strided), so both paths meet
// the same [cuda] tolerances. f32 heads of 64, 96 and 128 in fp32 or tf32 without dropout (GPT-2's 64) take the tiled
// kernels of attention_tiled.cu (FlashAttention-2's tiling, sums in f32, TF32 tensor cores under tf32); the other
// larger heads, f64, dropout and decoding keep the warp kernels (registers would spill in the row kernels).
// Under bf16/fp16 cuDNN's fused flash attention (attention_cudnn.cpp) takes the calls it can first; these kernels run
// the rest (fp32, f64, dropout, heads cuDNN does not take, GPUTRAIN_CUDNN_ATTENTION=0) and decoding.
//
// Under a bf16/fp16 product precision (ops/precision.h) the products multiply operands rounded to the format (nearest
// even) with the sums kept wide, as the CPU kernel does: q, k, v and dout as they are read, each probability (after
// dropout) before it multiplies v or dout, and each dS before it multiplies k or q. The softmax, its statistics and
// delta stay wide. The forward's online softmax rounds exp(s − running max), where the CPU rounds the normalised
// probability: the two differ by the rounding of a rescaling, within the [cuda] tests' tolerance.
#include "ops/attention.h"

#include "ops/cuda/attention_cudnn.h"
#include "ops/cuda/attention_tiled.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/math.h"
#include "ops/precision.h"
#include "ops/wide.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

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

constexpr int kRowD = 32;      // the row kernels' largest head
constexpr int kRowBlock = 32;  // rows per block (one thread each) and rows per staged tile
__device__ __forceinline__ int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t lmax(int64_t a, int64_t b) { return a > b ? a : b; }

// The rows [r0, r0 + kRowBlock) of sequence b's head h, part `part` (0 q, 1 k, 2 v) of the packed qkv, rounded by R
// and zero past the head and past T, into tile (kRowBlock × kRowD): all of the block's threads take part.
template <class R, int kW = kRowD>
__device__ void stage_rows(const float* qkv, const Rows& r, int64_t b, int64_t h, int64_t r0, int part,
                           float (*tile)[kW]) {
  for (int idx = static_cast<int>(threadIdx.x); idx < kRowBlock * kRowD; idx += kRowBlock) {
    const int row = idx / kRowD, e = idx % kRowD;
    const int64_t i = r0 + row;
    tile[row][e] = i < r.t && e < r.d
                       ? static_cast<float>(R::r(static_cast<double>(qkv[r.qkv_row(b, i) + part * r.c + h * r.d + e])))
                       : 0.0f;
  }
}
// The same for rows of an [B, T, C] tensor (dout).
template <class R, int kW = kRowD>
__device__ void stage_out_rows(const float* x, const Rows& r, int64_t b, int64_t h, int64_t r0, float (*tile)[kW]) {
  for (int idx = static_cast<int>(threadIdx.x); idx < kRowBlock * kRowD; idx += kRowBlock) {
    const int row = idx / kRowD, e = idx % kRowD;
    const int64_t i = r0 + row;
    tile[row][e] =
        i < r.t && e < r.d ? static_cast<float>(R::r(static_cast<double>(x[r.out_row(b, i) + h * r.d + e]))) : 0.0f;
  }
}

__device__ __forceinline__ double row_dot(const float* a, const float (&b)[kRowD]) {
  double s = 0;
#pragma unroll
  for (int e = 0; e < kRowD; ++e) s += static_cast<double>(a[e]) * static_cast<double>(b[e]);
  return s;
}

// The forward of attn_fwd_kernel, a thread per query row: grid (B·heads, ⌈T / kRowBlock⌉).
template <class R>
__global__ void __launch_bounds__(kRowBlock)
    attn_fwd_rows_kernel(const float* __restrict__ qkv, Rows r, Drop drop, float* __restrict__ out, float* lse) {
  __shared__ float ks[kRowBlock][kRowD], vs[kRowBlock][kRowD], qs[kRowBlock][kRowD];
  const int64_t b = blockIdx.x / r.heads, h = blockIdx.x % r.heads, i0 = int64_t{blockIdx.y} * kRowBlock;
  const int64_t i = i0 + threadIdx.x;
  stage_rows<R>(qkv, r, b, h, i0, 0, qs);
  __syncthreads();
  float q[kRowD];
#pragma unroll
  for (int e = 0; e < kRowD; ++e) q[e] = qs[threadIdx.x][e];
  const double scale = 1.0 / sqrt(static_cast<double>(r.d));
  double acc[kRowD] = {};
  double m = -infinity<double>(), sum = 0;
  const int64_t last = lmin(i0 + kRowBlock, r.t);  // the block's keys: [0, last)
  for (int64_t j0 = 0; j0 < last; j0 += kRowBlock) {
    __syncthreads();
    stage_rows<R>(qkv, r, b, h, j0, 1, ks);
    stage_rows<R>(qkv, r, b, h, j0, 2, vs);
    __syncthreads();
    const int64_t jn = lmin(kRowBlock, i - j0 + 1);  // keys j0 … i of this tile (none when i < j0)
    for (int jj = 0; jj < jn; ++jj) {
      const double s = scale * row_dot(q, ks[jj]);
      const double m_new = s > m ? s : m;
      const double corr = s > m ? exp(m - m_new) : 1.0, e = exp(s - m_new);  // exp(0) = 1: skipped, same bits
      sum = sum * corr + e;
      const double ev = R::r(e * drop.mult(r, b, h, i, j0 + jj));
#pragma unroll
      for (int x = 0; x < kRowD; ++x) acc[x] = acc[x] * corr + ev * static_cast<double>(vs[jj][x]);
      m = m_new;
    }
  }
  if (i >= r.t) return;
  float* o = out + r.out_row(b, i) + h * r.d;
#pragma unroll
  for (int x = 0; x < kRowD; ++x)
    if (x < r.d) o[x] = static_cast<float>(acc[x] / sum);
  if (lse) lse[(b * r.heads + h) * r.t + i] = static_cast<float>(m + log(sum));
}

// pair_grad for a thread's pair from staged rows: ds_ij / √d, and *p = R(m_ij p_ij).
template <class R>
__device__ __forceinline__ double row_pair_grad(const float* q, const float* k, const float* g, const float* v,
                                                double lse_i, double delta_i, double scale, double m, double* p) {
  double sq = 0, sg = 0;
#pragma unroll
  for (int e = 0; e < kRowD; ++e) sq += static_cast<double>(q[e]) * static_cast<double>(k[e]);
  const double pij = exp(scale * sq - lse_i);
  *p = R::r(m * pij);
  if (m != 0) {
#pragma unroll
    for (int e = 0; e < kRowD; ++e) sg += static_cast<double>(g[e]) * static_cast<double>(v[e]);
  }
  const double dp = m != 0 ? m * sg : 0.0;
  return R::r(pij * (dp - delta_i) * scale);
}

// dq, a thread per query row: grid (B·heads, ⌈T / kRowBlock⌉).
template <class R>
__global__ void __launch_bounds__(kRowBlock)
    attn_dq_rows_kernel(const float* __restrict__ qkv, const float* __restrict__ dout, const float* __restrict__ lse,
                        const float* __restrict__ delta, Rows r, Drop drop, float* __restrict__ dqkv) {
  // The thread's own q and dout rows stay in shared memory, rows padded to kRowD + 1 floats so that the 32 threads
  // reading their own rows' column e hit 32 different banks: registers are left to the double sums (no spills).
  __shared__ float ks[kRowBlock][kRowD], vs[kRowBlock][kRowD], qo[kRowBlock][kRowD + 1], go[kRowBlock][kRowD + 1];
  const int64_t b = blockIdx.x / r.heads, h = blockIdx.x % r.heads, i0 = int64_t{blockIdx.y} * kRowBlock;
  const int64_t i = i0 + threadIdx.x;
  stage_rows<R, kRowD + 1>(qkv, r, b, h, i0, 0, qo);
  stage_out_rows<R, kRowD + 1>(dout, r, b, h, i0, go);
  const float *q = qo[threadIdx.x], *g = go[threadIdx.x];
  const double scale = 1.0 / sqrt(static_cast<double>(r.d));
  const int64_t li = (b * r.heads + h) * r.t + i;
  const double lse_i = i < r.t ? static_cast<double>(lse[li]) : 0.0;
  const double delta_i = i < r.t ? static_cast<double>(delta[li]) : 0.0;
  double acc[kRowD] = {};
  const int64_t last = lmin(i0 + kRowBlock, r.t);
  for (int64_t j0 = 0; j0 < last; j0 += kRowBlock) {
    __syncthreads();
    stage_rows<R>(qkv, r, b, h, j0, 1, ks);
    stage_rows<R>(qkv, r, b, h, j0, 2, vs);
    __syncthreads();
    const int64_t jn = lmin(kRowBlock, i - j0 + 1);
    for (int jj = 0; jj < jn; ++jj) {
      double p = 0;
      const double ds =
          row_pair_grad<R>(q, ks[jj], g, vs[jj], lse_i, delta_i, scale, drop.mult(r, b, h, i, j0 + jj), &p);
#pragma unroll
      for (int x = 0; x < kRowD; ++x) acc[x] += ds * static_cast<double>(ks[jj][x]);
    }
  }
  if (i >= r.t) return;
  float* dq = dqkv + r.qkv_row(b, i) + h * r.d;
#pragma unroll
  for (int x = 0; x < kRowD; ++x)
    if (x < r.d) dq[x] = static_cast<float>(acc[x]);
}

// dk and dv, a thread per key row j over the queries i ≥ j: grid (B·heads, ⌈T / kRowBlock⌉).
template <class R>
__global__ void __launch_bounds__(kRowBlock)
    attn_dkv_rows_kernel(const float* __restrict__ qkv, const float* __restrict__ dout, const float* __restrict__ lse,
                         const float* __restrict__ delta, Rows r, Drop drop, float* __restrict__ dqkv) {
  __shared__ float qs[kRowBlock][kRowD], gs[kRowBlock][kRowD], ko[kRowBlock][kRowD + 1], vo[kRowBlock][kRowD + 1];
  __shared__ double ls[kRowBlock], ds_[kRowBlock];
  const int64_t b = blockIdx.x / r.heads, h = blockIdx.x % r.heads, j0b = int64_t{blockIdx.y} * kRowBlock;
  const int64_t j = j0b + threadIdx.x;
  stage_rows<R, kRowD + 1>(qkv, r, b, h, j0b, 1, ko);  // the thread's own k and v rows, padded as in dq
  stage_rows<R, kRowD + 1>(qkv, r, b, h, j0b, 2, vo);
  const float *k = ko[threadIdx.x], *v = vo[threadIdx.x];
  const double scale = 1.0 / sqrt(static_cast<double>(r.d));
  double ak[kRowD] = {}, av[kRowD] = {};
  for (int64_t i0 = j0b; i0 < r.t; i0 += kRowBlock) {
    __syncthreads();
    stage_rows<R>(qkv, r, b, h, i0, 0, qs);
    stage_out_rows<R>(dout, r, b, h, i0, gs);
    {
      const int64_t i = i0 + threadIdx.x, li = (b * r.heads + h) * r.t + i;
      ls[threadIdx.x] = i < r.t ? static_cast<double>(lse[li]) : 0.0;
      ds_[threadIdx.x] = i < r.t ? static_cast<double>(delta[li]) : 0.0;
    }
    __syncthreads();
    if (j >= r.t) continue;
    const int first = static_cast<int>(lmax(0, j - i0));  // queries i ≥ j
    const int end = static_cast<int>(lmin(kRowBlock, r.t - i0));
#pragma unroll 1
    for (int ii = first; ii < end; ++ii) {
      // k and v are read from shared memory in every pair: kept in registers across pairs (as the compiler would
      // otherwise hoist them) they and the 64 double sums spill in the fp32 build.
      asm volatile("" ::: "memory");
      double p = 0;
      const double dsv =
          row_pair_grad<R>(qs[ii], k, gs[ii], v, ls[ii], ds_[ii], scale, drop.mult(r, b, h, i0 + ii, j), &p);
#pragma unroll
      for (int x = 0; x < kRowD; ++x) {
        ak[x] += dsv * static_cast<double>(qs[ii][x]);
        av[x] += p * static_cast<double>(gs[ii][x]);
      }
    }
  }
  if (j >= r.t) return;
  float* dk = dqkv + r.qkv_row(b, j) + r.c + h * r.d;
#pragma unroll
  for (int x = 0; x < kRowD; ++x)
    if (x < r.d) {
      dk[x] = static_cast<float>(ak[x]);
      dk[x + r.c] = static_cast<float>(av[x]);
    }
}

// Whether the row kernels take this attention: f32, heads of at most kRowD channels, and T within the grid's y.
bool row_kernels(const Rows& r, bool is_double) {
  return !is_double && r.d <= kRowD && (r.t + kRowBlock - 1) / kRowBlock <= 65535;
}
dim3 row_grid(const Rows& r) {
  return dim3(static_cast<unsigned>(r.nb * r.heads), static_cast<unsigned>((r.t + kRowBlock - 1) / kRowBlock));
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
  if (ops::any_half({&qkv, &out})) {  // 16-bit activations: cuDNN reads and writes them, else the kernels in f32
    if (cudnn_attention_forward(qkv, heads, dropout, out, lse)) return;
    ops::Wide wide;
    Tensor ow = wide.out(out);
    cuda::attention_forward(wide.in(qkv), heads, dropout, ow, lse);
    wide.finish();
    return;
  }
  const bool f64 = is_f64("attention_forward", qkv);
  if (cudnn_attention_forward(qkv, heads, dropout, out, lse)) return;  // bf16/fp16 where cuDNN can
  if (!tiled_attention_refusal(qkv, heads, dropout)) {                 // fp32/tf32 heads of 64, 96, 128 without dropout
    tiled_attention_forward(qkv, heads, out, lse);
    return;
  }
  if (row_kernels(r, f64)) {
    with_rounding(false, [&](auto round) {
      attn_fwd_rows_kernel<decltype(round)><<<row_grid(r), kRowBlock, 0, stream(qkv.device().index)>>>(
          static_cast<const float*>(qkv.raw()), r, drop_of<float>(dropout), static_cast<float*>(out.raw()),
          lse.defined() ? static_cast<float*>(lse.raw()) : nullptr);
    });
    GT_CHECK_LAUNCH();
    return;
  }
  with_float_type(f64, [&](auto t) {
    using T = decltype(t);
    with_rounding(f64, [&](auto round) {
      using R = decltype(round);
      attn_fwd_kernel<R, T><<<warp_blocks(r), kRowThreads, 0, stream(qkv.device().index)>>>(
          static_cast<const T*>(qkv.raw()), r, 0, r.t, drop_of<T>(dropout), static_cast<T*>(out.raw()),
          lse.defined() ? static_cast<T*>(lse.raw()) : nullptr);
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
  if (ops::any_half({&qkv, &out, &dout, &dqkv})) {  // as in the forward
    if (cudnn_attention_backward(qkv, out, lse, dout, heads, dropout, dqkv)) return;
    ops::Wide wide;
    Tensor dw = wide.out(dqkv);
    cuda::attention_backward(wide.in(qkv), wide.in(out), lse, wide.in(dout), heads, dropout, delta, dw);
    wide.finish();
    return;
  }
  cudaStream_t s = stream(qkv.device().index);
  const bool f64 = is_f64("attention_backward", qkv);
  if (cudnn_attention_backward(qkv, out, lse, dout, heads, dropout, dqkv)) return;
  const bool tiled = !tiled_attention_refusal(qkv, heads, dropout);
  with_float_type(f64, [&](auto t) {
    using T = decltype(t);
    const T *x = static_cast<const T*>(qkv.raw()), *o = static_cast<const T*>(out.raw()),
            *l = static_cast<const T*>(lse.raw()), *g = static_cast<const T*>(dout.raw());
    T* dl = static_cast<T*>(delta.raw());
    T* dx = static_cast<T*>(dqkv.raw());
    const Drop drop = drop_of<T>(dropout);
    attn_delta_kernel<T><<<warp_blocks(r), kRowThreads, 0, s>>>(o, g, r, dl);
    GT_CHECK_LAUNCH();
    if constexpr (std::is_same_v<T, float>) {
      if (tiled) {
        tiled_attention_backward(qkv, lse, dout, heads, delta, dqkv);
        return;
      }
    }
    with_rounding(f64, [&](auto round) {
      using R = decltype(round);
      if constexpr (std::is_same_v<T, float>) {
        if (row_kernels(r, f64)) {
          attn_dq_rows_kernel<R><<<row_grid(r), kRowBlock, 0, s>>>(x, g, l, dl, r, drop, dx);
          GT_CHECK_LAUNCH();
          attn_dkv_rows_kernel<R><<<row_grid(r), kRowBlock, 0, s>>>(x, g, l, dl, r, drop, dx);
          return;
        }
      }
      attn_dq_kernel<R, T><<<warp_blocks(r), kRowThreads, 0, s>>>(x, g, l, dl, r, drop, dx);
      GT_CHECK_LAUNCH();
      attn_dkv_kernel<R, T><<<warp_blocks(r), kRowThreads, 0, s>>>(x, g, l, dl, r, drop, dx);
    });
  });
  GT_CHECK_LAUNCH();
}

}  // namespace gt::cuda
