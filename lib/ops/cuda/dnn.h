// The library-backed CUDA ops: matmul through cuBLASLt, convolution, pooling and batch normalisation through cuDNN.
// ops.cpp has checked shapes, dtypes and devices before it calls these; each one queues its work on the device's
// stream (context.h) and returns without waiting.
//
// Every op keeps a plan per shape (descriptors, the chosen algorithm and its workspace size), made on the first
// call with that shape, so a training step queries no heuristic after its first iteration. Plans live for the
// process; they are small (a few descriptors each) and a model has a handful of shapes.
#pragma once

#include "core/tensor.h"
#include "ops/math.h"

#include <cstdint>

namespace gt::cuda {

/// c = op(a) · op(b) + beta · c on row-major 2-D tensors, through cuBLASLt in the tensors' precision (f32 without
/// TF32, or f64).
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double beta);

/// cuDNN convolution (cross-correlation, as PyTorch's conv2d), groups and dilation included; b may be undefined.
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win, int64_t groups, Tensor& y);
/// dx (skipped when undefined) = ∂L/∂x; dw = ∂L/∂w + beta·dw; db (when defined) likewise.
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Window2d& win, int64_t groups,
                     Tensor& dx, Tensor& dw, Tensor& db, double beta);

/// cuDNN max pooling (padding never wins) or average pooling counting padding in the divisor.
void pool2d_forward(PoolKind kind, const Tensor& x, const Window2d& win, Tensor& y);
void pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Window2d& win, Tensor& dx);

/// cuDNN spatial batch normalisation over x viewed as (B, C, S); the semantics of ops::batchnorm_forward.
void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y);
void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta);

/// How many plans each op family has made (a plan is made on a cache miss: a shape not seen before). Tests use it
/// to check that a second call with the same shape reuses the plan.
struct DnnPlanCounts {
  int64_t matmul = 0, conv = 0, pool = 0, batchnorm = 0;
};
DnnPlanCounts dnn_plan_counts();

}  // namespace gt::cuda
