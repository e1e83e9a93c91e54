// The contract of the activations (ops/activation.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/activation.h"

#include "ops/dispatch.h"

namespace gt::ops {

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  const Operands op("activation", {&x, &y});
  GT_CHECK(x.numel() == y.numel(), "activation {} → {}", x.shape().str(), y.shape().str());
  GT_DISPATCH(op, activation_forward(a, x, y));
}

void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const Operands op("activation_backward", {&x, &y, &dy, &dx});
  GT_CHECK(x.numel() == y.numel() && dy.numel() == x.numel() && dx.numel() == x.numel(), "activation_backward sizes");
  GT_DISPATCH(op, activation_backward(a, x, y, dy, dx));
}

}  // namespace gt::ops
