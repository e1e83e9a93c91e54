// Softmax over rows. ops/softmax.cpp checks the contract; ops/cpu/softmax.cpp and ops/cuda/softmax.cu implement it.
#pragma once

#include "core/tensor.h"

namespace gt::ops {

/// Softmax over rows of length d; the backward pass needs only y.
void softmax_forward(const Tensor& x, int64_t d, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
namespace gt::cpu {
decltype(ops::softmax_forward) softmax_forward;
decltype(ops::softmax_backward) softmax_backward;
}  // namespace gt::cpu

#if GT_WITH_CUDA
namespace gt::cuda {
/// One block per row.
decltype(ops::softmax_forward) softmax_forward;
decltype(ops::softmax_backward) softmax_backward;
}  // namespace gt::cuda
#endif
