// CUDA backend entry points; ops.cpp has checked shapes, dtypes and devices.
// Each kernel runs the same per-element math (ops/math.h) as its CPU twin.
#pragma once

#include "core/tensor.h"
#include "ops/math.h"
#include "ops/ops.h"

namespace gt::cuda {

void activation_forward(Activation a, const Tensor& x, Tensor& y);
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);

void add_row_bias(Tensor& y, const Tensor& bias);
void sum_rows(const Tensor& dy, Tensor& db, double beta);
void sum_squares(const Tensor& grad, Tensor& out);
void scale_by(Tensor& x, const Tensor& scale);
void add(const Tensor& a, const Tensor& b, Tensor& y);
void copy_blocks(const Tensor& src, Tensor& dst, int64_t outer, int64_t src_inner, int64_t dst_inner,
                 int64_t dst_offset);
void split_blocks(const Tensor& whole, Tensor& part, int64_t outer, int64_t part_inner, int64_t whole_inner,
                  int64_t offset);

void cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing, double scale, Tensor& dlogits,
                   Tensor& stats);
void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats);

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y);
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta);
void softmax_forward(const Tensor& x, int64_t d, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx);
void dropout(const Tensor& x, double p, uint64_t key, uint64_t step, Tensor& y);
void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y);
void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta);

void sum_squares_group(ops::TensorGroup& g, size_t column, Tensor& out, Tensor& per_row);
void sgd_step_group(const SgdHyper& h, ops::TensorGroup& g, const Tensor& stats, double max_norm);
void adam_step_group(const AdamHyper& h, bool amsgrad, ops::TensorGroup& g, const Tensor& stats, double max_norm);
void accumulate_step(const Tensor& stats, Tensor& window);

}  // namespace gt::cuda
