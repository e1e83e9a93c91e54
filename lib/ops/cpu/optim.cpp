// CPU optimizer ops (ops/optim.h): the SGD and Adam updates of ops/math.h over a whole group in one parallel loop
// (a group's rows are a GPT's ~50 small tensors: one thread team for all of them, not one per row), behind the
// step's gate, with the clip coefficient applied to each gradient as it is read; and the gradient sums. The
// statistics are host memory here, so the gate is a plain branch.
#include "ops/optim.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/vec_math.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <type_traits>
#include <vector>

namespace gt::cpu {
namespace {

// Calls f(row, begin, end) for the element ranges of the group's rows (sizes from column 0) that cover [i0, i1) of
// their concatenation.
template <class F>
void for_row_spans(const ops::TensorGroup& g, const std::vector<int64_t>& start, int64_t i0, int64_t i1, F&& f) {
  size_t r = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), i0) - start.begin()) - 1;
  for (int64_t i = i0; i < i1; ++r) {
    const int64_t end = std::min(i1, start[r] + g.rows[r][0].numel());
    if (end > i) f(r, i - start[r], end - start[r]);
    i = std::max(i, end);
  }
}

// Runs f(row, begin, end) over every element of the group, split over the threads by element count.
template <class F>
void for_group(const ops::TensorGroup& g, F&& f) {
  std::vector<int64_t> start(g.rows.size() + 1, 0);
  for (size_t r = 0; r < g.rows.size(); ++r) start[r + 1] = start[r] + g.rows[r][0].numel();
  parallel_for(start.back(), kGrain, [&](int64_t i0, int64_t i1) { for_row_spans(g, start, i0, i1, f); });
}

// The gradient as an update reads it: scaled by the clip coefficient when one applies, rounded as scaling it in
// place would round it.
template <class T, bool kClip>
T clipped(T g, double coef) {
  if constexpr (kClip)
    return static_cast<T>(g * coef);
  else
    return g;
}

// Row r's hyperparameters: h with its group's rate and weight decay (h itself without rates).
template <class Hyper>
Hyper row_hyper(const Hyper& h, const ops::TensorGroup& group, std::span<const ops::GroupRate> rates, size_t r) {
  if (rates.empty()) return h;
  const ops::GroupRate& g = rates[group.row_group.empty() ? 0 : static_cast<size_t>(group.row_group[r])];
  Hyper out = h;
  out.lr = g.lr;
  out.weight_decay = g.weight_decay;
  return out;
}

template <class T>
void sgd_group_t(const SgdHyper& hyper, ops::TensorGroup& group, double coef, std::span<const ops::GroupRate> rates) {
  auto run = [&](auto has_momentum, auto nesterov, auto clip) {
    for_group(group, [&](size_t r, int64_t i0, int64_t i1) {
      const SgdHyper h = row_hyper(hyper, group, rates, r);
      auto& row = group.rows[r];
      T* __restrict p = row[0].data<T>();
      const T* __restrict g = row[1].data<T>();
      T* __restrict m = has_momentum ? row[2].data<T>() : nullptr;
      T unused = 0;
      for (int64_t i = i0; i < i1; ++i)
        sgd_update<T, decltype(has_momentum)::value, decltype(nesterov)::value>(
            h, p[i], clipped<T, decltype(clip)::value>(g[i], coef), has_momentum ? m[i] : unused);
    });
  };
  const bool momentum = !group.rows.empty() && group.rows[0][2].defined();
  auto with_clip = [&](auto has_momentum, auto nesterov) {
    if (coef < 1)
      run(has_momentum, nesterov, std::true_type{});
    else
      run(has_momentum, nesterov, std::false_type{});
  };
  if (!momentum)
    with_clip(std::false_type{}, std::false_type{});
  else if (hyper.nesterov)
    with_clip(std::true_type{}, std::true_type{});
  else
    with_clip(std::true_type{}, std::false_type{});
}

// The f32 Adam/AdamW update of elements [i0, i1), compiled per instruction set (the step's most common case).
GT_INLINE void adam_span(const AdamHyper& h, float* __restrict p, const float* __restrict g, float* __restrict m,
                         float* __restrict v, int64_t i0, int64_t i1, double coef) {
  float unused = 0;
  if (coef < 1)
    for (int64_t i = i0; i < i1; ++i)
      adam_update<float, false>(h, p[i], clipped<float, true>(g[i], coef), m[i], v[i], unused);
  else
    for (int64_t i = i0; i < i1; ++i) adam_update<float, false>(h, p[i], g[i], m[i], v[i], unused);
}
GT_CPU_KERNEL(adam_span_f32,
              (const AdamHyper& h, float* __restrict p, const float* __restrict g, float* __restrict m,
               float* __restrict v, int64_t i0, int64_t i1, double coef),
              (h, p, g, m, v, i0, i1, coef), adam_span)

