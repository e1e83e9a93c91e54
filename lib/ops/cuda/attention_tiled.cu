// The tiled causal attention (ops/cuda/attention_tiled.h): FlashAttention-2's forward and backward for f32 heads of
// 64, 96 and 128 channels. A block of 128 threads owns a tile of rows of one (batch, head) and stages the other
// side's rows through shared memory a tile at a time; the scores of a tile pair are a [rows, keys] product in shared
// memory, never in device memory.
//
// Forward: a block per 64 query rows walks the key tiles up to its last row. For each: S = Q·Kᵀ, then two threads per
// query row fold the tile into the row's running maximum and sum (an online softmax in f32: the output rows are
// rescaled by exp(old max − new max) as the maximum grows) and leave P = exp(s − max) in place of S, then O += P·V.
// At the end out = O / sum and lse = max + log(sum).
// Backward, from the forward's lse and delta = Σ dout·out per query row (attention.cu's delta kernel): P is recomputed
// as exp(s − lse), dP = dout·Vᵀ and dS = P (dP − delta) / √d. One kernel runs a block per key tile over the query
// tiles at or after it (dV += Pᵀ·dout, dK += dSᵀ·Q), a second a block per query tile over the key tiles at or before
// it (dQ += dS·K): S and dP are computed twice, and every gradient has one writer that sums in a fixed order, so a
// second run gives the same bits (no atomics).
//
// The products are block GEMMs on shared-memory tiles, accumulated in shared memory (the forward's O too, so its
// rescaling is a plain loop over rows): in f32 FMA (train.precision fp32) a thread per 4 rows × N/8…N/32 columns of
// the result with sums over k in order, or on TF32 tensor cores (tf32) through nvcuda::wmma's m16n16k8 fragments,
// a warp per 16 × 16 tile of the result, each operand rounded to TF32 (10 explicit mantissa bits, nearest) as it is
// loaded and the sums in f32. The softmax, its statistics and the exponentials stay f32 in both. Rows past T are zero
// in shared memory and masked with the future keys, so T need not be a multiple of a tile.
//
// Tiles per head size keep every kernel within 99 KiB of shared memory (the most a block may have on SM 8.6 and 8.9;
// SM 8.0 and 9.0 allow more): rows padded by 4 floats, so that the rows a warp reads together start in different banks
// and every 16-row or 8-column step of a wmma tile starts 32 bytes aligned.
#include "ops/cuda/attention_tiled.h"

#include "core/env.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/precision.h"

#include <mma.h>

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <type_traits>

