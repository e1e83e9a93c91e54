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

/// A 2×2, stride-2, unpadded max pool over (B, C, H, W), then relu, in one pass (CPU): the same numbers bit for bit
/// as pool2d_forward then activation_forward.
void max_pool_relu_forward(const Tensor& x, Tensor& y);
/// Its backward from y = relu(pool(x)) and dy, in one pass: the same numbers bit for bit as activation_backward then
/// pool2d_backward.
void max_pool_relu_backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CUDA: cuDNN max pooling (padding never wins) or average pooling counting padding in the divisor; no dilation.
GT_BACKEND_ENTRY_POINTS(pool2d_forward, pool2d_backward)
// The fused max pool and relu is CPU-only (graph/model.h's chains run on the CPU).
GT_ENTRY_POINTS_IN_(cpu, max_pool_relu_forward, max_pool_relu_backward)
