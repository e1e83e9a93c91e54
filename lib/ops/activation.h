// Element-wise activations (relu, tanh, sigmoid, gelu) and their derivatives. The per-element math is ops/math.h's,
// shared by ops/cpu/activation.cpp and ops/cuda/activation.cu; ops/activation.cpp checks the contract.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"
#include "ops/math.h"

namespace gt::ops {

/// y = f(x), element-wise.
void activation_forward(Activation a, const Tensor& x, Tensor& y);

/// dx = dy · f'(x) (y = f(x) is passed too since some derivatives are cheaper from it).
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
GT_BACKEND_ENTRY_POINTS(activation_forward, activation_backward)
