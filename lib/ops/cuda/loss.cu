// CUDA losses (ops/loss.h): fused softmax cross-entropy (one warp per row, two reads of it) and mean squared error.
// Both add their sums into the step's f64 statistics on the device, so the host never waits for a loss, and add the
// blocks' sums in block order (kern::add_in_block_order), so a loss has the same bits on every run.
#include "ops/loss.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kCeWarps = 8;  // rows per block of the cross-entropy kernel
constexpr int kThreads = 256;
constexpr int64_t kReduceBlocks = ReduceScratch::kBlocks;
constexpr int64_t kNoIndex = INT64_MAX;  // an argmax that any column beats

// logits (batch, k), labels (batch) → stats[0] += Σ loss, stats[1] += Σ [argmax = label]; dlogits (optional).
// The arithmetic is the CPU's (ops/math.h): the max and the shifted exponentials in T, the sums in double. The
// argmax is the CPU's too: the first index of the largest value, NaNs skipped, except that a NaN in column 0 wins.
// Rows whose label is `ignore`: counted into *ignored, before the loss kernel reads it.
__global__ void count_ignored_kernel(const int32_t* __restrict__ labels, int64_t batch, int64_t ignore,
                                     unsigned long long* __restrict__ ignored) {
  unsigned long long n = 0;
  for (int64_t i = global_index(); i < batch; i += grid_stride()) n += labels[i] == ignore ? 1 : 0;
  n = static_cast<unsigned long long>(block_sum(static_cast<double>(n)));
  if (threadIdx.x == 0 && n > 0) atomicAdd(ignored, n);
}

// Row b of the cross-entropy, for one warp (every lane calls it with the same b, so the shuffles see all 32 lanes):
// its loss and hit added to loss and hit, its gradient (scaled by `scale`) written to dlogits. The row is read twice:
// once for its maximum, argmax, Σx and Σ e^(x − max) together (ops/math.h's OnlineSoftmax, each lane over its
// columns, merged across the warp), once for the gradient (a GPT's logits row of 50257 is 200 KB, far past any
// cache, so each pass is a pass over memory).
// dlogits may be logits itself (the fused classifier's in-place gradient, ops/loss.h): every lane writes only the
// columns it reads, after the warp's shuffles, and the two elements other lanes read (x[0] and the label's) are read
// before the first shuffle.
template <class S>
__device__ void ce_row(const S* logits, const int32_t* __restrict__ labels, int64_t b, int64_t k, double eps,
                       double scale, S* dlogits, int64_t ignore, const unsigned long long* __restrict__ ignored,
                       int lane, double& loss, double& hit) {
  using T = compute_t<S>;  // f32 and f64 as they are; 16-bit logits in f32, as the CPU widens them (ops/wide.h)
  if (ignored && labels[b] == ignore) {
    if (dlogits)
      for (int64_t j = lane; j < k; j += kWarp) dlogits[b * k + j] = store<S>(0.0);
    return;
  }
  const S* x = logits + b * k;
  const int32_t y = labels[b];
  const bool valid = y >= 0 && y < k;  // a label out of range makes the row's loss NaN (ops/loss.h)
  const double xy = valid ? static_cast<double>(load(x[y])) : quiet_nan<double>();
  const T x0 = load(x[0]);
  OnlineSoftmax<T> part;
  int64_t arg = kNoIndex;
  double sum_x = 0;
  for (int64_t j = lane; j < k; j += kWarp) {
    const T v = load(x[j]);
    // NaN: false, skipped; a tie keeps the earlier column (this lane's j only grows), but a −inf takes an argmax
    // still unset, as the CPU's starts at column 0
    if (v > part.max || (v == part.max && arg == kNoIndex)) arg = j;
    part.add(v);
    sum_x += static_cast<double>(v);
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    OnlineSoftmax<T> other;
    other.max = __shfl_xor_sync(kFullMask, part.max, offset);
    other.total = __shfl_xor_sync(kFullMask, part.total, offset);
    other.nan = __shfl_xor_sync(kFullMask, static_cast<int>(part.nan), offset) != 0;
    const int64_t oa = __shfl_xor_sync(kFullMask, arg, offset);
    if (other.max > part.max || (other.max == part.max && oa < arg)) arg = oa;
    part = OnlineSoftmax<T>::merged(part, other);
  }
  if (isnan(x0)) arg = 0;  // the CPU's running max starts at x[0] and a NaN never gives way
  sum_x = warp_sum(sum_x);
  const double lse = static_cast<double>(part.max) + std::log(part.sum());
  loss += ce_row_loss(lse, xy, sum_x, k, eps);
  hit += valid && arg == y ? 1.0 : 0.0;
  if (dlogits) {
    S* d = dlogits + b * k;
    for (int64_t j = lane; j < k; j += kWarp)
      d[j] =
          store<S>(static_cast<T>(ce_dlogit(std::exp(static_cast<double>(load(x[j])) - lse), j == y, k, eps, scale)));
  }
}

