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

}  // namespace gt::ops
