// Layer normalisation over the last dimension. The per-element math is ops/math.h's, shared by
// ops/cpu/layernorm.cpp and ops/cuda/layernorm.cu; ops/layernorm.cpp checks the contract.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"

namespace gt::ops {

/// Layer normalisation over the last dimension (gamma's length); save_mean/save_invstd hold one value per row.
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y);
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CUDA: one block per row for the row statistics, column blocks for the parameter gradients; sums in double.
GT_BACKEND_ENTRY_POINTS(layernorm_forward, layernorm_backward)
