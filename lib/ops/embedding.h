// Embedding lookups: rows of a table picked by index values. ops/embedding.cpp checks the contract;
// ops/cpu/embedding.cpp and ops/cuda/embedding.cu implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"

namespace gt::ops {

/// y[k, :] = weight[round(idx[k]), :]; an index outside [0, V) (or not within 1e-3 of an integer) is a runtime error.
/// The CPU throws. A CUDA kernel cannot throw without a host synchronisation, so on CUDA that row of y is NaN
/// instead: the loss turns NaN and the step's gate (ops/optim.h) skips the update, visibly, as a skipped step.
void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y);
/// dweight[round(idx[k]), :] += dy[k, :] after dweight ← beta · dweight; rows of invalid indices are skipped. On CUDA
/// repeated indices add up with atomics, in no fixed order.
void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
GT_BACKEND_ENTRY_POINTS(embedding_forward, embedding_backward)
