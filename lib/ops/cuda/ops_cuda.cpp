// Tensor entry points of the CUDA backend: pick the device, then call the launchers in launch.h.
#include "ops/cuda/ops_cuda.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.h"

namespace gt::cuda {

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  GT_CHECK_CUDA(cudaSetDevice(x.device().index));
  launch_activation_forward(a, x.dtype() == DType::f64, x.raw(), y.raw(), x.numel());
}

void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  GT_CHECK_CUDA(cudaSetDevice(x.device().index));
  launch_activation_backward(a, x.dtype() == DType::f64, x.raw(), y.raw(), dy.raw(), dx.raw(), x.numel());
}

void sgd_step(const SgdHyper& h, Tensor& param, const Tensor& grad, Tensor& momentum) {
  GT_CHECK_CUDA(cudaSetDevice(param.device().index));
  launch_sgd(h, param.dtype() == DType::f64, param.raw(), grad.raw(), momentum.defined() ? momentum.raw() : nullptr,
             param.numel());
}

}  // namespace gt::cuda
