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

void max_pool_relu_forward(const Tensor& x, Tensor& y) {
  const Operands op("max_pool_relu", {&x, &y});
  GT_CHECK(x.rank() == 4 && y.rank() == 4 && y.dim(0) == x.dim(0) && y.dim(1) == x.dim(1) && y.dim(2) == x.dim(2) / 2 &&
               y.dim(3) == x.dim(3) / 2,
           "max_pool_relu x {} y {}", x.shape().str(), y.shape().str());
  GT_CHECK(op.device().is_cpu(), "max_pool_relu on {}: CPU-only", op.device().str());
  cpu::max_pool_relu_forward(x, y);
}

void max_pool_relu_backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const Operands op("max_pool_relu_backward", {&x, &y, &dy, &dx});
  GT_CHECK(x.rank() == 4 && y.rank() == 4 && y.dim(0) == x.dim(0) && y.dim(1) == x.dim(1) && y.dim(2) == x.dim(2) / 2 &&
               y.dim(3) == x.dim(3) / 2 && dy.shape() == y.shape() && dx.shape() == x.shape(),
           "max_pool_relu_backward shapes");
  GT_CHECK(op.device().is_cpu(), "max_pool_relu_backward on {}: CPU-only", op.device().str());
  cpu::max_pool_relu_backward(x, y, dy, dx);
}

}  // namespace gt::ops
