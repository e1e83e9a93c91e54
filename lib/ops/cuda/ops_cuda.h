// CUDA backend entry points; ops.cpp has checked shapes, dtypes and devices.
// Each kernel runs the same per-element math (ops/math.h) as its CPU twin.
#pragma once

#include "core/tensor.h"
#include "ops/math.h"
#include "ops/ops.h"

namespace gt::cuda {

void activation_forward(Activation a, const Tensor& x, Tensor& y);
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);
void sgd_step(const SgdHyper& h, Tensor& param, const Tensor& grad, Tensor& momentum);

void sum_squares_group(ops::TensorGroup& g, size_t column, Tensor& out, Tensor& per_row);
void sgd_step_group(const SgdHyper& h, ops::TensorGroup& g, const Tensor& stats, double max_norm);
void adam_step_group(const AdamHyper& h, bool amsgrad, ops::TensorGroup& g, const Tensor& stats, double max_norm);
void accumulate_step(const Tensor& stats, Tensor& window);

}  // namespace gt::cuda