template <class T>
void adam_group_t(const AdamHyper& hyper, bool amsgrad, ops::TensorGroup& group, double coef,
                  std::span<const ops::GroupRate> rates) {
  auto run = [&](auto ams, auto clip) {
    for_group(group, [&](size_t r, int64_t i0, int64_t i1) {
      const AdamHyper h = row_hyper(hyper, group, rates, r);
      auto& row = group.rows[r];
      if constexpr (std::is_same_v<T, float> && !decltype(ams)::value) {
        adam_span_f32(h, row[0].data<float>(), row[1].data<float>(), row[2].data<float>(), row[3].data<float>(), i0, i1,
                      decltype(clip)::value ? coef : 1.0);
        return;
      }
      T* __restrict p = row[0].data<T>();
      const T* __restrict g = row[1].data<T>();
      T* __restrict pm = row[2].data<T>();
      T* __restrict pv = row[3].data<T>();
      T* __restrict pmax = ams ? row[4].data<T>() : nullptr;
      T unused = 0;
      for (int64_t i = i0; i < i1; ++i)
        adam_update<T, decltype(ams)::value>(h, p[i], clipped<T, decltype(clip)::value>(g[i], coef), pm[i], pv[i],
                                             ams ? pmax[i] : unused);
    });
  };
  auto with_clip = [&](auto ams) {
    if (coef < 1)
      run(ams, std::true_type{});
    else
      run(ams, std::false_type{});
  };
  if (amsgrad)
    with_clip(std::true_type{});
  else
    with_clip(std::false_type{});
}

// Σ g² over [i0, i1) in double, as eight interleaved partial sums combined in a fixed order (vector lanes rather
// than one chain of dependent additions).
template <class T>
double sum_squares_span(const T* g, int64_t i0, int64_t i1) {
  double acc[8] = {};
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(g[i + k]) * g[i + k];
  for (int k = 0; i < i1; ++i, ++k) acc[k] += static_cast<double>(g[i]) * g[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// A tensor's Σ g² in fixed blocks of kBlock elements, each block's sum computed on any thread and the blocks added in
// order: the same total for any thread count.
constexpr int64_t kBlock = 1 << 14;

// Each tensor's Σ g², the blocks of all of them in one parallel loop.
std::vector<double> sum_squares_each(const std::vector<const Tensor*>& ts) {
  std::vector<int64_t> first(ts.size() + 1, 0);  // the tensors' first block
  for (size_t r = 0; r < ts.size(); ++r) first[r + 1] = first[r] + (ts[r]->numel() + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<size_t>(first.back()));
  parallel_for(first.back(), 4, [&](int64_t b0, int64_t b1) {
    size_t r = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), b0) - first.begin()) - 1;
    for (int64_t b = b0; b < b1; ++b) {
      while (b >= first[r + 1]) ++r;
      const Tensor& t = *ts[r];
      const int64_t i0 = (b - first[r]) * kBlock, i1 = std::min(t.numel(), i0 + kBlock);
      for_float_type(t.dtype(), [&](auto z) {
        using T = decltype(z);
        part[static_cast<size_t>(b)] = sum_squares_span(t.data<T>(), i0, i1);
      });
    }
  });
  std::vector<double> total(ts.size(), 0.0);
  for (size_t r = 0; r < ts.size(); ++r)
    for (int64_t b = first[r]; b < first[r + 1]; ++b) total[r] += part[static_cast<size_t>(b)];
  return total;
}

}  // namespace

void sum_squares(const Tensor& grad, Tensor& out) { out.data<double>()[0] += sum_squares_each({&grad})[0]; }
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

// clip_grad_norm_'s coefficient when it is below 1 (the gradients are scaled as they are read), else 1.
double clip_coef(const Tensor& stats, double max_norm) {
  if (max_norm <= 0) return 1;
  return std::min(1.0, max_norm / (std::sqrt(stats.data<double>()[kGradSq]) + 1e-6));
}

}  // namespace

void sum_squares_group(ops::TensorGroup& g, size_t column, Tensor& out, Tensor& per_row) {
  std::vector<const Tensor*> ts;
  for (const auto& row : g.rows) ts.push_back(&row[column]);
  const std::vector<double> each = sum_squares_each(ts);
  for (size_t r = 0; r < g.rows.size(); ++r) {
    out.data<double>()[0] += each[r];
    if (per_row.defined()) per_row.data<double>()[r] += each[r];
  }
}

void sgd_step_group(const SgdHyper& h, ops::TensorGroup& g, const Tensor& stats, double max_norm,
                    std::span<const ops::GroupRate> rates) {
  if (!step_ok(stats) || g.rows.empty()) return;
  for_float_type(g.rows[0][0].dtype(),
                 [&](auto t) { sgd_group_t<decltype(t)>(h, g, clip_coef(stats, max_norm), rates); });
}

void adam_step_group(const AdamHyper& h, bool amsgrad, ops::TensorGroup& g, const Tensor& stats, double max_norm,
                     std::span<const ops::GroupRate> rates) {
  if (!step_ok(stats) || g.rows.empty()) return;
  for_float_type(g.rows[0][0].dtype(),
                 [&](auto t) { adam_group_t<decltype(t)>(h, amsgrad, g, clip_coef(stats, max_norm), rates); });
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

void update_loss_scale(const Tensor& stats, Tensor& state, const LossScaleHyper& h) {
  loss_scale_update(state.data<double>(), step_ok(stats), h);
}

}  // namespace gt::cpu
