// The contract of softmax (ops/softmax.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/softmax.h"

#include "ops/dispatch.h"

namespace gt::ops {

void softmax_forward(const Tensor& x, int64_t d, Tensor& y) {
  const Operands op("softmax", {&x, &y});
  GT_CHECK(d > 0 && x.numel() % d == 0 && y.numel() == x.numel(), "softmax sizes");
  GT_DISPATCH(op, softmax_forward(x, d, y));
}

void softmax_backward(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx) {
  const Operands op("softmax_backward", {&y, &dy, &dx});
  GT_CHECK(d > 0 && y.numel() % d == 0 && dy.numel() == y.numel() && dx.numel() == y.numel(), "softmax_backward sizes");
  GT_DISPATCH(op, softmax_backward(y, dy, d, dx));
}

}  // namespace gt::ops
