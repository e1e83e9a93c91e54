// The contract of the embedding lookups (ops/embedding.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/embedding.h"

#include "ops/dispatch.h"

namespace gt::ops {

void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y) {
  const Operands op("embedding", {&idx, &weight, &y});
  GT_CHECK(weight.rank() == 2 && y.numel() == idx.numel() * weight.dim(1), "embedding sizes");
  GT_DISPATCH(op, embedding_forward(idx, weight, y));
}

void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta) {
  const Operands op("embedding_backward", {&idx, &dy, &dweight});
  GT_CHECK(dweight.rank() == 2 && dy.numel() == idx.numel() * dweight.dim(1), "embedding_backward sizes");
  GT_DISPATCH(op, embedding_backward(idx, dy, dweight, beta));
}

}  // namespace gt::ops
