// The op contract: shape, dtype and device checks, then dispatch to the backend of the tensors' device.
// Layers call these and never look at the device themselves.
#pragma once

#include "core/tensor.h"
#include "ops/math.h"

#include <functional>
#include <memory>
#include <vector>

namespace gt::ops {

/// c = op(a) · op(b) + beta · c for 2-D tensors; op transposes when the flag is set.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double beta);

/// y[r, :] += bias for every row r of the 2-D tensor y.
void add_row_bias(Tensor& y, const Tensor& bias);

/// db = Σ_r dy[r, :] + beta · db.
void sum_rows(const Tensor& dy, Tensor& db, double beta);

/// y = f(x), element-wise.
void activation_forward(Activation a, const Tensor& x, Tensor& y);

/// dx = dy · f'(x) (y = f(x) is passed too since some derivatives are cheaper from it).
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);

/// Softmax cross-entropy over logits (B, K) with int32 labels (B). Adds Σ loss to stats[0] and the number of
/// correct argmax predictions to stats[1] (stats: f64, 2 entries, on the logits' device, so nothing syncs).
/// When dlogits is defined, writes dlogits = scale · (softmax(logits) − onehot_smoothed(labels)).
/// label_smoothing ε mixes the one-hot target with the uniform distribution as PyTorch does. A NaN logit makes its
/// row's loss NaN (so the step's loss sum is NaN on every device). A label outside [0, K) is the caller's error: on
/// CUDA its row's loss is NaN and the row counts no hit, so the step gate skips the step.
void cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing, double scale,
                   Tensor& dlogits, Tensor& stats);

/// Mean squared error per sample: adds Σ_b mean_d (pred − target)² to stats[0]; when dpred is defined,
/// writes dpred = scale · 2 (pred − target) / D. pred and target are (B, D).
void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats);

/// Adds Σ grad² to out[0] (f64, on the gradient's device: no host sync).
void sum_squares(const Tensor& grad, Tensor& out);
/// x ← x · scale, where scale is read from a one-element f64 tensor on the same device.
void scale_by(Tensor& x, const Tensor& scale);

/// (StepStat, in ops/math.h, names the entries of a step's statistics tensor.)

/// Tensors one fused kernel updates together on CUDA (a loop over rows on the CPU): a row per parameter, holding
/// the tensors its update reads and writes in the order the op names. Built once with the optimizer; the CUDA
/// backend keeps its table of pointers and sizes in `device_table` from the first use on.
struct TensorGroup {
  std::vector<std::vector<Tensor>> rows;
  std::shared_ptr<void> device_table;
};

/// Adds Σ_rows Σ rows[r][column]² to out[0] and, when per_row (f64[rows]) is defined, each row's own sum to
/// per_row[r] (which parameter went non-finite); f64 on the group's device.
void sum_squares_group(TensorGroup& group, size_t column, Tensor& out, Tensor& per_row);
/// One SGD step over the group, rows (param, grad, momentum — undefined without momentum), gated and clipped by
/// the step's statistics: nothing changes unless stats[kLossSum] and stats[kGradSq] are finite, and when
/// max_norm > 0 each gradient is used multiplied by min(1, max_norm / (√stats[kGradSq] + 1e-6))
/// (torch.nn.utils.clip_grad_norm_'s coefficient). The CPU scales the gradients in place to do so; CUDA scales them
/// as it reads them and leaves them as they were, so read no gradient after a clipped step.
void sgd_step_group(const SgdHyper& h, TensorGroup& group, const Tensor& stats, double max_norm);
/// One Adam/AdamW step over rows (param, grad, m, v, vmax — undefined unless amsgrad), gated and clipped as above.
void adam_step_group(const AdamHyper& h, bool amsgrad, TensorGroup& group, const Tensor& stats, double max_norm);
/// window[0] += stats[kLossSum] and window[1] += stats[kHits] when the step's loss and gradient norm are finite;
/// window[2] += 1 (a skipped step) otherwise. window: f64[3] on the same device.
void accumulate_step(const Tensor& stats, Tensor& window);

