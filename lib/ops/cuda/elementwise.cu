// Element-wise CUDA kernels: activations and the SGD and Adam updates, over the math shared with the CPU (math.h).
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.h"

#include <algorithm>
#include <type_traits>

namespace gt::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  // Grid-stride loops cover any n; cap the grid so huge tensors do not launch millions of blocks.
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 4));
}

template <class T, Activation A> __global__ void act_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = act_forward<T>(A, x[i]);
}

template <class T, Activation A>
__global__ void act_bwd_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ dy,
                               T* __restrict__ dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dx[i] = act_backward<T>(A, x[i], y[i], dy[i]);
}

template <class T, bool kMomentum, bool kNesterov>
__global__ void sgd_kernel(SgdHyper h, T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    T unused = 0;
    sgd_update<T, kMomentum, kNesterov>(h, p[i], g[i], kMomentum ? m[i] : unused);
  }
}

template <class T, bool kAmsgrad>
__global__ void adam_kernel(AdamHyper h, T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                            T* __restrict__ v, T* __restrict__ vmax, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    T unused = 0;
    adam_update<T, kAmsgrad>(h, p[i], g[i], m[i], v[i], kAmsgrad ? vmax[i] : unused);
  }
}

// Calls f with the activation as a compile-time constant, so each kernel is specialised.
template <class F> void with_activation(Activation a, F&& f) {
  switch (a) {
    case Activation::relu: f(std::integral_constant<Activation, Activation::relu>{}); break;
    case Activation::tanh: f(std::integral_constant<Activation, Activation::tanh>{}); break;
    case Activation::sigmoid: f(std::integral_constant<Activation, Activation::sigmoid>{}); break;
    case Activation::gelu: f(std::integral_constant<Activation, Activation::gelu>{}); break;
  }
}

template <class F> void with_float_type(bool is_double, F&& f) {
  if (is_double)
    f(double{});
  else
    f(float{});
}

}  // namespace

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

void launch_activation_backward(cudaStream_t s, Activation a, bool is_double, const void* x, const void* y, const void* dy, void* dx,
                                int64_t n) {
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

void launch_sgd(cudaStream_t s, const SgdHyper& h, bool is_double, void* param, const void* grad, void* momentum, int64_t n) {
  if (n == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    T* p = static_cast<T*>(param);
    const T* g = static_cast<const T*>(grad);
    T* m = static_cast<T*>(momentum);
    if (!m)
      sgd_kernel<T, false, false><<<blocks_for(n), kThreads, 0, s>>>(h, p, g, m, n);
    else if (h.nesterov)
      sgd_kernel<T, true, true><<<blocks_for(n), kThreads, 0, s>>>(h, p, g, m, n);
    else
      sgd_kernel<T, true, false><<<blocks_for(n), kThreads, 0, s>>>(h, p, g, m, n);
  });
  GT_CHECK_LAUNCH();
}

void launch_adam(cudaStream_t s, const AdamHyper& h, bool amsgrad, bool is_double, void* param, const void* grad,
                 void* m, void* v, void* vmax, int64_t n) {
  if (n == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    T *p = static_cast<T*>(param), *pm = static_cast<T*>(m), *pv = static_cast<T*>(v), *pmax = static_cast<T*>(vmax);
    const T* g = static_cast<const T*>(grad);
    if (amsgrad)
      adam_kernel<T, true><<<blocks_for(n), kThreads, 0, s>>>(h, p, g, pm, pv, pmax, n);
    else
      adam_kernel<T, false><<<blocks_for(n), kThreads, 0, s>>>(h, p, g, pm, pv, pmax, n);
  });
  GT_CHECK_LAUNCH();
}

}  // namespace gt::cuda