namespace gt::cuda {
namespace {

using namespace kern;

constexpr const char* kEnv = "GPUTRAIN_TILED_ATTENTION";
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kPad = 4;                      // floats after each row of a shared tile
constexpr int64_t kMaxT = int64_t{1} << 20;  // query tiles of 16 rows stay within the grid's y (65535)
constexpr size_t kMaxShared = 99 * 1024;     // bytes of shared memory a block may have on SM 8.6 and 8.9

std::atomic<int64_t> g_forward_runs{0}, g_backward_runs{0};

// The tiles for heads of D channels: rows of queries and of keys per block in each kernel, and the shared memory
// (floats) each needs.
template <int D>
struct Tiles {
  static constexpr int kLd = D + kPad;
  static constexpr int kFwdRows = 64, kFwdKeys = D <= 64 ? 64 : 32;
  static constexpr int kKvKeys = 32, kKvRows = D <= 64 ? 64 : D <= 96 ? 32 : 16;
  static constexpr int kDqRows = D <= 64 ? 64 : 32, kDqKeys = 32;
  static constexpr size_t kFwdFloats = 2 * kFwdRows * kLd + kFwdKeys * kLd + kFwdRows * (kFwdKeys + kPad) + kFwdRows;
  static constexpr size_t kKvFloats =
      4 * kKvKeys * kLd + 2 * kKvRows * kLd + 2 * kKvRows * (kKvKeys + kPad) + 2 * kKvRows;
  static constexpr size_t kDqFloats =
      3 * kDqRows * kLd + 2 * kDqKeys * kLd + 2 * kDqRows * (kDqKeys + kPad) + 2 * kDqRows;
  static_assert(kFwdFloats * 4 <= kMaxShared && kKvFloats * 4 <= kMaxShared && kDqFloats * 4 <= kMaxShared);
  static_assert(kFwdRows * 2 == kThreads, "the forward's softmax runs two threads per query row");
};

// C[M][N] (row-major, ldc) = (acc ? C : 0) + A·B in f32 FMA, A [M][K] read as a[m·lda + k] or, when kACol, as
// a[k·lda + m]; B [K][N] as b[k·ldb + n] or, when kBCol, b[n·ldb + k]. Each thread sums 4 × kTN results (rows rg + 4·x
// … strided by the row groups, columns likewise) over k in order. All threads call it; the caller synchronises.
template <int M, int N, int K, bool kACol, bool kBCol>
__device__ __forceinline__ void gemm_fma(const float* a, int lda, const float* b, int ldb, float* c, int ldc,
                                         bool acc) {
  constexpr int kTM = 4, kRowGroups = M / kTM;
  static_assert(M % kTM == 0 && kThreads % kRowGroups == 0);
  constexpr int kColGroups = kThreads / kRowGroups;
  static_assert(N % kColGroups == 0);
  constexpr int kTN = N / kColGroups;
  const int rg = static_cast<int>(threadIdx.x) / kColGroups, cg = static_cast<int>(threadIdx.x) % kColGroups;
  float sum[kTM][kTN];
#pragma unroll
  for (int x = 0; x < kTM; ++x)
#pragma unroll
    for (int y = 0; y < kTN; ++y) sum[x][y] = acc ? c[(rg + x * kRowGroups) * ldc + cg + y * kColGroups] : 0.0f;
#pragma unroll 2
  for (int k = 0; k < K; ++k) {
    float av[kTM], bv[kTN];
#pragma unroll
    for (int x = 0; x < kTM; ++x) {
      const int m = rg + x * kRowGroups;
      av[x] = kACol ? a[k * lda + m] : a[m * lda + k];
    }
#pragma unroll
    for (int y = 0; y < kTN; ++y) {
      const int n = cg + y * kColGroups;
      bv[y] = kBCol ? b[n * ldb + k] : b[k * ldb + n];
    }
#pragma unroll
    for (int x = 0; x < kTM; ++x)
#pragma unroll
      for (int y = 0; y < kTN; ++y) sum[x][y] = fmaf(av[x], bv[y], sum[x][y]);
  }
#pragma unroll
  for (int x = 0; x < kTM; ++x)
#pragma unroll
    for (int y = 0; y < kTN; ++y) c[(rg + x * kRowGroups) * ldc + cg + y * kColGroups] = sum[x][y];
}

// The same product on TF32 tensor cores: a warp per 16 × 16 tile of C (tiles warp, warp + 4, …), k in steps of 8,
// each fragment of A and B rounded to TF32 after it is loaded. Tile pointers are 32-byte aligned when the buffers
// are and lda, ldb, ldc are multiples of 4 (the wmma rules for f32 and tf32).
template <int M, int N, int K, bool kACol, bool kBCol>
__device__ __forceinline__ void gemm_tf32(const float* a, int lda, const float* b, int ldb, float* c, int ldc,
                                          bool acc) {
  namespace wmma = nvcuda::wmma;
  using LayoutA = std::conditional_t<kACol, wmma::col_major, wmma::row_major>;
  using LayoutB = std::conditional_t<kBCol, wmma::col_major, wmma::row_major>;
  static_assert(M % 16 == 0 && N % 16 == 0 && K % 8 == 0);
  constexpr int kTilesN = N / 16, kTiles = (M / 16) * kTilesN;
  for (int tile = static_cast<int>(threadIdx.x) / kWarp; tile < kTiles; tile += kWarps) {
    const int tm = tile / kTilesN, tn = tile % kTilesN;
    float* cp = c + tm * 16 * ldc + tn * 16;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> cf;
    if (acc)
      wmma::load_matrix_sync(cf, cp, ldc, wmma::mem_row_major);
    else
      wmma::fill_fragment(cf, 0.0f);
#pragma unroll 2
    for (int k = 0; k < K; k += 8) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LayoutA> af;
      wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LayoutB> bf;
      wmma::load_matrix_sync(af, kACol ? a + k * lda + tm * 16 : a + tm * 16 * lda + k, lda);
      wmma::load_matrix_sync(bf, kBCol ? b + tn * 16 * ldb + k : b + k * ldb + tn * 16, ldb);
#pragma unroll
      for (int e = 0; e < af.num_elements; ++e) af.x[e] = wmma::__float_to_tf32(af.x[e]);
#pragma unroll
      for (int e = 0; e < bf.num_elements; ++e) bf.x[e] = wmma::__float_to_tf32(bf.x[e]);
      wmma::mma_sync(cf, af, bf, cf);
    }
    wmma::store_matrix_sync(cp, cf, ldc, wmma::mem_row_major);
  }
}

template <bool kTc, int M, int N, int K, bool kACol, bool kBCol>
__device__ __forceinline__ void gemm(const float* a, int lda, const float* b, int ldb, float* c, int ldc, bool acc) {
  if constexpr (kTc)
    gemm_tf32<M, N, K, kACol, kBCol>(a, lda, b, ldb, c, ldc, acc);
  else
    gemm_fma<M, N, K, kACol, kBCol>(a, lda, b, ldb, c, ldc, acc);
}

// Rows [r0, r0 + kRows) of a matrix with row i at src + i·stride (D columns) into dst (rows D + kPad apart), zero
// past row t. All threads take part.
template <int kRows, int D>
__device__ __forceinline__ void load_tile(const float* src, int64_t stride, int64_t r0, int64_t t, float* dst) {
  for (int idx = static_cast<int>(threadIdx.x); idx < kRows * D; idx += kThreads) {
    const int r = idx / D, e = idx % D;
    const int64_t i = r0 + r;
    dst[r * (D + kPad) + e] = i < t ? src[i * stride + e] : 0.0f;
  }
}

// The reverse for the rows before t: dst row i at dst + i·stride gets src's row i − r0 divided by div[i − r0] (or
// as it is when div is null).
template <int kRows, int D>
__device__ __forceinline__ void store_tile(const float* src, const float* div, float* dst, int64_t stride, int64_t r0,
                                           int64_t t) {
  for (int idx = static_cast<int>(threadIdx.x); idx < kRows * D; idx += kThreads) {
    const int r = idx / D, e = idx % D;
    const int64_t i = r0 + r;
    if (i < t) dst[i * stride + e] = div ? src[r * (D + kPad) + e] / div[r] : src[r * (D + kPad) + e];
  }
}

// lse and delta of query rows [r0, r0 + kRows) of one (batch, head) into shared memory (0 past t).
template <int kRows>
__device__ __forceinline__ void load_stats(const float* lse, const float* delta, int64_t r0, int64_t t, float* lse_s,
                                           float* delta_s) {
  for (int r = static_cast<int>(threadIdx.x); r < kRows; r += kThreads) {
    const int64_t i = r0 + r;
    lse_s[r] = i < t ? lse[i] : 0.0f;
    delta_s[r] = i < t ? delta[i] : 0.0f;
  }
}

// The forward: grid (B·heads, ⌈T / 64⌉), the last query tiles (the most keys) first.
template <int D, bool kTc>
__global__ void __launch_bounds__(kThreads)
    tiled_fwd_kernel(const float* __restrict__ qkv, int64_t t, int64_t c, int64_t heads, float scale,
                     float* __restrict__ out, float* __restrict__ lse) {
  using L = Tiles<D>;
  constexpr int kR = L::kFwdRows, kK = L::kFwdKeys, kLd = L::kLd, kLs = kK + kPad;
  extern __shared__ __align__(128) float smem[];
  float* qs = smem;             // [kR][kLd] the block's query rows
  float* os = qs + kR * kLd;    // [kR][kLd] the unnormalised output rows
  float* kv = os + kR * kLd;    // [kK][kLd] a key tile, then its value tile
  float* ss = kv + kK * kLd;    // [kR][kLs] the tile's scores, then exp(s − row max)
  float* sums = ss + kR * kLs;  // [kR] the rows' final sums
  const int64_t b = blockIdx.x / heads, h = blockIdx.x % heads;
  const int64_t i0 = int64_t{gridDim.y - 1 - blockIdx.y} * kR;
  const float* base = qkv + b * t * 3 * c + h * D;
  load_tile<kR, D>(base, 3 * c, i0, t, qs);
  for (int idx = static_cast<int>(threadIdx.x); idx < kR * kLd; idx += kThreads) os[idx] = 0.0f;
  const int r = static_cast<int>(threadIdx.x) / 2, half = static_cast<int>(threadIdx.x) % 2;
  const int64_t i = i0 + r;
  float row_max = -infinity<float>(), row_sum = 0.0f;
  const int64_t end = i0 + kR < t ? i0 + kR : t;  // the block's keys: [0, end)
  for (int64_t j0 = 0; j0 < end; j0 += kK) {
    __syncthreads();  // the last tile's products are done with kv and ss
    load_tile<kK, D>(base + c, 3 * c, j0, t, kv);
    __syncthreads();
    gemm<kTc, kR, kK, D, false, true>(qs, kLd, kv, kLd, ss, kLs, false);  // S = Q·Kᵀ
    __syncthreads();
    load_tile<kK, D>(base + 2 * c, 3 * c, j0, t, kv);
    // Row r's keys j ≤ i of the tile, its two threads taking alternate columns. Key 0 is in every row's first tile,
    // so the maximum is finite from then on (rows past T included: their zero rows score 0).
    float* srow = ss + r * kLs;
    float mx = row_max;
    for (int x = half; x < kK; x += 2)
      if (j0 + x <= i) mx = fmaxf(mx, srow[x] * scale);
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float corr = mx == row_max ? 1.0f : expf(row_max - mx);
    float part = 0.0f;
    for (int x = half; x < kK; x += 2) {
      const float p = j0 + x <= i ? expf(srow[x] * scale - mx) : 0.0f;
      srow[x] = p;
      part += p;
    }
    row_sum = row_sum * corr + (part + __shfl_xor_sync(kFullMask, part, 1));
    row_max = mx;
    if (corr != 1.0f)
      for (int e = half; e < D; e += 2) os[r * kLd + e] *= corr;
    __syncthreads();
    gemm<kTc, kR, D, kK, false, false>(ss, kLs, kv, kLd, os, kLd, true);  // O += P·V
  }
  if (half == 0) {
    sums[r] = row_sum;
    if (lse && i < t) lse[(b * heads + h) * t + i] = row_max + logf(row_sum);
  }
  __syncthreads();
  store_tile<kR, D>(os, sums, out + b * t * c + h * D, c, i0, t);
}

// dS and P of a tile pair from S (ss) and dP (dps) in place: P = exp(s/√d − lse_i) for keys j ≤ i < t (0 elsewhere)
// into ss when keep_p, dS = P (dP − delta_i) / √d into dps.
template <int kR, int kK>
__device__ __forceinline__ void softmax_grad_tile(float* ss, float* dps, const float* lse_s, const float* delta_s,
                                                  int64_t i0, int64_t j0, int64_t t, float scale, bool keep_p) {
  constexpr int kLs = kK + kPad;
  for (int idx = static_cast<int>(threadIdx.x); idx < kR * kK; idx += kThreads) {
    const int r = idx / kK, x = idx % kK;
    const int64_t i = i0 + r, j = j0 + x;
    const float p = i < t && j <= i ? expf(ss[r * kLs + x] * scale - lse_s[r]) : 0.0f;
    if (keep_p) ss[r * kLs + x] = p;
    dps[r * kLs + x] = p * (dps[r * kLs + x] - delta_s[r]) * scale;
  }
}

// dK and dV: grid (B·heads, ⌈T / 32⌉), a block per key tile over the query tiles from the one holding its first key.
template <int D, bool kTc>
__global__ void __launch_bounds__(kThreads)
    tiled_dkv_kernel(const float* __restrict__ qkv, const float* __restrict__ dout, const float* __restrict__ lse,
                     const float* __restrict__ delta, int64_t t, int64_t c, int64_t heads, float scale,
                     float* __restrict__ dqkv) {
  using L = Tiles<D>;
  constexpr int kK = L::kKvKeys, kR = L::kKvRows, kLd = L::kLd, kLs = kK + kPad;
  extern __shared__ __align__(128) float smem[];
  float* ks = smem;               // [kK][kLd] the block's keys
  float* vs = ks + kK * kLd;      // [kK][kLd] and values
  float* dks = vs + kK * kLd;     // [kK][kLd] their gradients
  float* dvs = dks + kK * kLd;    // [kK][kLd]
  float* qs = dvs + kK * kLd;     // [kR][kLd] a query tile
  float* gs = qs + kR * kLd;      // [kR][kLd] its dout rows
  float* ps = gs + kR * kLd;      // [kR][kLs] S, then P
  float* dps = ps + kR * kLs;     // [kR][kLs] dP, then dS
  float* lse_s = dps + kR * kLs;  // [kR]
  float* delta_s = lse_s + kR;    // [kR]
  const int64_t b = blockIdx.x / heads, h = blockIdx.x % heads, j0 = int64_t{blockIdx.y} * kK;
  const int64_t stats = (b * heads + h) * t;
  const float* base = qkv + b * t * 3 * c + h * D;
  const float* gbase = dout + b * t * c + h * D;
  load_tile<kK, D>(base + c, 3 * c, j0, t, ks);
  load_tile<kK, D>(base + 2 * c, 3 * c, j0, t, vs);
  for (int idx = static_cast<int>(threadIdx.x); idx < kK * kLd; idx += kThreads) dks[idx] = dvs[idx] = 0.0f;
  for (int64_t i0 = j0 / kR * kR; i0 < t; i0 += kR) {
    __syncthreads();  // the last tile's products are done with qs, gs, ps and dps
    load_tile<kR, D>(base, 3 * c, i0, t, qs);
    load_tile<kR, D>(gbase, c, i0, t, gs);
    load_stats<kR>(lse + stats, delta + stats, i0, t, lse_s, delta_s);
    __syncthreads();
    gemm<kTc, kR, kK, D, false, true>(qs, kLd, ks, kLd, ps, kLs, false);   // S = Q·Kᵀ
    gemm<kTc, kR, kK, D, false, true>(gs, kLd, vs, kLd, dps, kLs, false);  // dP = dout·Vᵀ
    __syncthreads();
    softmax_grad_tile<kR, kK>(ps, dps, lse_s, delta_s, i0, j0, t, scale, true);
    __syncthreads();
    gemm<kTc, kK, D, kR, true, false>(ps, kLs, gs, kLd, dvs, kLd, true);   // dV += Pᵀ·dout
    gemm<kTc, kK, D, kR, true, false>(dps, kLs, qs, kLd, dks, kLd, true);  // dK += dSᵀ·Q
  }
  __syncthreads();
  store_tile<kK, D>(dks, nullptr, dqkv + b * t * 3 * c + c + h * D, 3 * c, j0, t);
  store_tile<kK, D>(dvs, nullptr, dqkv + b * t * 3 * c + 2 * c + h * D, 3 * c, j0, t);
}

// dQ: grid (B·heads, ⌈T / rows⌉), a block per query tile over the key tiles up to its last row, the last tiles first.
template <int D, bool kTc>
__global__ void __launch_bounds__(kThreads)
    tiled_dq_kernel(const float* __restrict__ qkv, const float* __restrict__ dout, const float* __restrict__ lse,
                    const float* __restrict__ delta, int64_t t, int64_t c, int64_t heads, float scale,
                    float* __restrict__ dqkv) {
  using L = Tiles<D>;
  constexpr int kR = L::kDqRows, kK = L::kDqKeys, kLd = L::kLd, kLs = kK + kPad;
  extern __shared__ __align__(128) float smem[];
  float* qs = smem;               // [kR][kLd] the block's query rows
  float* gs = qs + kR * kLd;      // [kR][kLd] their dout rows
  float* dqs = gs + kR * kLd;     // [kR][kLd] their gradients
  float* ks = dqs + kR * kLd;     // [kK][kLd] a key tile
  float* vs = ks + kK * kLd;      // [kK][kLd] and its values
  float* ss = vs + kK * kLd;      // [kR][kLs] S
  float* dps = ss + kR * kLs;     // [kR][kLs] dP, then dS
  float* lse_s = dps + kR * kLs;  // [kR]
  float* delta_s = lse_s + kR;    // [kR]
  const int64_t b = blockIdx.x / heads, h = blockIdx.x % heads;
  const int64_t i0 = int64_t{gridDim.y - 1 - blockIdx.y} * kR;
  const int64_t stats = (b * heads + h) * t;
  const float* base = qkv + b * t * 3 * c + h * D;
  load_tile<kR, D>(base, 3 * c, i0, t, qs);
  load_tile<kR, D>(dout + b * t * c + h * D, c, i0, t, gs);
  load_stats<kR>(lse + stats, delta + stats, i0, t, lse_s, delta_s);
  for (int idx = static_cast<int>(threadIdx.x); idx < kR * kLd; idx += kThreads) dqs[idx] = 0.0f;
  const int64_t end = i0 + kR < t ? i0 + kR : t;
  for (int64_t j0 = 0; j0 < end; j0 += kK) {
    __syncthreads();  // the last tile's products are done with ks, vs, ss and dps
    load_tile<kK, D>(base + c, 3 * c, j0, t, ks);
    load_tile<kK, D>(base + 2 * c, 3 * c, j0, t, vs);
    __syncthreads();
    gemm<kTc, kR, kK, D, false, true>(qs, kLd, ks, kLd, ss, kLs, false);   // S = Q·Kᵀ
    gemm<kTc, kR, kK, D, false, true>(gs, kLd, vs, kLd, dps, kLs, false);  // dP = dout·Vᵀ
    __syncthreads();
    softmax_grad_tile<kR, kK>(ss, dps, lse_s, delta_s, i0, j0, t, scale, false);
    __syncthreads();
    gemm<kTc, kR, D, kK, false, false>(dps, kLs, ks, kLd, dqs, kLd, true);  // dQ += dS·K
  }
  __syncthreads();
  store_tile<kR, D>(dqs, nullptr, dqkv + b * t * 3 * c + h * D, 3 * c, i0, t);
}

// The sizes of a call and its 1/√d, rounded to f32 as the CPU rounds it.
struct Dims {
  int64_t nb, t, c, heads, d;
  float scale;
};
Dims dims_of(const Tensor& qkv, int64_t heads) {
  const int64_t c = qkv.dim(2) / 3, d = c / heads;
  return Dims{qkv.dim(0), qkv.dim(1), c, heads, d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
}

// Calls f(integral_constant D, bool_constant tensor cores) for the call's head size and product precision.
template <class F>
void with_kernel(int64_t d, F&& f) {
  const bool tc = product_precision() == Precision::tf32;
  auto go = [&](auto dc) {
    if (tc)
      f(dc, std::true_type{});
    else
      f(dc, std::false_type{});
  };
  if (d == 64)
    go(std::integral_constant<int, 64>{});
  else if (d == 96)
    go(std::integral_constant<int, 96>{});
  else
    go(std::integral_constant<int, 128>{});
}

// The kernel may use `floats` of dynamic shared memory (past the default 48 KiB) on the current device: set before
// each launch, as the setting belongs to the device the call runs on.
template <class Kernel>
void allow_shared(Kernel* kernel, size_t floats) {
  GT_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(floats * sizeof(float))));
}

