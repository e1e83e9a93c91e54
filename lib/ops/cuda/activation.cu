// CUDA activations (ops/activation.h): one kernel per activation over the math shared with the CPU (ops/math.h). The
// tensors may be 16-bit activations, read and written as such: f32 math, each result rounded once (ops/wide.h's
// semantics, without its conversion passes).
#include "ops/activation.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/math.h"

#include <algorithm>
#include <type_traits>

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  // Grid-stride loops cover any n; cap the grid so huge tensors do not launch millions of blocks.
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 4));
}

// y may be x (matmul.cu's linear_forward_act activates a product's sum in place): each element is read and then
// written by the same thread, so no __restrict__. x is stored as X, y as Y (f32, f64 or 16 bits: kernel_util.cuh's
// load/store), computed on in T.
template <class X, class Y, Activation A, class T = compute_t<X, Y>>
__global__ void act_fwd_kernel(const X* x, Y* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = store<Y>(act_forward<T>(A, load(x[i])));
}

// x and dx are stored as X, y and dy as Y: a layer's input and its gradient share a dtype, as do its output and its
// gradient (Model::set_activation_dtype).
template <class X, class Y, Activation A, class T = compute_t<X, Y>>
__global__ void act_bwd_kernel(const X* __restrict__ x, const Y* __restrict__ y, const Y* __restrict__ dy,
                               X* __restrict__ dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dx[i] = store<X>(act_backward<T>(A, load(x[i]), load(y[i]), load(dy[i])));
}

void launch_activation_forward(cudaStream_t s, Activation a, DType x_type, DType y_type, const void* x, void* y,
                               int64_t n) {
  if (n == 0) return;
  with_storage_pair("activation_forward", x_type, y_type, [&](auto sx, auto sy) {
    using X = decltype(sx);
    using Y = decltype(sy);
    with_activation(a, [&](auto act) {
      act_fwd_kernel<X, Y, decltype(act)::value>
          <<<blocks_for(n), kThreads, 0, s>>>(static_cast<const X*>(x), static_cast<Y*>(y), n);
    });
  });
  GT_CHECK_LAUNCH();
}

void launch_activation_backward(cudaStream_t s, Activation a, DType x_type, DType y_type, const void* x, const void* y,
                                const void* dy, void* dx, int64_t n) {
  if (n == 0) return;
  with_storage_pair("activation_backward", x_type, y_type, [&](auto sx, auto sy) {
    using X = decltype(sx);
    using Y = decltype(sy);
    with_activation(a, [&](auto act) {
      act_bwd_kernel<X, Y, decltype(act)::value><<<blocks_for(n), kThreads, 0, s>>>(
          static_cast<const X*>(x), static_cast<const Y*>(y), static_cast<const Y*>(dy), static_cast<X*>(dx), n);
    });
  });
  GT_CHECK_LAUNCH();
}

}  // namespace

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  launch_activation_forward(stream(x.device().index), a, x.dtype(), y.dtype(), x.raw(), y.raw(), x.numel());
}

void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  launch_activation_backward(stream(x.device().index), a, x.dtype(), y.dtype(), x.raw(), y.raw(), dy.raw(), dx.raw(),
                             x.numel());
}

}  // namespace gt::cuda
