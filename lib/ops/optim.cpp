// The contract of the optimizer's ops (ops/optim.h): group layouts, dtypes, devices and the step statistics, then the
// backend's entry point.
#include "ops/optim.h"

#include "ops/dispatch.h"
#include "ops/wide.h"

#include <algorithm>

namespace gt::ops {
namespace {

// Every row of a group has `width` entries (the optional last one may be undefined) on one device.
Operands group_operands(const char* op, const TensorGroup& g, size_t width) {
  GT_CHECK(!g.rows.empty(), "{}: empty group", op);
  const Device d = g.rows[0][0].device();
  for (const auto& row : g.rows) {
    GT_CHECK(row.size() == width, "{}: rows of {} tensors, expected {}", op, row.size(), width);
    for (const Tensor& t : row) {
      if (!t.defined()) continue;
      GT_CHECK(t.device() == d, "{}: operands on {} and {}", op, d.str(), t.device().str());
      GT_CHECK(t.numel() == row[0].numel() && t.dtype() == row[0].dtype(), "{}: row of mixed sizes or dtypes", op);
      // The CUDA kernels read every row with the element type of the first.
      GT_CHECK(t.dtype() == g.rows[0][0].dtype(), "{}: rows of {} and {}", op, dtype_name(g.rows[0][0].dtype()),
               dtype_name(t.dtype()));
    }
  }
  return Operands(op, d);
}

// Each row's group has a rate; with no rates, no row names a group.
void check_rates(const char* op, const TensorGroup& g, std::span<const GroupRate> rates) {
  GT_CHECK(rates.size() <= kMaxGroupRates, "{}: {} groups, at most {}", op, rates.size(), kMaxGroupRates);
  GT_CHECK(g.row_group.empty() || g.row_group.size() == g.rows.size(), "{}: {} row groups for {} rows", op,
           g.row_group.size(), g.rows.size());
  for (const int32_t r : g.row_group)
    GT_CHECK(r >= 0 && static_cast<size_t>(r) < std::max<size_t>(rates.size(), 1), "{}: row group {} of {}", op, r,
             rates.size());
}

void check_stats(const Operands& op, const Tensor& stats) {
  GT_CHECK(stats.dtype() == DType::f64 && stats.numel() >= kStepStats && stats.device() == op.device(),
           "{}: step statistics must be f64[{}] on {}", op.op(), static_cast<int64_t>(kStepStats), op.device().str());
}

}  // namespace

void sum_squares(const Tensor& grad, Tensor& out) {
  const Operands op("sum_squares", {&grad}, {&out});
  GT_CHECK(out.dtype() == DType::f64 && out.numel() >= 1, "sum_squares accumulates into f64");
  GT_DISPATCH(op, sum_squares(grad, out));
}

void scale_by(Tensor& x, const Tensor& scale) {
  // A 16-bit gradient of the output (fp16's loss scale, Model::set_activation_dtype): the CPU scales it in f32
  // (ops/wide.h), CUDA's kernel reads and writes the 16 bits.
  if (any_half({&x}) && x.device().is_cpu()) {
    Wide wide;
    Tensor xw = wide.out(x, true);
    scale_by(xw, scale);
    wide.finish();
    return;
  }
  const Operands op("scale_by", {&x}, {&scale});
  GT_CHECK(scale.dtype() == DType::f64 && scale.numel() >= 1, "scale_by takes an f64 scale");
  GT_DISPATCH(op, scale_by(x, scale));
}

void sum_squares_group(TensorGroup& g, size_t column, Tensor& out, Tensor& per_row) {
  GT_CHECK(out.dtype() == DType::f64 && out.numel() >= 1, "sum_squares_group accumulates into f64");
  GT_CHECK(!per_row.defined() ||
               (per_row.dtype() == DType::f64 && per_row.numel() >= static_cast<int64_t>(g.rows.size())),
           "sum_squares_group: per_row must be f64[{}]", g.rows.size());
  const Operands op("sum_squares_group", {&g.rows.at(0).at(column)}, {&out, &per_row});
  for (const auto& row : g.rows) GT_CHECK(row.at(column).device() == op.device(), "sum_squares_group: mixed devices");
  GT_DISPATCH(op, sum_squares_group(g, column, out, per_row));
}

void sgd_step_group(const SgdHyper& h, TensorGroup& g, const Tensor& stats, double max_norm,
                    std::span<const GroupRate> rates) {
  const Operands op = group_operands("sgd_step_group", g, 3);
  check_stats(op, stats);
  check_rates("sgd_step_group", g, rates);
  // The CUDA kernel picks the momentum update from h.momentum (as torch.optim.SGD does) and the CPU from the buffer,
  // so the two must agree: a buffer exactly when momentum is on (the Sgd optimizer makes them so).
  for (const auto& row : g.rows)
    GT_CHECK(row[2].defined() == (h.momentum != 0), "sgd_step_group: a momentum buffer per row iff momentum != 0");
  GT_DISPATCH(op, sgd_step_group(h, g, stats, max_norm, rates));
}

void adam_step_group(const AdamHyper& h, bool amsgrad, TensorGroup& g, const Tensor& stats, double max_norm,
                     std::span<const GroupRate> rates) {
  const Operands op = group_operands("adam_step_group", g, 5);
  check_stats(op, stats);
  check_rates("adam_step_group", g, rates);
  for (const auto& row : g.rows)
    GT_CHECK(!amsgrad || row[4].defined(), "adam_step_group: amsgrad needs the vmax column");
  GT_DISPATCH(op, adam_step_group(h, amsgrad, g, stats, max_norm, rates));
}

void accumulate_step(const Tensor& stats, Tensor& window) {
  const Operands op("accumulate_step", {&stats}, {&window});
  check_stats(op, stats);
  GT_CHECK(window.dtype() == DType::f64 && window.numel() >= 3, "accumulate_step: window must be f64[3]");
  GT_DISPATCH(op, accumulate_step(stats, window));
}

void update_loss_scale(const Tensor& stats, Tensor& state, const LossScaleHyper& h) {
  const Operands op("update_loss_scale", {&stats}, {&state});
  check_stats(op, stats);
  GT_CHECK(state.dtype() == DType::f64 && state.numel() >= kLossScaleState, "update_loss_scale: state must be f64[{}]",
           static_cast<int64_t>(kLossScaleState));
  GT_DISPATCH(op, update_loss_scale(stats, state, h));
}

}  // namespace gt::ops