/// 2-D convolution: x (B, C, H, W), w (O, C/groups, kh, kw), optional bias b (O) → y (B, O, oh, ow).
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win, int64_t groups, Tensor& y);
/// Gradients of conv2d: dx (if defined) = ∂L/∂x; dw = ∂L/∂w + beta·dw; db (if defined) likewise.
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Window2d& win, int64_t groups,
                     Tensor& dx, Tensor& dw, Tensor& db, double beta);
/// Max or average pooling over (B, C, H, W); average counts padding in the divisor (PyTorch's default).
void pool2d_forward(PoolKind kind, const Tensor& x, const Window2d& win, Tensor& y);
void pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Window2d& win, Tensor& dx);

/// y = a + b, element-wise (y may be a or b).
void add(const Tensor& a, const Tensor& b, Tensor& y);
/// Block copy for concatenation: for each of `outer` blocks, copies src's `src_inner` contiguous elements into dst
/// at offset `dst_offset` of dst's block of `dst_inner` elements.
void copy_blocks(const Tensor& src, Tensor& dst, int64_t outer, int64_t src_inner, int64_t dst_inner,
                 int64_t dst_offset);
/// The inverse of copy_blocks: part's blocks are taken out of whole's.
void split_blocks(const Tensor& whole, Tensor& part, int64_t outer, int64_t part_inner, int64_t whole_inner,
                  int64_t offset);

/// Batch normalisation over x viewed as (B, C, S): per-channel statistics of the batch in training (updating the
/// running ones with `momentum`, the variance unbiased as PyTorch keeps it), the running ones in evaluation.
/// save_mean and save_invstd (C) keep what the backward pass needs.
void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y);
void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta);
/// Sums `n` doubles in place over the ranks of a data-parallel run; every rank calls it at the same point.
using SumOverRanks = std::function<void(double* data, size_t n)>;
/// Training-mode batch norm over the global batch of a data-parallel run (dist.sync_batchnorm), CPU tensors only:
/// the local batch's per-channel Σx and Σx² (in double) and its count meet in one `sum_over_ranks` call (2C + 1
/// values); x is normalised with the global mean and variance, and the running statistics take the global ones (the
/// variance unbiased over the global count). Returns that count per channel (samples × spatial, all ranks), which
/// batchnorm_backward_sync needs.
int64_t batchnorm_forward_sync(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                               Tensor& running_var, double momentum, double eps, Tensor& save_mean,
                               Tensor& save_invstd, Tensor& y, const SumOverRanks& sum_over_ranks);
/// Its backward: when dx is wanted, the per-channel Σdy and Σdy·x̂ meet in one `sum_over_ranks` call (2C values), so
/// dx is the global batch's (for every rank's dy scaled alike, as each rank's mean loss makes it). dgamma and dbeta
/// stay the local sums: the gradient all-reduce averages them like every other parameter's.
void batchnorm_backward_sync(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                             const Tensor& dy, int64_t global_count, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                             double beta, const SumOverRanks& sum_over_ranks);
/// Layer normalisation over the last dimension (gamma's length); save_mean/save_invstd hold one value per row.
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y);
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta);
/// Softmax over rows of length d; the backward pass needs only y.
void softmax_forward(const Tensor& x, int64_t d, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx);
/// y = x · keep / (1 − p); keep is drawn from Philox for (key, step, element), so the backward pass (the same call
/// on dy) regenerates the mask instead of storing it.
void dropout(const Tensor& x, double p, uint64_t key, uint64_t step, Tensor& y);
/// y[k, :] = weight[round(idx[k]), :]; an index outside [0, V) (or not within 1e-3 of an integer) is a runtime error.
/// The CPU throws. A CUDA kernel cannot throw without a host synchronisation, so on CUDA that row of y is NaN
/// instead: the loss turns NaN and the step's gate (stats, above) skips the update, visibly, as a skipped step.
void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y);
/// dweight[round(idx[k]), :] += dy[k, :] after dweight ← beta · dweight; rows of invalid indices are skipped. On CUDA
/// repeated indices add up with atomics, in no fixed order.
void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta);

}  // namespace gt::ops
