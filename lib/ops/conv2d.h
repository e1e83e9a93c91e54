// 2-D convolution (cross-correlation, as PyTorch's conv2d), groups and dilation included. ops/conv2d.cpp checks the
// contract; ops/cpu/conv2d.cpp (im2col + GEMM) and ops/cuda/conv2d.cpp (cuDNN) implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"
#include "ops/math.h"

namespace gt::ops {

/// 2-D convolution: x (B, C, H, W), w (O, C/groups, kh, kw), optional bias b (O) → y (B, O, oh, ow).
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win, int64_t groups, Tensor& y);
/// Gradients of conv2d: dx (if defined) = ∂L/∂x; dw (if defined: not for a frozen weight) = ∂L/∂w + beta·dw; db (if
/// defined) likewise.
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Window2d& win, int64_t groups,
                     Tensor& dx, Tensor& dw, Tensor& db, double beta);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CUDA: cuDNN's legacy API, algorithms chosen once per shape by its heuristics, fp32 without TF32.
GT_BACKEND_ENTRY_POINTS(conv2d_forward, conv2d_backward)
