// Fused multi-tensor kernels over a TensorGroup: the gradient norm, the SGD and Adam updates (gated by the step's
// statistics and clipped on the fly) and the window accumulation. One launch per optimizer step however many
// parameters the model has; the per-element math is ops/math.h's, shared with the CPU.
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/group.h"

#include <algorithm>

namespace gt::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(const GroupTable& t) { return static_cast<int>(std::min<int64_t>(t.view.num_chunks, 65535)); }

// Whether the step may update (loss and gradient norm finite), and the clip coefficient (1 when not clipping).
__device__ bool step_ok(const double* stats) {
  return isfinite(stats[kLossSum]) && isfinite(stats[kGradSq]);
}
__device__ double clip_coef(const double* stats, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (sqrt(stats[kGradSq]) + 1e-6);
  return c < 1.0 ? c : 1.0;
}

// One chunk at a time per block (the loop bound is the same for every thread of the block, so the barriers are
// safe): each chunk's sum goes to the total and to its row's entry.
template <class T> __global__ void sum_squares_kernel(GroupView t, int column, double* out, double* per_row) {
  __shared__ double partial[kThreads];
  for (int64_t c = blockIdx.x; c < t.num_chunks; c += gridDim.x) {
    const GroupChunk ch = t.chunks[c];
    const T* g = static_cast<const T*>(t.ptrs[ch.row * t.width + column]);
    double acc = 0;
    for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) acc += double(g[i]) * double(g[i]);
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = kThreads / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      atomicAdd(out, partial[0]);
      if (per_row) atomicAdd(per_row + ch.row, partial[0]);
    }
    __syncthreads();  // partial[] is reused by the next chunk
  }
}

template <class T, bool kMomentum, bool kNesterov>
__global__ void sgd_group_kernel(SgdHyper h, GroupView t, const double* stats, double max_norm) {
  if (!step_ok(stats)) return;
  const double coef = clip_coef(stats, max_norm);
  for (int64_t c = blockIdx.x; c < t.num_chunks; c += gridDim.x) {
    const GroupChunk ch = t.chunks[c];
    void** row = t.ptrs + ch.row * t.width;
    T* p = static_cast<T*>(row[0]);
    const T* g = static_cast<const T*>(row[1]);
    T* m = static_cast<T*>(row[2]);
    for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
      const T gi = coef < 1.0 ? static_cast<T>(g[i] * coef) : g[i];
      T unused = 0;
      sgd_update<T, kMomentum, kNesterov>(h, p[i], gi, kMomentum ? m[i] : unused);
    }
  }
}

template <class T, bool kAmsgrad>
__global__ void adam_group_kernel(AdamHyper h, GroupView t, const double* stats, double max_norm) {
  if (!step_ok(stats)) return;
  const double coef = clip_coef(stats, max_norm);
  for (int64_t c = blockIdx.x; c < t.num_chunks; c += gridDim.x) {
    const GroupChunk ch = t.chunks[c];
    void** row = t.ptrs + ch.row * t.width;
    T* p = static_cast<T*>(row[0]);
    const T* g = static_cast<const T*>(row[1]);
    T* m = static_cast<T*>(row[2]);
    T* v = static_cast<T*>(row[3]);
    T* vmax = static_cast<T*>(row[4]);
    for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
      const T gi = coef < 1.0 ? static_cast<T>(g[i] * coef) : g[i];
      T unused = 0;
      adam_update<T, kAmsgrad>(h, p[i], gi, m[i], v[i], kAmsgrad ? vmax[i] : unused);
    }
  }
}

__global__ void accumulate_kernel(const double* stats, double* window) {
  if (isfinite(stats[kLossSum]) && isfinite(stats[kGradSq])) {
    window[0] += stats[kLossSum];
    window[1] += stats[kHits];
  } else {
    window[2] += 1;
  }
}

}  // namespace

GroupTable::~GroupTable() {
  // cudaFree waits for queued kernels that may still read the table. Errors at teardown are not reported.
  if (cudaSetDevice(device) != cudaSuccess) return;
  cudaFree(view.ptrs);
  cudaFree(view.chunks);
}

void launch_sum_squares_group(cudaStream_t s, const GroupTable& t, int column, double* out, double* per_row) {
  if (t.view.num_chunks == 0) return;
  if (t.view.is_double)
    sum_squares_kernel<double><<<grid_for(t), kThreads, 0, s>>>(t.view, column, out, per_row);
  else
    sum_squares_kernel<float><<<grid_for(t), kThreads, 0, s>>>(t.view, column, out, per_row);
  GT_CHECK_LAUNCH();
}

void launch_sgd_group(cudaStream_t s, const SgdHyper& h, const GroupTable& t, const double* stats, double max_norm) {
  if (t.view.num_chunks == 0) return;
  const bool momentum = h.momentum != 0;
  auto go = [&](auto zero) {
    using T = decltype(zero);
    if (!momentum)
      sgd_group_kernel<T, false, false><<<grid_for(t), kThreads, 0, s>>>(h, t.view, stats, max_norm);
    else if (h.nesterov)
      sgd_group_kernel<T, true, true><<<grid_for(t), kThreads, 0, s>>>(h, t.view, stats, max_norm);
    else
      sgd_group_kernel<T, true, false><<<grid_for(t), kThreads, 0, s>>>(h, t.view, stats, max_norm);
  };
  if (t.view.is_double)
    go(double{});
  else
    go(float{});
  GT_CHECK_LAUNCH();
}

void launch_adam_group(cudaStream_t s, const AdamHyper& h, bool amsgrad, const GroupTable& t, const double* stats,
                       double max_norm) {
  if (t.view.num_chunks == 0) return;
  auto go = [&](auto zero) {
    using T = decltype(zero);
    if (amsgrad)
      adam_group_kernel<T, true><<<grid_for(t), kThreads, 0, s>>>(h, t.view, stats, max_norm);
    else
      adam_group_kernel<T, false><<<grid_for(t), kThreads, 0, s>>>(h, t.view, stats, max_norm);
  };
  if (t.view.is_double)
    go(double{});
  else
    go(float{});
  GT_CHECK_LAUNCH();
}

void launch_accumulate_step(cudaStream_t s, const double* stats, double* window) {
  accumulate_kernel<<<1, 1, 0, s>>>(stats, window);
  GT_CHECK_LAUNCH();
}

}  // namespace gt::cuda
