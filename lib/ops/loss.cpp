// The contract of the losses (ops/loss.h): shapes, dtypes and devices, then the backend's entry point.
#include "ops/loss.h"

#include "ops/dispatch.h"
#include "ops/wide.h"

namespace gt::ops {

void cross_entropy(const Tensor& logits, const Tensor& labels, double eps, double scale, Tensor& dlogits, Tensor& stats,
                   const CrossEntropyRows& rows) {
  // 16-bit logits (Model::set_activation_dtype): CUDA reads and writes them as they are, the CPU in f32 (ops/wide.h).
  // The gradient may be 16-bit or f32 beside them, and may overwrite them (in place, the same tensor).
  const bool native =
      logits.device().is_cuda() && is_half(logits.dtype()) && (!dlogits.defined() || dlogits.dtype() == logits.dtype());
  if (any_half({&logits, &dlogits}) && !native) {
    Wide wide;
    Tensor dw = wide.out(dlogits);
    cross_entropy(wide.in(logits), labels, eps, scale, dw, stats, rows);
    wide.finish();
    return;
  }
  const Operands op("cross_entropy", {&logits, &dlogits}, {&labels, &stats});
  GT_CHECK(logits.rank() == 2 && labels.dtype() == DType::i32 && labels.numel() == logits.dim(0),
           "cross_entropy logits {} labels {}", logits.shape().str(), labels.shape().str());
  GT_CHECK(!dlogits.defined() || dlogits.shape() == logits.shape(), "dlogits shape");
  GT_CHECK(stats.dtype() == DType::f64 && stats.numel() >= 2, "stats must be f64[2]");
  GT_CHECK(rows.group >= 1 && logits.dim(0) % rows.group == 0, "cross_entropy: {} rows in groups of {}", logits.dim(0),
           rows.group);
  GT_DISPATCH(op, cross_entropy(logits, labels, eps, scale, dlogits, stats, rows));
}

void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats) {
  if (any_half({&pred, &target, &dpred})) {  // 16-bit predictions (Model::set_activation_dtype): computed in f32
    Wide wide;
    Tensor dw = wide.out(dpred);
    mse(wide.in(pred), wide.in(target), scale, dw, stats);
    wide.finish();
    return;
  }
  const Operands op("mse", {&pred, &target, &dpred}, {&stats});
  GT_CHECK(pred.numel() == target.numel() && pred.rank() >= 1, "mse pred {} target {}", pred.shape().str(),
           target.shape().str());
  GT_CHECK(!dpred.defined() || dpred.numel() == pred.numel(), "dpred shape");
  GT_CHECK(stats.dtype() == DType::f64 && stats.numel() >= 2, "stats must be f64[2]");
  GT_DISPATCH(op, mse(pred, target, scale, dpred, stats));
}

}  // namespace gt::ops
