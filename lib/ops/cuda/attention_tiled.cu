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
// The kernels are in attention_tiled_kernels.cuh, which a [cpu] test also compiles for the host; this file chooses,
// sizes and launches them.
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
constexpr int64_t kMaxT = int64_t{1} << 20;  // the grids' tiles (32 rows or more) stay within their y (65535)

std::atomic<int64_t> g_forward_runs{0}, g_backward_runs{0};

// The block's dynamic shared memory (the kernels' tiles).
__device__ __forceinline__ float* tiled_shared() {
  extern __shared__ __align__(128) float smem[];
  return smem;
}

#include "ops/cuda/attention_tiled_kernels.cuh"

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
