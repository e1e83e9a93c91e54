// Element-wise activations (relu, tanh, sigmoid, gelu) and their derivatives. The per-element math is ops/math.h's,
// shared by ops/cpu/activation.cpp and ops/cuda/activation.cu; ops/activation.cpp checks the contract.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"
#include "ops/half_storage.h"
#include "ops/math.h"

namespace gt::ops {

/// y = f(x), element-wise.
void activation_forward(Activation a, const Tensor& x, Tensor& y);

/// dx = dy · f'(x) (y = f(x) is passed too since some derivatives are cheaper from it).
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);

/// activation_backward for an activation whose derivative reads x alone (relu, gelu, gelu_tanh) and an x kept only in
/// 16 bits (Model::set_activation_storage; x.rows · x.cols = dy.numel()), f32 dy and dx on the CPU: the same numbers
/// as activation_backward on x widened, widening x a piece at a time in cache instead of into a tensor first.
void activation_backward_half_x(Activation a, const HalfMatrix& x, const Tensor& dy, Tensor& dx);

}  // namespace gt::ops

namespace gt::cpu {

/// y[i] = f(x[i]) for i < n on the calling thread, with activation_forward's arithmetic (the same bits, wherever
/// the span starts): fused epilogues run it on blocks of a product while they are in cache. x and y may be the same.
void activation_span(Activation a, const float* x, float* y, int64_t n);
void activation_span(Activation a, const double* x, double* y, int64_t n);

}  // namespace gt::cpu

// The backends' entry points: the ops above call them once the contract holds.
GT_BACKEND_ENTRY_POINTS(activation_forward, activation_backward)
// activation_backward_half_x runs on the CPU only (Model hands 16-bit inputs to CPU models alone).
GT_ENTRY_POINTS_IN_(cpu, activation_backward_half_x)
