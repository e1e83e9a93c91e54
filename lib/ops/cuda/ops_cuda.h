// CUDA backend entry points that exist so far; ops.cpp has checked shapes, dtypes and devices.
// Each kernel runs the same per-element math (ops/math.h) as its CPU twin.
#pragma once

#include "core/tensor.h"
#include "ops/math.h"

namespace gt::cuda {

void activation_forward(Activation a, const Tensor& x, Tensor& y);
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);
void sgd_step(const SgdHyper& h, Tensor& param, const Tensor& grad, Tensor& momentum);

}  // namespace gt::cuda
