// The contract of the 16-bit activation copies (ops/half_storage.h): an f32 tensor (tensors are dense), then the
// backend's entry point.
#include "ops/half_storage.h"

#include "ops/dispatch.h"

namespace gt::ops {

void pack_activation(HalfFormat format, const Tensor& y, void* out) {
  const Operands op("pack_activation", {&y});
  GT_CHECK(y.dtype() == DType::f32, "pack_activation: an f32 tensor, got {} {}", dtype_name(y.dtype()),
           y.shape().str());
  GT_CHECK(out != nullptr || y.numel() == 0, "pack_activation: no storage for {} elements", y.numel());
  GT_DISPATCH(op, pack_activation(format, y, out));
}

void unpack_activation(HalfFormat format, const void* in, Tensor& y) {
  const Operands op("unpack_activation", {&y});
  GT_CHECK(y.dtype() == DType::f32, "unpack_activation: an f32 tensor, got {} {}", dtype_name(y.dtype()),
           y.shape().str());
  GT_CHECK(in != nullptr || y.numel() == 0, "unpack_activation: no storage for {} elements", y.numel());
  GT_DISPATCH(op, unpack_activation(format, in, y));
}

void matmul_half_b(const Tensor& a, bool ta, const HalfMatrix& b, Tensor& c, double beta) {
  const Operands op("matmul_half_b", {&a, &c});
  GT_CHECK(a.dtype() == DType::f32 && a.rank() == 2 && c.rank() == 2, "matmul_half_b: 2-D f32 operands, got {} {}",
           dtype_name(a.dtype()), a.shape().str());
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  GT_CHECK(b.rows == k && c.dim(0) == m && c.dim(1) == b.cols && (b.data != nullptr || b.rows * b.cols == 0),
           "matmul_half_b {}{} · [{}, {}] → {}", a.shape().str(), ta ? "ᵀ" : "", b.rows, b.cols, c.shape().str());
  GT_DISPATCH(op, matmul_half_b(a, ta, b, c, beta));
}

}  // namespace gt::ops
