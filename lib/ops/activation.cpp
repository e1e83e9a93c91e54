// The contract of the activations (ops/activation.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/activation.h"

#include "ops/dispatch.h"
#include "ops/wide.h"

namespace gt::ops {
namespace {

// Whether the CUDA kernels take an input's and an output's dtypes as they are (ops/cuda/kernel_util.cuh's
// with_storage_pair): each f32 or one and the same 16-bit dtype, on a CUDA device. The CPU and every other mix go
// through Wide.
bool cuda_takes_half(const Tensor& on, DType a, DType b) {
  return on.device().is_cuda() && ((is_half(a) && (b == a || b == DType::f32)) || (a == DType::f32 && is_half(b)));
}

}  // namespace

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  const bool half = any_half({&x, &y});
  if (half && !cuda_takes_half(x, x.dtype(), y.dtype())) {  // ops/wide.h: computed in f32
    Wide wide;
    Tensor yw = wide.out(y);
    activation_forward(a, wide.in(x), yw);
    wide.finish();
    return;
  }
  // 16-bit x or y on CUDA, of one 16-bit dtype beside f32: the kernel reads and writes them (checked above)
  const Operands op = half ? Operands("activation", {}, {&x, &y}) : Operands("activation", {&x, &y});
  GT_CHECK(x.numel() == y.numel(), "activation {} → {}", x.shape().str(), y.shape().str());
  GT_DISPATCH(op, activation_forward(a, x, y));
}

void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  // On CUDA x and dx share a dtype, y and dy share one (a layer's input and its gradient, its output and its
  // gradient), the two f32 or one 16-bit dtype: the kernel reads and writes them. Other mixes through ops/wide.h.
  const bool half = any_half({&x, &y, &dy, &dx});
  if (half && !(cuda_takes_half(x, x.dtype(), y.dtype()) && dx.dtype() == x.dtype() && dy.dtype() == y.dtype())) {
    Wide wide;
    Tensor dxw = wide.out(dx);
    activation_backward(a, wide.in(x), wide.in(y), wide.in(dy), dxw);
    wide.finish();
    return;
  }
  const Operands op = half ? Operands("activation_backward", {&x, &dx}, {&y, &dy})
                           : Operands("activation_backward", {&x, &y, &dy, &dx});
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
