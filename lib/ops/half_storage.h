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

}  // namespace gt::ops

GT_BACKEND_ENTRY_POINTS(pack_activation, unpack_activation)
