// The contract of pool2d (ops/pool2d.h): shapes, dtypes and devices, then the backend's entry point.
#include "ops/pool2d.h"

#include "ops/dispatch.h"

namespace gt::ops {

void pool2d_forward(PoolKind kind, const Tensor& x, const Window2d& win, Tensor& y) {
  const Operands op("pool2d", {&x, &y});
  GT_CHECK(x.rank() == 4 && y.rank() == 4 && y.dim(0) == x.dim(0) && y.dim(1) == x.dim(1), "pool2d shapes");
  GT_DISPATCH(op, pool2d_forward(kind, x, win, y));
}

void pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Window2d& win, Tensor& dx) {
  const Operands op("pool2d_backward", {&x, &dy, &dx});
  GT_CHECK(dx.shape() == x.shape(), "pool2d_backward shapes");
  GT_DISPATCH(op, pool2d_backward(kind, x, dy, win, dx));
}

}  // namespace gt::ops
