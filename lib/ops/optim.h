// The optimizer's ops: the gradient norm, scaling, and the fused SGD and Adam steps over a TensorGroup, gated by the
// step's statistics (a non-finite loss or gradient norm skips the step) and clipped on the fly. The per-element
// updates are ops/math.h's. ops/optim.cpp checks the contract; ops/cpu/optim.cpp and ops/cuda/optim.cu implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"
#include "ops/math.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace gt::ops {

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
  /// Each row's parameter group (optimizer.param_groups), whose learning rate and weight decay update it: an index
  /// into the step's rates. Empty: every row is in group 0. Fixed from the first CUDA use on, as the rows are.
  std::vector<int32_t> row_group;
  std::shared_ptr<void> device_table;
  /// CUDA graphs (train.cuda_graphs): when defined, the CUDA step kernels read their SgdHyper or AdamHyper, and
  /// the groups' rates, from this device memory instead of the arguments (the same values, written there before
  /// the step; layout below), so that a replayed launch uses each step's own learning rates and bias corrections.
  /// The CPU never uses it.
  Tensor hyper;
};

/// One parameter group's learning rate and weight decay at a step: they replace the step's SgdHyper or AdamHyper
/// lr and weight_decay for the rows of that group.
struct GroupRate {
  double lr, weight_decay;
};
/// The most groups one step takes (the CUDA kernels take their rates by value).
inline constexpr size_t kMaxGroupRates = 32;
/// TensorGroup::hyper's layout: the SgdHyper or AdamHyper at byte 0, GroupRate[groups] from this byte on.
inline constexpr size_t kHyperRatesOffset = 256;
inline constexpr int64_t kHyperDoubles = (kHyperRatesOffset + kMaxGroupRates * sizeof(GroupRate)) / sizeof(double);

/// Adds Σ_rows Σ rows[r][column]² to out[0] and, when per_row (f64[rows]) is defined, each row's own sum to
/// per_row[r] (which parameter went non-finite); f64 on the group's device.
void sum_squares_group(TensorGroup& group, size_t column, Tensor& out, Tensor& per_row);
/// One SGD step over the group, rows (param, grad, momentum — undefined without momentum), gated and clipped by
/// the step's statistics: nothing changes unless stats[kLossSum] and stats[kGradSq] are finite, and when
/// max_norm > 0 each gradient is used multiplied by min(1, max_norm / (√stats[kGradSq] + 1e-6))
/// (torch.nn.utils.clip_grad_norm_'s coefficient). Both backends scale each gradient as they read it and leave the
/// gradients as they were. `rates` (at most kMaxGroupRates): row r is updated with h's lr and weight_decay replaced
/// by rates[group.row_group[r]]'s; empty: every row with h's own (then row_group holds only 0s, if anything).
void sgd_step_group(const SgdHyper& h, TensorGroup& group, const Tensor& stats, double max_norm,
                    std::span<const GroupRate> rates = {});
/// One Adam/AdamW step over rows (param, grad, m, v, vmax — undefined unless amsgrad), gated, clipped and grouped
/// as above.
void adam_step_group(const AdamHyper& h, bool amsgrad, TensorGroup& group, const Tensor& stats, double max_norm,
                     std::span<const GroupRate> rates = {});
/// window[0] += stats[kLossSum] and window[1] += stats[kHits] when the step's loss and gradient norm are finite;
/// window[2] += 1 (a skipped step) otherwise. window: f64[3] on the same device.
void accumulate_step(const Tensor& stats, Tensor& window);

/// The loss scaler's update after a step (ops/math.h's loss_scale_update on `state`, f64[kLossScaleState]) by the
/// step's statistics: finite when stats[kLossSum] and stats[kGradSq] are, the verdict the optimizer gated on. On
/// the device, no host sync.
void update_loss_scale(const Tensor& stats, Tensor& state, const LossScaleHyper& h);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CUDA: the group ops are one launch each however many rows the group has.
GT_BACKEND_ENTRY_POINTS(sum_squares, scale_by, sum_squares_group, sgd_step_group, adam_step_group, accumulate_step,
                        update_loss_scale)
