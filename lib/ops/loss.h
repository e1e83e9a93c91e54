// The losses: softmax cross-entropy and mean squared error, each adding its sums into the step's statistics on the
// device. ops/loss.cpp checks the contract; ops/cpu/loss.cpp and ops/cuda/loss.cu implement it.
#pragma once

#include "core/tensor.h"

namespace gt::ops {

/// Softmax cross-entropy over logits (B, K) with int32 labels (B). Adds Σ loss to stats[0] and the number of
/// correct argmax predictions to stats[1] (stats: f64, 2 entries, on the logits' device, so nothing syncs).
/// When dlogits is defined, writes dlogits = scale · (softmax(logits) − onehot_smoothed(labels)).
/// label_smoothing ε mixes the one-hot target with the uniform distribution as PyTorch does. A NaN logit makes its
/// row's loss NaN (so the step's loss sum is NaN on every device). A label outside [0, K) is the caller's error: on
/// CUDA its row's loss is NaN and the row counts no hit, so the step gate skips the step.
void cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing, double scale, Tensor& dlogits,
                   Tensor& stats);

/// Mean squared error per sample: adds Σ_b mean_d (pred − target)² to stats[0]; when dpred is defined,
/// writes dpred = scale · 2 (pred − target) / D. pred and target are (B, D).
void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
namespace gt::cpu {
decltype(ops::cross_entropy) cross_entropy;
decltype(ops::mse) mse;
}  // namespace gt::cpu

#if GT_WITH_CUDA
namespace gt::cuda {
/// One warp per row; the sums go into stats with atomicAdd, so the host never waits for a loss.
decltype(ops::cross_entropy) cross_entropy;
decltype(ops::mse) mse;
}  // namespace gt::cuda
#endif
