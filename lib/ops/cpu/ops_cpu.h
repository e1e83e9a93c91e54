// CPU backend entry points; ops.cpp has already checked shapes, dtypes and devices.
#pragma once

#include "core/tensor.h"
#include "ops/math.h"

namespace gt::cpu {

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double beta);
void add_row_bias(Tensor& y, const Tensor& bias);
void sum_rows(const Tensor& dy, Tensor& db, double beta);
void activation_forward(Activation a, const Tensor& x, Tensor& y);
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);
void cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing, double scale,
                   Tensor& dlogits, Tensor& stats);
void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats);
void sgd_step(const SgdHyper& h, Tensor& param, const Tensor& grad, Tensor& momentum);

}  // namespace gt::cpu
