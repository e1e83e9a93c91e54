// CUDA activations (ops/activation.h): one kernel per activation over the math shared with the CPU (ops/math.h).
#include "ops/activation.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/math.h"

#include <algorithm>
#include <type_traits>

namespace gt::cuda {
namespace {

using kern::with_float_type;

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  // Grid-stride loops cover any n; cap the grid so huge tensors do not launch millions of blocks.
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 4));
}

// y may be x (matmul.cu's linear_forward_act activates a product's sum in place): each element is read and then
// written by the same thread, so no __restrict__.
template <class T, Activation A>
__global__ void act_fwd_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = act_forward<T>(A, x[i]);
}

template <class T, Activation A>
__global__ void act_bwd_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ dy,
                               T* __restrict__ dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dx[i] = act_backward<T>(A, x[i], y[i], dy[i]);
}

void launch_activation_forward(cudaStream_t s, Activation a, bool is_double, const void* x, void* y, int64_t n) {
  if (n == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    with_activation(a, [&](auto act) {
      act_fwd_kernel<T, decltype(act)::value>
          <<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n);
    });
  });
  GT_CHECK_LAUNCH();
}

void launch_activation_backward(cudaStream_t s, Activation a, bool is_double, const void* x, const void* y,
                                const void* dy, void* dx, int64_t n) {
  if (n == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    with_activation(a, [&](auto act) {
      act_bwd_kernel<T, decltype(act)::value><<<blocks_for(n), kThreads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), n);
    });
  });
  GT_CHECK_LAUNCH();
}

}  // namespace

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  launch_activation_forward(stream(x.device().index), a, x.dtype() == DType::f64, x.raw(), y.raw(), x.numel());
}

void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  launch_activation_backward(stream(x.device().index), a, x.dtype() == DType::f64, x.raw(), y.raw(), dy.raw(), dx.raw(),
                             x.numel());
}

}  // namespace gt::cuda
