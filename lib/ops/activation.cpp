// The contract of the activations (ops/activation.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/activation.h"

#include "ops/dispatch.h"
#include "ops/wide.h"

namespace gt::ops {

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  if (any_half({&x, &y})) {  // 16-bit activations (ops/wide.h): computed in f32
    Wide wide;
    Tensor yw = wide.out(y);
    activation_forward(a, wide.in(x), yw);
    wide.finish();
    return;
  }
  const Operands op("activation", {&x, &y});
  GT_CHECK(x.numel() == y.numel(), "activation {} → {}", x.shape().str(), y.shape().str());
  GT_DISPATCH(op, activation_forward(a, x, y));
}

void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (any_half({&x, &y, &dy, &dx})) {  // 16-bit activations (ops/wide.h): computed in f32
    Wide wide;
    Tensor dxw = wide.out(dx);
    activation_backward(a, wide.in(x), wide.in(y), wide.in(dy), dxw);
    wide.finish();
    return;
  }
  const Operands op("activation_backward", {&x, &y, &dy, &dx});
  GT_CHECK(x.numel() == y.numel() && dy.numel() == x.numel() && dx.numel() == x.numel(), "activation_backward sizes");
  GT_DISPATCH(op, activation_backward(a, x, y, dy, dx));
}

void activation_backward_half_x(Activation a, const HalfMatrix& x, const Tensor& dy, Tensor& dx) {
  const Operands op("activation_backward_half_x", {&dy, &dx});
  GT_CHECK(op.device().is_cpu(), "activation_backward_half_x: on the CPU only, not {}", op.device().str());
  GT_CHECK(a == Activation::relu || a == Activation::gelu || a == Activation::gelu_tanh,
           "activation_backward_half_x: an activation whose derivative reads x alone");
  GT_CHECK(dy.dtype() == DType::f32 && x.rows * x.cols == dy.numel() && dx.numel() == dy.numel() &&
               (x.data != nullptr || dy.numel() == 0),
           "activation_backward_half_x sizes: x [{}, {}], dy {}, dx {}", x.rows, x.cols, dy.shape().str(),
           dx.shape().str());
  cpu::activation_backward_half_x(a, x, dy, dx);
}

}  // namespace gt::ops
