// Batch normalisation, plain and synchronised over the ranks of a data-parallel run (dist.sync_batchnorm, through
// SumOverRanks). ops/batchnorm.cpp checks the contract; ops/cpu/batchnorm.cpp and ops/cuda/batchnorm.cu (cuDNN,
// and a kernel for the evaluation-mode backward pass) implement it. The synchronised variants are CPU-only.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"
#include "ops/epilogue.h"

#include <cstddef>
#include <functional>

namespace gt::ops {

/// Batch normalisation over x viewed as (B, C, S): per-channel statistics of the batch in training (updating the
/// running ones with `momentum`, the variance unbiased as PyTorch keeps it), the running ones in evaluation.
/// save_mean and save_invstd (C) keep what the backward pass needs.
void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y);
void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta);
/// batchnorm_forward, then `ep` on its output in the same pass (CPU; a pool needs x of (B, C, H, W)): y is the
/// epilogue's output ((B, C, ⌊H/2⌋, ⌊W/2⌋) with the pool), and the normalised values never reach memory. save_scale
/// and save_shift (C) keep the per-channel affine map y = x·scale + shift that backward recomputes them with. The
/// same numbers bit for bit as batchnorm_forward, pool2d_forward and activation_forward in turn.
void batchnorm_epilogue_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                                Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                                Tensor& save_invstd, Tensor& save_scale, Tensor& save_shift, const Epilogue& ep,
                                Tensor& y);
/// Its backward from y and dy, the epilogue's output and its gradient: the normalised values are computed again in
/// cache, one sample at a time, and their gradient goes into dx's buffer as the per-channel sums are taken, then
/// becomes dx in place. The same numbers bit for bit as activation_backward, pool2d_backward and batchnorm_backward
/// in turn.
void batchnorm_epilogue_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                                 const Tensor& save_invstd, const Tensor& save_scale, const Tensor& save_shift,
                                 const Epilogue& ep, const Tensor& y, const Tensor& dy, bool training, Tensor& dx,
                                 Tensor& dgamma, Tensor& dbeta, double beta);
/// Sums `n` doubles in place over the ranks of a data-parallel run; every rank calls it at the same point.
using SumOverRanks = std::function<void(double* data, size_t n)>;
/// Training-mode batch norm over the global batch of a data-parallel run (dist.sync_batchnorm), CPU tensors only:
/// the local batch's per-channel Σx and Σx² (in double) and its count meet in one `sum_over_ranks` call (2C + 1
/// values); x is normalised with the global mean and variance, and the running statistics take the global ones (the
/// variance unbiased over the global count). Returns that count per channel (samples × spatial, all ranks), which
/// batchnorm_backward_sync needs.
int64_t batchnorm_forward_sync(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                               Tensor& running_var, double momentum, double eps, Tensor& save_mean, Tensor& save_invstd,
                               Tensor& y, const SumOverRanks& sum_over_ranks);
/// Its backward: when dx is wanted, the per-channel Σdy and Σdy·x̂ meet in one `sum_over_ranks` call (2C values), so
/// dx is the global batch's (for every rank's dy scaled alike, as each rank's mean loss makes it). dgamma and dbeta
/// stay the local sums: the gradient all-reduce averages them like every other parameter's.
void batchnorm_backward_sync(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                             const Tensor& dy, int64_t global_count, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                             double beta, const SumOverRanks& sum_over_ranks);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CUDA: cuDNN spatial batch normalisation over x viewed as (B, C, S, 1).
GT_BACKEND_ENTRY_POINTS(batchnorm_forward, batchnorm_backward)
// The synchronised variants and the epilogues are CPU-only.
GT_ENTRY_POINTS_IN_(cpu, batchnorm_forward_sync, batchnorm_backward_sync, batchnorm_epilogue_forward,
                    batchnorm_epilogue_backward)