unsigned tiles(int64_t t, int rows) { return static_cast<unsigned>((t + rows - 1) / rows); }

}  // namespace

std::optional<std::string> tiled_attention_refusal(const Tensor& qkv, int64_t heads,
                                                   const ops::AttentionDropout& dropout) {
  if (env_choice(kEnv, {"0"})) return fmt::format("{}=0", kEnv);
  if (qkv.dtype() != DType::f32) return fmt::format("{} tensors", dtype_name(qkv.dtype()));
  if (dropout.p > 0) return fmt::format("attention dropout {}", dropout.p);
  const Precision p = product_precision();
  if (p != Precision::fp32 && p != Precision::tf32) return fmt::format("product precision {}", to_string(p));
  const int64_t d = qkv.dim(2) / 3 / heads;
  if (d != 64 && d != 96 && d != 128) return fmt::format("head size {} (the tiled kernels take 64, 96 and 128)", d);
  if (qkv.dim(1) > kMaxT) return fmt::format("T {} (the tiled kernels take at most {})", qkv.dim(1), kMaxT);
  return std::nullopt;
}

void tiled_attention_forward(const Tensor& qkv, int64_t heads, Tensor& out, Tensor& lse) {
  const Dims s = dims_of(qkv, heads);
  cudaStream_t st = stream(qkv.device().index);
  with_kernel(s.d, [&](auto dc, auto tc) {
    constexpr int D = decltype(dc)::value;
    constexpr bool kTc = decltype(tc)::value;
    using L = Tiles<D>;
    allow_shared(tiled_fwd_kernel<D, kTc>, L::kFwdFloats);
    const dim3 grid(static_cast<unsigned>(s.nb * s.heads), tiles(s.t, L::kFwdRows));
    tiled_fwd_kernel<D, kTc><<<grid, kThreads, L::kFwdFloats * sizeof(float), st>>>(
        static_cast<const float*>(qkv.raw()), s.t, s.c, s.heads, s.scale, static_cast<float*>(out.raw()),
        lse.defined() ? static_cast<float*>(lse.raw()) : nullptr);
  });
  GT_CHECK_LAUNCH();
  g_forward_runs.fetch_add(1, std::memory_order_relaxed);
}

