// The tiled attention's kernels (ops/cuda/attention_tiled.cu), kept apart so that a host emulation can run the same
// code: tests/test_attention_tiled_emulated.cpp compiles it with a thread per CUDA thread, barriers for
// __syncthreads and the warp's *_sync calls, and whole-tile wmma fragments. It is included inside a namespace of
// the includer, after what it uses: kern's kWarp, kFullMask and infinity<T>(), nvcuda::wmma (<mma.h>),
// __syncthreads, __shfl_xor_sync, threadIdx, blockIdx, gridDim, and tiled_shared() (the block's dynamic shared
// memory, 128-byte aligned). No #include here: it is text inside that namespace.

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kPad = 4;                   // floats after each row of a shared tile
constexpr size_t kMaxShared = 99 * 1024;  // bytes of shared memory a block may have on SM 8.6 and 8.9

// The tiles for heads of D channels: rows of queries and of keys per block in each kernel, and the shared memory
// (floats) each needs.
template <int D>
struct Tiles {
  static constexpr int kLd = D + kPad;
  static constexpr int kFwdRows = 64, kFwdKeys = D <= 64 ? 64 : 32;
  static constexpr int kKvKeys = 32, kKvRows = D <= 64 ? 64 : D <= 96 ? 32 : 16;
  static constexpr int kDqRows = D <= 64 ? 64 : 32, kDqKeys = 32;
  // The forward's value tile has a buffer of its own where it fits (heads of 64 and 96), and is loaded with the key
  // tile; else it replaces the keys once S is made.
  static constexpr size_t kFwdShared = 2 * kFwdRows * kLd + kFwdKeys * kLd + kFwdRows * (kFwdKeys + kPad) + kFwdRows;
  static constexpr bool kFwdOwnV = (kFwdShared + kFwdKeys * kLd) * 4 <= kMaxShared;
  static constexpr size_t kFwdFloats = kFwdShared + (kFwdOwnV ? kFwdKeys * kLd : 0);
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
  float* smem = tiled_shared();
  float* qs = smem;                              // [kR][kLd] the block's query rows
  float* os = qs + kR * kLd;                     // [kR][kLd] the unnormalised output rows
  float* ks = os + kR * kLd;                     // [kK][kLd] a key tile
  float* vs = L::kFwdOwnV ? ks + kK * kLd : ks;  // [kK][kLd] its value tile (in place of the keys without room)
  float* ss = vs + kK * kLd;                     // [kR][kLs] the tile's scores, then exp(s − row max)
  float* sums = ss + kR * kLs;                   // [kR] the rows' final sums
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
    __syncthreads();  // the last tile's products are done with ks, vs and ss
    load_tile<kK, D>(base + c, 3 * c, j0, t, ks);
    if (L::kFwdOwnV) load_tile<kK, D>(base + 2 * c, 3 * c, j0, t, vs);
    __syncthreads();
    gemm<kTc, kR, kK, D, false, true>(qs, kLd, ks, kLd, ss, kLs, false);  // S = Q·Kᵀ
    __syncthreads();
    if (!L::kFwdOwnV) load_tile<kK, D>(base + 2 * c, 3 * c, j0, t, vs);
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
    gemm<kTc, kR, D, kK, false, false>(ss, kLs, vs, kLd, os, kLd, true);  // O += P·V
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
  float* smem = tiled_shared();
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
  float* smem = tiled_shared();
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
