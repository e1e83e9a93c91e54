// The contract of layer normalisation (ops/layernorm.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/layernorm.h"

#include "ops/dispatch.h"
#include "ops/wide.h"

namespace gt::ops {

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y) {
  if (any_half({&x, &y})) {  // 16-bit activations (ops/wide.h): computed in f32
    Wide wide;
    Tensor yw = wide.out(y);
    layernorm_forward(wide.in(x), gamma, beta, eps, save_mean, save_invstd, yw);
    wide.finish();
    return;
  }
  const Operands op("layernorm", {&x, &gamma, &beta, &save_mean, &save_invstd, &y});
  GT_CHECK(gamma.numel() > 0 && x.numel() % gamma.numel() == 0 && beta.numel() == gamma.numel() &&
               y.numel() == x.numel() && save_mean.numel() >= x.numel() / gamma.numel() &&
               save_invstd.numel() >= x.numel() / gamma.numel(),
           "layernorm sizes: x {} gamma {} beta {} y {}", x.shape().str(), gamma.shape().str(), beta.shape().str(),
           y.shape().str());
  GT_DISPATCH(op, layernorm_forward(x, gamma, beta, eps, save_mean, save_invstd, y));
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta) {
  if (any_half({&x, &dy, &dx})) {  // 16-bit activations (ops/wide.h): computed in f32
    Wide wide;
    Tensor dxw = wide.out(dx);
    layernorm_backward(wide.in(x), gamma, save_mean, save_invstd, wide.in(dy), dxw, dgamma, dbeta, beta);
    wide.finish();
    return;
  }
  const Operands op("layernorm_backward", {&x, &gamma, &dy, &dx, &dgamma, &dbeta}, {&save_mean, &save_invstd});
  GT_CHECK(gamma.numel() > 0 && x.numel() % gamma.numel() == 0 && dy.numel() == x.numel() &&
               (!dx.defined() || dx.numel() == x.numel()) && dgamma.numel() == gamma.numel() &&
               dbeta.numel() == gamma.numel() && save_mean.numel() >= x.numel() / gamma.numel() &&
               save_invstd.numel() >= x.numel() / gamma.numel(),
           "layernorm_backward sizes: x {} gamma {} dy {}", x.shape().str(), gamma.shape().str(), dy.shape().str());
  GT_DISPATCH(op, layernorm_backward(x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta, beta));
}

}  // namespace gt::ops
