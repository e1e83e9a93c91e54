// The contract of the embedding lookups (ops/embedding.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/embedding.h"

#include "ops/dispatch.h"
#include "ops/wide.h"

namespace gt::ops {

void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y) {
  // On CUDA a 16-bit y beside the f32 table is written by the kernel itself (each weight rounded once)
  const bool half_y = is_half(y.dtype()) && weight.dtype() == DType::f32 && weight.device().is_cuda();
  if (any_half({&weight, &y}) && !half_y) {  // ops/wide.h: computed in f32
    Wide wide;
    Tensor yw = wide.out(y);
    embedding_forward(idx, wide.in(weight), yw);
    wide.finish();
    return;
  }
  const Operands op =
      half_y ? Operands("embedding", {&idx, &weight}, {&y}) : Operands("embedding", {&idx, &weight, &y});
  GT_CHECK(weight.rank() == 2 && y.numel() == idx.numel() * weight.dim(1), "embedding sizes");
  GT_DISPATCH(op, embedding_forward(idx, weight, y));
}

void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta) {
  // On CUDA a 16-bit dy beside the f32 table gradient is read by the kernel itself (widened exactly)
  const bool half_dy = is_half(dy.dtype()) && dweight.dtype() == DType::f32 && dweight.device().is_cuda();
  if (any_half({&dy, &dweight}) && !half_dy) {  // ops/wide.h: computed in f32
    Wide wide;
    Tensor dww = wide.out(dweight, beta != 0);
    embedding_backward(idx, wide.in(dy), dww, beta);
    wide.finish();
    return;
  }
  const Operands op = half_dy ? Operands("embedding_backward", {&idx, &dweight}, {&dy})
                              : Operands("embedding_backward", {&idx, &dy, &dweight});
  GT_CHECK(dweight.rank() == 2 && dy.numel() == idx.numel() * dweight.dim(1), "embedding_backward sizes");
  GT_DISPATCH(op, embedding_backward(idx, dy, dweight, beta));
}

}  // namespace gt::ops
