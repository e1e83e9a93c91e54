// The losses: softmax cross-entropy and mean squared error, each adding its sums into the step's statistics on the
// device. ops/loss.cpp checks the contract; ops/cpu/loss.cpp and ops/cuda/loss.cu implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"

#include <cstdint>
#include <limits>

namespace gt::ops {

/// No label is ignored (cross_entropy's ignore_index).
inline constexpr int64_t kNoIgnore = std::numeric_limits<int64_t>::min();

/// How cross_entropy's rows make up samples: `group` consecutive rows are one sample (a sequence's tokens), and rows
/// whose label is `ignore_index` count nowhere (no loss, no hit, a zero gradient).
struct CrossEntropyRows {
  int64_t group = 1;
  int64_t ignore_index = kNoIgnore;
};

/// Softmax cross-entropy over logits (B, K) with int32 labels (B). Adds Σ loss to stats[0] and the number of
/// correct argmax predictions to stats[1] (stats: f64, 2 entries, on the logits' device, so nothing syncs).
/// When dlogits is defined, writes dlogits = scale · (softmax(logits) − onehot_smoothed(labels)).
/// label_smoothing ε mixes the one-hot target with the uniform distribution as PyTorch does. A NaN logit makes its
/// row's loss NaN (so the step's loss sum is NaN on every device). A label outside [0, K) (other than ignore_index)
/// is the caller's error: on every backend its row's loss is NaN, the row counts no hit and its gradient has no
/// target term, so the step gate skips the step.
/// With `rows`: the N rows are S = N / group samples and c rows are counted (not ignore_index); every sum and the
/// gradient are weighted by w = S / c (0 when c = 0), so stats[0] += S · (the mean loss over the counted rows),
/// stats[1] += S · (their accuracy) and dlogits = scale · w · (…) on counted rows, 0 on ignored ones. With group 1
/// and nothing ignored, w = 1: the plain form above. scale = 1/S gives PyTorch's reduction='mean' (with its
/// ignore_index), and the statistics stay in samples, as the mse's and the classifier's do.
/// dlogits may be logits itself, the same elements (the fused classifier: a step writes the gradient over the
/// logits, Model::loss_writes_over_output): each row's loss and hit are taken before its gradient overwrites it, and
/// the bits are those of a separate dlogits. mse's dpred may be pred in the same way.
void cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing, double scale, Tensor& dlogits,
                   Tensor& stats, const CrossEntropyRows& rows = {});

/// Mean squared error per sample: adds Σ_b mean_d (pred − target)² to stats[0]; when dpred is defined,
/// writes dpred = scale · 2 (pred − target) / D. pred and target are (B, D).
void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CUDA: one warp per row; the sums go into stats with atomicAdd, so the host never waits for a loss.
GT_BACKEND_ENTRY_POINTS(cross_entropy, mse)
