// The contract of conv2d (ops/conv2d.h): shapes, dtypes and devices, then the backend's entry point.
#include "ops/conv2d.h"

#include "ops/dispatch.h"

namespace gt::ops {

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win, int64_t groups, Tensor& y) {
  const Operands op("conv2d", {&x, &w, &b, &y});
  GT_CHECK(x.rank() == 4 && w.rank() == 4 && y.rank() == 4, "conv2d wants 4-D x, w, y");
  GT_CHECK(x.dim(1) == w.dim(1) * groups && y.dim(1) == w.dim(0) && y.dim(0) == x.dim(0) &&
               y.dim(2) == window_out(x.dim(2), win.kh, win.sh, win.ph, win.dh) &&
               y.dim(3) == window_out(x.dim(3), win.kw, win.sw, win.pw, win.dw),
           "conv2d x {} w {} → y {}", x.shape().str(), w.shape().str(), y.shape().str());
  GT_DISPATCH(op, conv2d_forward(x, w, b, win, groups, y));
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Window2d& win, int64_t groups,
                     Tensor& dx, Tensor& dw, Tensor& db, double beta) {
  const Operands op("conv2d_backward", {&x, &w, &dy, &dx, &dw, &db});
  GT_CHECK((!dw.defined() || dw.shape() == w.shape()) && (!dx.defined() || dx.shape() == x.shape()),
           "conv2d_backward shapes");
  GT_DISPATCH(op, conv2d_backward(x, w, dy, win, groups, dx, dw, db, beta));
}

}  // namespace gt::ops
