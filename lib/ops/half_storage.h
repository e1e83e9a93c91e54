// Activations kept for the backward pass in 16 bits (Model::set_activation_storage, train.precision bf16/fp16):
// an f32 output rounded into a 16-bit copy after its last forward reader, and widened back before the backward pass
// reads it. ops/half_storage.cpp checks the contract; ops/cpu/half_storage.cpp and ops/cuda/half_storage.cpp
// implement it.
#pragma once

#include "core/half.h"
#include "core/tensor.h"
#include "ops/entry_points.h"

namespace gt::ops {

/// out[i] = y[i] rounded to `format` (nearest even; NaN stays NaN), for the y.numel() elements of an f32 tensor; `out`
/// is 16-bit storage of at least that many elements on y's device.
void pack_activation(HalfFormat format, const Tensor& y, void* out);
/// y[i] = in[i] widened exactly to f32: the inverse of pack_activation's storage (y f32, `in` on its device).
void unpack_activation(HalfFormat format, const void* in, Tensor& y);

/// A 2-D f32 tensor's values kept only in 16 bits (pack_activation's storage): rows × cols elements in `format`,
/// row-major, on the device of the tensors it is used with.
struct HalfMatrix {
  const void* data = nullptr;
  HalfFormat format = HalfFormat::bf16;
  int64_t rows = 0, cols = 0;
};

/// c = op(a) · b + beta · c for f32 a and c: what matmul(a, ta, b widened, false, c, beta) gives, bit for bit, under
/// any product precision (on CUDA, under the precision of b's format, b's elements are the product's 16-bit operand
/// as they are; under another, b is widened into scratch first). A dense layer's weight gradient (dW = dyᵀ·x) reads its
/// input this way when the model kept it in 16 bits (Layer::backward_takes_half_input), so that the input need not be
/// widened first: the native bf16 products (ops/cpu/bf16_gemm.h) pack b's bf16 elements as they are; other paths widen
/// b into scratch.
void matmul_half_b(const Tensor& a, bool trans_a, const HalfMatrix& b, Tensor& c, double beta);

}  // namespace gt::ops

GT_BACKEND_ENTRY_POINTS(pack_activation, unpack_activation, matmul_half_b)
