// Softmax over rows. ops/softmax.cpp checks the contract; ops/cpu/softmax.cpp and ops/cuda/softmax.cu implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"

namespace gt::ops {

/// Softmax over rows of length d; the backward pass needs only y.
void softmax_forward(const Tensor& x, int64_t d, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CUDA: one block per row.
GT_BACKEND_ENTRY_POINTS(softmax_forward, softmax_backward)