// ignored == nullptr: nothing is ignored. Otherwise each counted row weighs w = samples / counted (ops/loss.h).
// A block's warps take rows b, b + kCeWarps·gridDim.x, … (at most kReduceBlocks blocks, for the ordered sum).
template <class S>
__global__ void cross_entropy_kernel(const S* logits, const int32_t* __restrict__ labels, int64_t batch, int64_t k,
                                     double eps, double scale, S* dlogits, double* __restrict__ stats, int64_t samples,
                                     int64_t ignore, const unsigned long long* __restrict__ ignored,
                                     ReduceScratch scratch) {
  const int64_t counted = ignored ? batch - static_cast<int64_t>(*ignored) : batch;
  const double w = counted > 0 ? static_cast<double>(samples) / static_cast<double>(counted) : 0.0;
  scale *= w;
  __shared__ double part_loss[kCeWarps], part_hits[kCeWarps];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  double loss = 0, hit = 0;
  for (int64_t b = blockIdx.x * int64_t{kCeWarps} + warp; b < batch; b += int64_t{gridDim.x} * kCeWarps)
    ce_row(logits, labels, b, k, eps, scale, dlogits, ignore, ignored, lane, loss, hit);
  if (lane == 0) part_loss[warp] = loss, part_hits[warp] = hit;
  __syncthreads();
  double sums[2] = {0, 0};
  if (threadIdx.x == 0) {
    for (int i = 0; i < kCeWarps; ++i) sums[0] += part_loss[i], sums[1] += part_hits[i];
    sums[0] *= w;  // (exact when w = 1)
    sums[1] *= w;
  }
  add_in_block_order(sums, stats, scratch);
}

// stats[0] += Σ (pred − target)² / d (Σ over the batch of each row's mean); dpred = grad_scale · (pred − target).
// dpred may be pred itself: each element is read before it is written, by the same thread.
template <class T>
__global__ void mse_kernel(const T* pred, const T* __restrict__ target, int64_t n, int64_t d, double grad_scale,
                           T* dpred, double* __restrict__ stats, ReduceScratch scratch) {
  double acc = 0;
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    const double diff = static_cast<double>(pred[i]) - static_cast<double>(target[i]);
    acc += diff * diff;
    if (dpred) dpred[i] = static_cast<T>(grad_scale * diff);
  }
  const double sums[1] = {block_sum(acc) / static_cast<double>(d)};
  add_in_block_order(sums, stats, scratch);
}

void launch_cross_entropy(cudaStream_t s, ReduceScratch scratch, DType dtype, const void* logits, const int32_t* labels,
                          int64_t batch, int64_t k, double label_smoothing, double scale, void* dlogits, double* stats,
                          int64_t samples, int64_t ignore, unsigned long long* ignored) {
  if (batch == 0 || k == 0) return;
  if (ignored) {
    GT_CHECK_CUDA(cudaMemsetAsync(ignored, 0, sizeof *ignored, s));
    count_ignored_kernel<<<grid_for(batch, kThreads, kReduceBlocks), kThreads, 0, s>>>(labels, batch, ignore, ignored);
    GT_CHECK_LAUNCH();
  }
  const auto grid = static_cast<unsigned>(std::min<int64_t>((batch + kCeWarps - 1) / kCeWarps, kReduceBlocks));
  auto launch = [&](auto t) {
    using S = decltype(t);
    cross_entropy_kernel<S><<<grid, kCeWarps * kWarp, 0, s>>>(static_cast<const S*>(logits), labels, batch, k,
                                                              label_smoothing, scale, static_cast<S*>(dlogits), stats,
                                                              samples, ignore, ignored, scratch);
  };
  with_storage("cross_entropy", dtype, launch);
  GT_CHECK_LAUNCH();
}

void launch_mse(cudaStream_t s, ReduceScratch scratch, bool is_double, const void* pred, const void* target,
                int64_t batch, int64_t d, double scale, void* dpred, double* stats) {
  const int64_t n = batch * d;
  if (n == 0) return;
  const double grad_scale = scale * 2.0 / static_cast<double>(d);  // as the CPU computes it
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    mse_kernel<T><<<grid_for(n, kThreads, kReduceBlocks), kThreads, 0, s>>>(
        static_cast<const T*>(pred), static_cast<const T*>(target), n, d, grad_scale, static_cast<T*>(dpred), stats,
        scratch);
  });
  GT_CHECK_LAUNCH();
}

}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing, double scale, Tensor& dlogits,
                   Tensor& stats, const ops::CrossEntropyRows& rows) {
  const int device = logits.device().index;
  // The count of ignored rows lives in the device's scratch workspace until the loss kernel has read it.
  auto* ignored = rows.ignore_index == ops::kNoIgnore
                      ? nullptr
                      : static_cast<unsigned long long*>(workspace(device, sizeof(unsigned long long)));
  // f32 or f64, or 16-bit logits with a gradient of the same dtype (ops/loss.cpp sends other pairs through f32;
  // with_storage refuses any other dtype).
  launch_cross_entropy(stream(device), reduce_scratch(device), logits.dtype(), logits.raw(), labels.data<int32_t>(),
                       logits.dim(0), logits.dim(1), label_smoothing, scale, raw_or_null(dlogits), stats.data<double>(),
                       logits.dim(0) / rows.group, rows.ignore_index, ignored);
}

void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats) {
  const int64_t batch = pred.dim(0), d = pred.numel() / std::max<int64_t>(batch, 1);
  const int device = pred.device().index;
  launch_mse(stream(device), reduce_scratch(device), is_f64("mse", pred), pred.raw(), target.raw(), batch, d, scale,
             raw_or_null(dpred), stats.data<double>());
}

}  // namespace gt::cuda
