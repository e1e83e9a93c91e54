// CPU losses (ops/loss.h): softmax cross-entropy and mean squared error, rows in parallel, sums in double and in
// row order.
#include "ops/loss.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/vec_math.h"
#include "ops/math.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace gt::cpu {
namespace {

// e[j] = e^(x[j] − shift) for a row of logits, in f32 (vectorised; see ops/cpu/vec_math.h). A NaN (a NaN logit,
// or ∞ − ∞ for an infinite one) stays NaN, so the row's loss is NaN as ops/loss.h promises.
GT_INLINE void exp_shifted_f32(const float* x, float shift, float* e, int64_t k) {
  for (int64_t j = 0; j < k; ++j) {
    const float v = x[j] - shift;
    e[j] = v != v ? v : exp_f32(v);
  }
}

// The row's largest logit and the first position holding it, as a loop over j keeping x[j] when x[j] > the running
// maximum finds them (NaN never taken, unless x[0] is NaN: then NaN at 0), in sixteen lanes instead of one chain of
// dependent compares: each lane keeps the first of its largest, and the lanes combine in order. Only equal values
// (== : −0 and +0 alike) can tie, and the first position holding one is the loop's answer.
GT_INLINE float row_max_f32(const float* x, int64_t k, int64_t& argmax) {
  float m[16];
  for (float& v : m) v = x[0];
  int64_t j = 0;
  for (; j + 16 <= k; j += 16)
    for (int l = 0; l < 16; ++l) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  for (int l = 0; j < k; ++j, ++l) m[l] = x[j] > m[l] ? x[j] : m[l];
  float mx = m[0];
  for (int l = 1; l < 16; ++l) mx = m[l] > mx ? m[l] : mx;
  argmax = 0;
  if (mx == mx)
    for (int64_t i = 0; i < k; ++i)
      if (x[i] == mx) {
        argmax = i;
        break;
      }
  return mx;
}

// Rows [b0, b1) of the f32 cross-entropy (cross_entropy_t below: each row's loss and hit, and its logits' gradient
// into pd unless null; e: k floats of scratch). Compiled per instruction set; the row's sums in double as eight
// interleaved partial sums (lane_sum), its exponentials once, p_j = e_j / Σe.
GT_INLINE void ce_rows(const float* px, const int32_t* py, int64_t k, int64_t b0, int64_t b1, int64_t ignore,
                       double eps, double grad_scale, float* pd, float* e, double* row_loss, uint8_t* row_hit) {
  for (int64_t b = b0; b < b1; ++b) {
    const float* x = px + b * k;
    const int32_t y = py[b];
    if (y == ignore) {
      row_loss[b] = 0;
      row_hit[b] = 0;
      if (pd) std::fill(pd + b * k, pd + (b + 1) * k, 0.0f);
      continue;
    }
    int64_t argmax = 0;
    const float mx = row_max_f32(x, k, argmax);
    const double sum_x = lane_sum(k, [&](int64_t j) { return static_cast<double>(x[j]); });
    exp_shifted_f32(x, mx, e, k);
    const double sum_e = lane_sum(k, [&](int64_t j) { return static_cast<double>(e[j]); });
    const double lse = static_cast<double>(mx) + std::log(sum_e);
    const bool valid = y >= 0 && y < k;  // a label out of range: a NaN loss, no hit, no target term (ops/loss.h)
    row_loss[b] = ce_row_loss(lse, valid ? static_cast<double>(x[y]) : std::nan(""), sum_x, k, eps);
    if (pd) {
      const float inv = static_cast<float>(1.0 / sum_e);
      const float g = static_cast<float>(grad_scale), off = static_cast<float>(eps / static_cast<double>(k));
      float* d = pd + b * k;
      for (int64_t j = 0; j < k; ++j) d[j] = g * (e[j] * inv - off);
      if (valid) d[y] -= static_cast<float>(grad_scale * (1 - eps));
    }
    row_hit[b] = valid && argmax == y;
  }
}
GT_CPU_KERNEL(ce_rows_f32,
              (const float* px, const int32_t* py, int64_t k, int64_t b0, int64_t b1, int64_t ignore, double eps,
               double grad_scale, float* pd, float* e, double* row_loss, uint8_t* row_hit),
              (px, py, k, b0, b1, ignore, eps, grad_scale, pd, e, row_loss, row_hit), ce_rows)

template <class T>
void cross_entropy_t(const Tensor& logits, const Tensor& labels, double eps, double scale, Tensor& dlogits,
                     Tensor& stats, const ops::CrossEntropyRows& rows) {
  const int64_t batch = logits.dim(0), k = logits.dim(1);
  const T* px = logits.data<T>();
  const int32_t* py = labels.data<int32_t>();
  T* pd = dlogits.defined() ? dlogits.data<T>() : nullptr;
  int64_t counted = batch;
  if (rows.ignore_index != ops::kNoIgnore) counted = batch - std::count(py, py + batch, rows.ignore_index);
  // Each counted row's weight: samples per counted row (ops/loss.h).
  const double w = counted > 0 ? static_cast<double>(batch / rows.group) / static_cast<double>(counted) : 0.0;
  const double grad_scale = scale * w;
  std::vector<double> row_loss(static_cast<size_t>(batch));
  std::vector<uint8_t> row_hit(static_cast<size_t>(batch));
  parallel_for(batch, std::max<int64_t>(1, kGrain / (4 * k)), [&](int64_t b0, int64_t b1) {
    if constexpr (std::is_same_v<T, float>) {
      std::vector<float> scratch(static_cast<size_t>(k));
      ce_rows_f32(px, py, k, b0, b1, rows.ignore_index, eps, grad_scale, pd, scratch.data(), row_loss.data(),
                  row_hit.data());
      return;
    }
    for (int64_t b = b0; b < b1; ++b) {
      const T* x = px + b * k;
      const int32_t y = py[b];
      if (y == rows.ignore_index) {
        row_loss[static_cast<size_t>(b)] = 0;
        row_hit[static_cast<size_t>(b)] = 0;
        if (pd) std::fill(pd + b * k, pd + (b + 1) * k, T(0));
        continue;
      }
      int64_t argmax = 0;
      T mx = x[0];
      double sum_x = 0;
      for (int64_t j = 0; j < k; ++j) {
        if (x[j] > mx) mx = x[j], argmax = j;
        sum_x += static_cast<double>(x[j]);
      }
      double sum_e = 0;
      for (int64_t j = 0; j < k; ++j) sum_e += std::exp(static_cast<double>(x[j] - mx));
      const double lse = static_cast<double>(mx) + std::log(sum_e);
      const bool valid = y >= 0 && y < k;
      const double xy = valid ? static_cast<double>(x[y]) : std::nan("");
      row_loss[static_cast<size_t>(b)] = ce_row_loss(lse, xy, sum_x, k, eps);
      if (pd) {
        T* d = pd + b * k;
        for (int64_t j = 0; j < k; ++j)
          d[j] = static_cast<T>(ce_dlogit(std::exp(static_cast<double>(x[j]) - lse), j == y, k, eps, grad_scale));
      }
      row_hit[static_cast<size_t>(b)] = valid && argmax == y;
    }
  });
  double loss = 0, hits = 0;
  for (int64_t b = 0; b < batch; ++b) loss += row_loss[static_cast<size_t>(b)], hits += row_hit[static_cast<size_t>(b)];
  double* s = stats.data<double>();
  s[0] += w * loss;  // (exact when w = 1)
  s[1] += w * hits;
}

template <class T>
void mse_t(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats) {
  const int64_t batch = pred.dim(0), d = pred.numel() / std::max<int64_t>(batch, 1);
  const T *pp = pred.data<T>(), *pt = target.data<T>();
  T* pd = dpred.defined() ? dpred.data<T>() : nullptr;
  std::vector<double> row_loss(static_cast<size_t>(batch));
  const double grad_scale = scale * 2.0 / static_cast<double>(d);
  parallel_for(batch, std::max<int64_t>(1, kGrain / d), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double acc = 0;
      for (int64_t j = b * d; j < (b + 1) * d; ++j) {
        const double diff = static_cast<double>(pp[j]) - static_cast<double>(pt[j]);
        acc += diff * diff;
        if (pd) pd[j] = static_cast<T>(grad_scale * diff);
      }
      row_loss[static_cast<size_t>(b)] = acc / static_cast<double>(d);
    }
  });
  double loss = 0;
  for (double l : row_loss) loss += l;
  stats.data<double>()[0] += loss;
}

}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& labels, double eps, double scale, Tensor& dlogits, Tensor& stats,
                   const ops::CrossEntropyRows& rows) {
  for_float_type(logits.dtype(),
                 [&](auto t) { cross_entropy_t<decltype(t)>(logits, labels, eps, scale, dlogits, stats, rows); });
}
void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats) {
  for_float_type(pred.dtype(), [&](auto t) { mse_t<decltype(t)>(pred, target, scale, dpred, stats); });
}

}  // namespace gt::cpu
