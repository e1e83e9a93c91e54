// CPU backend entry points; ops.cpp has already checked shapes, dtypes and devices.
#pragma once

#include "core/tensor.h"
#include "ops/math.h"

#include <functional>

namespace gt::cpu {

/// Calls f(float{}) or f(double{}) for the tensor's element type; the kernels are templates over it.
template <class F> void for_float_type(DType t, F&& f) {
  if (t == DType::f32)
    f(float{});
  else if (t == DType::f64)
    f(double{});
  else
    throw Error(fmt::format("CPU kernel called on a {} tensor; it takes f32 or f64", dtype_name(t)));
}

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double beta);
void add_row_bias(Tensor& y, const Tensor& bias);
void sum_rows(const Tensor& dy, Tensor& db, double beta);
void activation_forward(Activation a, const Tensor& x, Tensor& y);
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);
void cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing, double scale,
                   Tensor& dlogits, Tensor& stats);
void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats);
void sgd_step(const SgdHyper& h, Tensor& param, const Tensor& grad, Tensor& momentum);
void adam_step(const AdamHyper& h, bool amsgrad, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax);
void sum_squares(const Tensor& grad, Tensor& out);
void scale_by(Tensor& x, const Tensor& scale);

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win, int64_t groups, Tensor& y);
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Window2d& win, int64_t groups,
                     Tensor& dx, Tensor& dw, Tensor& db, double beta);
void pool2d_forward(PoolKind kind, const Tensor& x, const Window2d& win, Tensor& y);
void pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Window2d& win, Tensor& dx);
void add(const Tensor& a, const Tensor& b, Tensor& y);
void copy_blocks(const Tensor& src, Tensor& dst, int64_t outer, int64_t src_inner, int64_t dst_inner,
                 int64_t dst_offset);
void split_blocks(const Tensor& whole, Tensor& part, int64_t outer, int64_t part_inner, int64_t whole_inner,
                  int64_t offset);

void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y);
void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta);
int64_t batchnorm_forward_sync(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                               Tensor& running_var, double momentum, double eps, Tensor& save_mean,
                               Tensor& save_invstd, Tensor& y, const std::function<void(double*, size_t)>& sum_over_ranks);
void batchnorm_backward_sync(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                             const Tensor& dy, int64_t global_count, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                             double beta, const std::function<void(double*, size_t)>& sum_over_ranks);
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y);
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta);
void softmax_forward(const Tensor& x, int64_t d, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx);
void dropout(const Tensor& x, double p, uint64_t key, uint64_t step, Tensor& y);
void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y);
void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta);

}  // namespace gt::cpu
