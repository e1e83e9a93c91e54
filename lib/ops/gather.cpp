// The contract of the row gathers (ops/gather.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/gather.h"

#include "ops/dispatch.h"

namespace gt::ops {

void gather_rows(const Tensor& src, const Tensor& order, int64_t first, Tensor& dst) {
  const Operands op("gather_rows", {&src, &dst}, {&src, &order, &dst});
  GT_CHECK(order.dtype() == DType::i32 && order.rank() == 1, "gather_rows: the order is i32 [M], got {} {}",
           dtype_name(order.dtype()), order.shape().str());
  GT_CHECK(src.rank() >= 1 && dst.rank() == src.rank() && dst.shape().sample() == src.shape().sample(),
           "gather_rows: rows of {} into {}", src.shape().str(), dst.shape().str());
  GT_CHECK(first >= 0 && first + dst.dim(0) <= order.numel(), "gather_rows: indices [{}, {}) of an order of {}", first,
           first + dst.dim(0), order.numel());
  GT_DISPATCH(op, gather_rows(src, order, first, dst));
}

}  // namespace gt::ops
