// 2-D max and average pooling. ops/pool2d.cpp checks the contract; ops/cpu/pool2d.cpp and ops/cuda/pool2d.cpp
// (cuDNN) implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"
#include "ops/math.h"

namespace gt::ops {

/// Max or average pooling over (B, C, H, W); average counts padding in the divisor (PyTorch's default).
void pool2d_forward(PoolKind kind, const Tensor& x, const Window2d& win, Tensor& y);
void pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Window2d& win, Tensor& dx);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CUDA: cuDNN max pooling (padding never wins) or average pooling counting padding in the divisor; no dilation.
GT_BACKEND_ENTRY_POINTS(pool2d_forward, pool2d_backward)
