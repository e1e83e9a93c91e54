// CPU optimizer ops (ops/optim.h): the SGD and Adam updates of ops/math.h over each row of a group, behind the
// step's gate and clip, and the gradient sums. The statistics are host memory here, so the gate is a plain branch.
#include "ops/optim.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace gt::cpu {
namespace {

template <class T>
void sgd_t(const SgdHyper& h, Tensor& param, const Tensor& grad, Tensor& momentum) {
  T* __restrict p = param.data<T>();
  const T* __restrict g = grad.data<T>();
  T* __restrict m = momentum.defined() ? momentum.data<T>() : nullptr;
  auto loop = [&](auto has_momentum, auto nesterov) {
    parallel_for(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      T unused = 0;
      for (int64_t i = i0; i < i1; ++i)
        sgd_update<T, decltype(has_momentum)::value, decltype(nesterov)::value>(h, p[i], g[i],
                                                                                has_momentum ? m[i] : unused);
    });
  };
  if (!m)
    loop(std::false_type{}, std::false_type{});
  else if (h.nesterov)
    loop(std::true_type{}, std::true_type{});
  else
    loop(std::true_type{}, std::false_type{});
}

template <class T>
void adam_t(const AdamHyper& h, bool amsgrad, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax) {
  T* __restrict p = param.data<T>();
  const T* __restrict g = grad.data<T>();
  T* __restrict pm = m.data<T>();
  T* __restrict pv = v.data<T>();
  T* __restrict pmax = amsgrad ? vmax.data<T>() : nullptr;
  auto loop = [&](auto ams) {
    parallel_for(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      T unused = 0;
      for (int64_t i = i0; i < i1; ++i)
        adam_update<T, decltype(ams)::value>(h, p[i], g[i], pm[i], pv[i], ams ? pmax[i] : unused);
    });
  };
  if (amsgrad)
    loop(std::true_type{});
  else
    loop(std::false_type{});
}

template <class T>
double sum_squares_t(const Tensor& grad) {
  const T* g = grad.data<T>();
  const int64_t n = grad.numel();
  // Fixed blocks summed in order: the same total for any thread count.
  constexpr int64_t kBlock = 1 << 14;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<size_t>(blocks));
  parallel_for(blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double s = 0;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) s += static_cast<double>(g[i]) * g[i];
      part[static_cast<size_t>(b)] = s;
    }
  });
  double total = 0;
  for (double v : part) total += v;
  return total;
}

// One row of a group step: its parameter, gradient and optimizer state.
void sgd_step(const SgdHyper& h, Tensor& param, const Tensor& grad, Tensor& momentum) {
  for_float_type(param.dtype(), [&](auto t) { sgd_t<decltype(t)>(h, param, grad, momentum); });
}
void adam_step(const AdamHyper& h, bool amsgrad, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
               Tensor& vmax) {
  for_float_type(param.dtype(), [&](auto t) { adam_t<decltype(t)>(h, amsgrad, param, grad, m, v, vmax); });
}

}  // namespace

void sum_squares(const Tensor& grad, Tensor& out) {
  for_float_type(grad.dtype(), [&](auto t) { out.data<double>()[0] += sum_squares_t<decltype(t)>(grad); });
}
void scale_by(Tensor& x, const Tensor& scale) {
  const double k = scale.data<double>()[0];
  for_float_type(x.dtype(), [&](auto t) {
    using T = decltype(t);
    T* p = x.data<T>();
    parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) p[i] = static_cast<T>(p[i] * k);
    });
  });
}

namespace {

// The gate: the step may update only when its loss and gradient norm are finite.
bool step_ok(const Tensor& stats) {
  const double* s = stats.data<double>();
  return std::isfinite(s[kLossSum]) && std::isfinite(s[kGradSq]);
}

// Scales the gradients (column 1) by the clip coefficient when it is below 1, as clip_grad_norm_ does.
void clip(ops::TensorGroup& g, const Tensor& stats, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (std::sqrt(stats.data<double>()[kGradSq]) + 1e-6);
  if (coef >= 1) return;
  Tensor k = Tensor::empty(Shape{1}, DType::f64);
  k.data<double>()[0] = coef;
  for (auto& row : g.rows) scale_by(row[1], k);
}

}  // namespace

void sum_squares_group(ops::TensorGroup& g, size_t column, Tensor& out, Tensor& per_row) {
  Tensor one = Tensor::empty(Shape{1}, DType::f64);
  for (size_t r = 0; r < g.rows.size(); ++r) {
    one.data<double>()[0] = 0;
    sum_squares(g.rows[r][column], one);
    out.data<double>()[0] += one.data<double>()[0];
    if (per_row.defined()) per_row.data<double>()[r] += one.data<double>()[0];
  }
}

void sgd_step_group(const SgdHyper& h, ops::TensorGroup& g, const Tensor& stats, double max_norm) {
  if (!step_ok(stats)) return;
  clip(g, stats, max_norm);
  for (auto& row : g.rows) sgd_step(h, row[0], row[1], row[2]);
}

void adam_step_group(const AdamHyper& h, bool amsgrad, ops::TensorGroup& g, const Tensor& stats, double max_norm) {
  if (!step_ok(stats)) return;
  clip(g, stats, max_norm);
  for (auto& row : g.rows) adam_step(h, amsgrad, row[0], row[1], row[2], row[3], row[4]);
}

void accumulate_step(const Tensor& stats, Tensor& window) {
  double* w = window.data<double>();
  if (step_ok(stats)) {
    w[0] += stats.data<double>()[kLossSum];
    w[1] += stats.data<double>()[kHits];
  } else {
    w[2] += 1;
  }
}

}  // namespace gt::cpu
