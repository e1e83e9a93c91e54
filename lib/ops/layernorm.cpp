// The contract of layer normalisation (ops/layernorm.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/layernorm.h"

#include "ops/dispatch.h"
#include "ops/wide.h"

namespace gt::ops {
namespace {

// Whether the CUDA kernels take an input's and an output's dtypes as they are (ops/cuda/kernel_util.cuh's
// with_storage_pair): each f32 or one and the same 16-bit dtype, on a CUDA device, beside f32 parameters. The CPU
// and every other mix go through Wide.
bool cuda_takes_half(const Tensor& on, DType a, DType b, DType params) {
  return on.device().is_cuda() && params == DType::f32 &&
         ((is_half(a) && (b == a || b == DType::f32)) || (a == DType::f32 && is_half(b)));
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y) {
  const bool half = any_half({&x, &y});
  if (half && !cuda_takes_half(x, x.dtype(), y.dtype(), gamma.dtype())) {  // ops/wide.h: computed in f32
    Wide wide;
    Tensor yw = wide.out(y);
    layernorm_forward(wide.in(x), gamma, beta, eps, save_mean, save_invstd, yw);
    wide.finish();
    return;
  }
  // 16-bit x or y beside the f32 parameters, on CUDA: their kernel reads and writes them (checked above)
  const Operands op = half ? Operands("layernorm", {&gamma, &beta, &save_mean, &save_invstd}, {&x, &y})
                           : Operands("layernorm", {&x, &gamma, &beta, &save_mean, &save_invstd, &y});
  GT_CHECK(gamma.numel() > 0 && x.numel() % gamma.numel() == 0 && beta.numel() == gamma.numel() &&
               y.numel() == x.numel() && save_mean.numel() >= x.numel() / gamma.numel() &&
               save_invstd.numel() >= x.numel() / gamma.numel(),
           "layernorm sizes: x {} gamma {} beta {} y {}", x.shape().str(), gamma.shape().str(), beta.shape().str(),
           y.shape().str());
  GT_DISPATCH(op, layernorm_forward(x, gamma, beta, eps, save_mean, save_invstd, y));
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta) {
  const bool half = any_half({&x, &dy, &dx});
  if (half && !(cuda_takes_half(x, x.dtype(), dy.dtype(), gamma.dtype()) &&
                (!dx.defined() || dx.dtype() == x.dtype()))) {  // ops/wide.h: computed in f32
    Wide wide;
    Tensor dxw = wide.out(dx);
    layernorm_backward(wide.in(x), gamma, save_mean, save_invstd, wide.in(dy), dxw, dgamma, dbeta, beta);
    wide.finish();
    return;
  }
  // 16-bit x (and dx) or dy beside the f32 parameters, on CUDA: their kernels read and write them (checked above)
  const Operands op =
      half ? Operands("layernorm_backward", {&gamma, &dgamma, &dbeta}, {&x, &dy, &dx, &save_mean, &save_invstd})
           : Operands("layernorm_backward", {&x, &gamma, &dy, &dx, &dgamma, &dbeta}, {&save_mean, &save_invstd});
  GT_CHECK(gamma.numel() > 0 && x.numel() % gamma.numel() == 0 && dy.numel() == x.numel() &&
               (!dx.defined() || dx.numel() == x.numel()) && dgamma.numel() == gamma.numel() &&
               dbeta.numel() == gamma.numel() && save_mean.numel() >= x.numel() / gamma.numel() &&
               save_invstd.numel() >= x.numel() / gamma.numel(),
           "layernorm_backward sizes: x {} gamma {} dy {}", x.shape().str(), gamma.shape().str(), dy.shape().str());
  GT_DISPATCH(op, layernorm_backward(x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta, beta));
}

}  // namespace gt::ops
