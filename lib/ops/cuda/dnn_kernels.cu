// The batch-norm pieces cuDNN has no call for: the saved statistics of an evaluation pass and the backward pass
// through fixed (running) statistics.
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dnn_launch.h"

#include <algorithm>

namespace gt::cuda {
namespace {

constexpr int kThreads = 256;  // a power of two: the block reduction halves it

template <class T>
__global__ void bn_eval_stats_kernel(const T* __restrict__ rm, const T* __restrict__ rv, double eps,
                                     T* __restrict__ sm, T* __restrict__ si, int64_t channels) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    sm[c] = rm[c];
    si[c] = static_cast<T>(1.0 / sqrt(static_cast<double>(rv[c]) + eps));  // in double, as the CPU computes it
  }
}

// One block per channel c: the block's threads stride over the channel's batch·spatial elements, write dx on the
// way, and reduce Σ dy and Σ dy·(x − mean) in double (the CPU sums rows in T and combines them in double).
template <class T>
__global__ void bn_eval_backward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                        const T* __restrict__ mean, const T* __restrict__ invstd,
                                        const T* __restrict__ dy, T* __restrict__ dx, T* __restrict__ dgamma,
                                        T* __restrict__ dbeta, double beta, int64_t batch, int64_t channels,
                                        int64_t spatial) {
  __shared__ double part_dy[kThreads], part_dyx[kThreads];
  const int64_t c = blockIdx.x;
  const double m = static_cast<double>(mean[c]), inv = static_cast<double>(invstd[c]);
  const T k = static_cast<T>(static_cast<double>(gamma[c]) * inv);
  const int64_t n = batch * spatial;
  double s_dy = 0, s_dyx = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t b = j / spatial, i = j - b * spatial;
    const int64_t at = (b * channels + c) * spatial + i;  // x (batch, channels, spatial)
    const T g = dy[at];
    s_dy += static_cast<double>(g);
    s_dyx += static_cast<double>(g) * (static_cast<double>(x[at]) - m);
    if (dx) dx[at] = k * g;
  }
  part_dy[threadIdx.x] = s_dy;
  part_dyx[threadIdx.x] = s_dyx;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      part_dy[threadIdx.x] += part_dy[threadIdx.x + stride];
      part_dyx[threadIdx.x] += part_dyx[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    // beta = 0 overwrites without reading the old gradient (it may be uninitialised).
    dgamma[c] = static_cast<T>(part_dyx[0] * inv + (beta != 0 ? beta * static_cast<double>(dgamma[c]) : 0.0));
    dbeta[c] = static_cast<T>(part_dy[0] + (beta != 0 ? beta * static_cast<double>(dbeta[c]) : 0.0));
  }
}

}  // namespace

void launch_bn_eval_stats(cudaStream_t s, bool is_double, const void* running_mean, const void* running_var,
                          double eps, void* save_mean, void* save_invstd, int64_t channels) {
  if (channels == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((channels + kThreads - 1) / kThreads, 1024));
  if (is_double)
    bn_eval_stats_kernel<double><<<blocks, kThreads, 0, s>>>(
        static_cast<const double*>(running_mean), static_cast<const double*>(running_var), eps,
        static_cast<double*>(save_mean), static_cast<double*>(save_invstd), channels);
  else
    bn_eval_stats_kernel<float><<<blocks, kThreads, 0, s>>>(
        static_cast<const float*>(running_mean), static_cast<const float*>(running_var), eps,
        static_cast<float*>(save_mean), static_cast<float*>(save_invstd), channels);
  GT_CHECK_LAUNCH();
}

void launch_bn_eval_backward(cudaStream_t s, bool is_double, const void* x, const void* gamma, const void* save_mean,
                             const void* save_invstd, const void* dy, void* dx, void* dgamma, void* dbeta, double beta,
                             int64_t batch, int64_t channels, int64_t spatial) {
  if (channels == 0) return;
  // One block per channel; a grid's x extent allows 2³¹ − 1 blocks, far more channels than a layer has.
  const unsigned blocks = static_cast<unsigned>(channels);
  auto go = [&](auto zero) {
    using T = decltype(zero);
    bn_eval_backward_kernel<T><<<blocks, kThreads, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(save_mean),
        static_cast<const T*>(save_invstd), static_cast<const T*>(dy), static_cast<T*>(dx), static_cast<T*>(dgamma),
        static_cast<T*>(dbeta), beta, batch, channels, spatial);
  };
  if (is_double)
    go(double{});
  else
    go(float{});
  GT_CHECK_LAUNCH();
}

}  // namespace gt::cuda