void tiled_attention_backward(const Tensor& qkv, const Tensor& lse, const Tensor& dout, int64_t heads,
                              const Tensor& delta, Tensor& dqkv) {
  const Dims s = dims_of(qkv, heads);
  cudaStream_t st = stream(qkv.device().index);
  const float *x = static_cast<const float*>(qkv.raw()), *g = static_cast<const float*>(dout.raw()),
              *l = static_cast<const float*>(lse.raw()), *dl = static_cast<const float*>(delta.raw());
  float* dx = static_cast<float*>(dqkv.raw());
  with_kernel(s.d, [&](auto dc, auto tc) {
    constexpr int D = decltype(dc)::value;
    constexpr bool kTc = decltype(tc)::value;
    using L = Tiles<D>;
    const unsigned bh = static_cast<unsigned>(s.nb * s.heads);
    allow_shared(tiled_dkv_kernel<D, kTc>, L::kKvFloats);
    tiled_dkv_kernel<D, kTc><<<dim3(bh, tiles(s.t, L::kKvKeys)), kThreads, L::kKvFloats * sizeof(float), st>>>(
        x, g, l, dl, s.t, s.c, s.heads, s.scale, dx);
    GT_CHECK_LAUNCH();
    allow_shared(tiled_dq_kernel<D, kTc>, L::kDqFloats);
    tiled_dq_kernel<D, kTc><<<dim3(bh, tiles(s.t, L::kDqRows)), kThreads, L::kDqFloats * sizeof(float), st>>>(
        x, g, l, dl, s.t, s.c, s.heads, s.scale, dx);
  });
  GT_CHECK_LAUNCH();
  g_backward_runs.fetch_add(1, std::memory_order_relaxed);
}

TiledAttentionRuns tiled_attention_runs() {
  return {g_forward_runs.load(std::memory_order_relaxed), g_backward_runs.load(std::memory_order_relaxed)};
}

}  // namespace gt::cuda
