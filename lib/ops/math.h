// Per-element math shared by the CPU loops and the CUDA kernels: activations, losses and optimizer updates.
#pragma once

#include "core/hd.h"
#include "core/rng.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace gt {

/// gelu is x·Φ(x) computed with erf; gelu_tanh is its tanh approximation (GPT-2's, PyTorch's approximate='tanh').
enum class Activation { relu, tanh, sigmoid, gelu, gelu_tanh };

/// Calls f with the activation as a compile-time constant (a std::integral_constant), so the CPU loop or the CUDA
/// kernel it instantiates has no switch inside and vectorises.
template <class F>
void with_activation(Activation a, F&& f) {
  switch (a) {
    case Activation::relu: f(std::integral_constant<Activation, Activation::relu>{}); break;
    case Activation::tanh: f(std::integral_constant<Activation, Activation::tanh>{}); break;
    case Activation::sigmoid: f(std::integral_constant<Activation, Activation::sigmoid>{}); break;
    case Activation::gelu: f(std::integral_constant<Activation, Activation::gelu>{}); break;
    case Activation::gelu_tanh: f(std::integral_constant<Activation, Activation::gelu_tanh>{}); break;
  }
}

/// A 2-D sliding window (convolution kernel or pooling window): size, stride, padding, dilation.
struct Window2d {
  int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
};

/// Output extent of a window sliding over `in` (PyTorch's formula, floor mode); 0 when the window does not fit.
GT_HD int64_t window_out(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t room = in + 2 * pad - dilation * (k - 1) - 1;  // C++ division truncates: floor it ourselves
  return room < 0 ? 0 : room / stride + 1;
}

enum class PoolKind { max, avg };

/// A training step's statistics on its device (f64[kStepStats]): what the loss adds up over the step's samples and
/// the gradients' squared norm. They stay on the device: the fused optimizers read them to skip a non-finite step
/// and to clip, and the host reads them only when it logs.
enum StepStat : int64_t { kLossSum = 0, kHits = 1, kGradSq = 2, kStepStats = 3 };

/// A dynamic loss scaler's state on its device (f64[kLossScaleState]), as PyTorch's GradScaler keeps it: the scale
/// the loss gradient is multiplied by, its inverse (what the gradients are unscaled by) and the finite steps since the
/// scale last changed.
enum LossScaleSlot : int64_t { kScale = 0, kInvScale = 1, kGrowthTracker = 2, kLossScaleState = 3 };

/// GradScaler's hyperparameters (train.loss_scale); dynamic false: a fixed scale that never changes.
struct LossScaleHyper {
  double growth_factor = 2, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool dynamic = true;
};

/// GradScaler.update after a step whose gradients were `finite` or not: a non-finite step multiplies the scale by
/// backoff_factor and restarts the tracker, and `growth_interval` finite steps in a row multiply it by
/// growth_factor (GradScaler's exact rules). The host replays it on its copy, the device on its own, so both hold the
/// same numbers.
GT_HD void loss_scale_update(double* s, bool finite, const LossScaleHyper& h) {
  if (!h.dynamic) return;
  if (finite) {
    s[kGrowthTracker] += 1;
    if (s[kGrowthTracker] >= static_cast<double>(h.growth_interval)) {
      s[kScale] *= h.growth_factor;
      s[kGrowthTracker] = 0;
    }
  } else {
    s[kScale] *= h.backoff_factor;
    s[kGrowthTracker] = 0;
  }
  s[kInvScale] = 1.0 / s[kScale];
}

/// Whether dropout keeps element i at `step`: a Philox draw keyed by the layer, so a mask is never stored and the
/// backward pass (or a resumed run) regenerates the same one.
/// One Philox block decides four consecutive elements (4q … 4q+3); a kernel that draws the block once per quad uses
/// dropout_keep_word on its words and gets the same mask.
GT_HD bool dropout_keep_word(uint32_t word, double p) { return (word >> 8) * (1.0 / 16777216.0) >= p; }
GT_HD bool dropout_keep(uint64_t key, uint64_t step, uint64_t i, double p) {
  const PhiloxBlock b = philox4x32(i / 4, step, key);
  return dropout_keep_word(b.v[i % 4], p);
}
/// Attention dropout's element index of (batch b, head h, query i, key j) over T positions
/// (ops/attention.h): ((b·heads + h)·T + i)·T + j, the position of P_ij in a [B, heads, T, T] probability tensor.
GT_HD uint64_t attention_dropout_index(int64_t b, int64_t h, int64_t i, int64_t j, int64_t heads, int64_t t) {
  return static_cast<uint64_t>(((b * heads + h) * t + i) * t + j);
}

/// The row of an embedding table that input value v names: v rounded, when it is within 1e-3 of an integer in
/// [0, vocab); −1 otherwise (NaN included). The CPU throws on −1; CUDA cannot throw from a kernel
/// (ops/embedding.h says what it does instead).
template <class T>
GT_HD int64_t embedding_row(T v, int64_t vocab) {
  if (!(v > T(-1) && v < static_cast<T>(vocab))) return -1;  // also keeps the rounding below in range
  const auto row = static_cast<int64_t>(std::llround(v));
  if (row < 0 || row >= vocab || std::fabs(v - static_cast<T>(row)) > T(1e-3)) return -1;
  return row;
}

/// Softmax cross-entropy of one row with label smoothing ε (PyTorch's definition), from the row's log-sum-exp,
/// its label's logit and the sum of its k logits: (1 − ε)(lse − x_y) + ε (lse − Σx / k). Without smoothing the
/// second term is left out rather than multiplied by 0, so a −inf logit away from the label does not make it NaN.
GT_HD double ce_row_loss(double lse, double x_label, double sum_x, int64_t k, double eps) {
  if (eps == 0) return lse - x_label;
  return (1 - eps) * (lse - x_label) + eps * (lse - sum_x / static_cast<double>(k));
}
/// ∂/∂x_j of `scale` × that loss, from p_j = softmax(x)_j: scale · (p_j − ε/k − [j = y](1 − ε)).
GT_HD double ce_dlogit(double p, bool is_label, int64_t k, double eps, double scale) {
  return scale * (p - eps / static_cast<double>(k) - (is_label ? 1 - eps : 0.0));
}

/// A softmax row's Σ e^(x − max) in one read of the row (the online softmax), for a row split over several workers
/// (a CUDA cross-entropy row over a warp's lanes): each adds its columns, then the parts merge in any grouping. The
/// running maximum skips NaNs as the CPU's does; the sum of e^(x − max), in double with the difference taken in double
/// (exact for f32 elements), is rescaled when the maximum grows. sum() is NaN where the CPU's separate
/// max and sum passes give NaN: a NaN element, a +inf maximum (e^(inf − inf)) or a row of −inf. merge is symmetric to
/// the bit (the larger maximum's sum plus the other's rescaled), so the two lanes of a butterfly step get the same
/// state.
template <class T>
struct OnlineSoftmax {
  T max = -static_cast<T>(HUGE_VAL);
  double total = 0;
  bool nan = false;

  GT_HD void add(T v) {
    if (v != v) {
      nan = true;
      return;
    }
    if (v > max) {
      total =
          max == -static_cast<T>(HUGE_VAL) ? 0.0 : total * std::exp(static_cast<double>(max) - static_cast<double>(v));
      max = v;
    }
    if (v != -static_cast<T>(HUGE_VAL)) total += std::exp(static_cast<double>(v) - static_cast<double>(max));
  }
  GT_HD static OnlineSoftmax merged(const OnlineSoftmax& a, const OnlineSoftmax& b) {
    const bool a_high = a.max > b.max;
    const OnlineSoftmax& hi = a_high ? a : b;
    const OnlineSoftmax& lo = a_high ? b : a;
    OnlineSoftmax out;
    out.max = hi.max;
    out.nan = a.nan || b.nan;
    const double lo_part = lo.max == -static_cast<T>(HUGE_VAL)
                               ? 0.0
                               : lo.total * std::exp(static_cast<double>(lo.max) - static_cast<double>(hi.max));
    out.total = hi.total + lo_part;
    return out;
  }
  GT_HD double sum() const { return nan || max == -static_cast<T>(HUGE_VAL) ? static_cast<double>(NAN) : total; }
};

/// Layer normalisation of one element, given its row's mean and 1/σ: (x − μ)/σ · γ + β.
template <class T>
GT_HD T layernorm_y(T x, double mean, double inv, T gamma, T beta) {
  return static_cast<T>((x - mean) * inv * gamma + beta);
}
/// dx of layer normalisation for one element of a row of d, from the row's sums a = Σ dy·γ and b = Σ dy·γ·x̂:
/// dx = (1/σ)(dy·γ − a/d − x̂·b/d).
template <class T>
GT_HD T layernorm_dx(T x, T dy, T gamma, double mean, double inv, double a, double b, int64_t d) {
  const double xhat = (x - mean) * inv;
  return static_cast<T>(inv * (dy * gamma - a / static_cast<double>(d) - xhat * b / static_cast<double>(d)));
}
/// dx of softmax for one element, from y, dy and the row's Σ y·dy: y (dy − Σ y·dy).
template <class T>
GT_HD T softmax_dx(T y, T dy, double dot) {
  return static_cast<T>(y * (dy - dot));
}

// Activations take x (and y where cheaper) and give y = f(x) and dx = dy · f'(x).
template <class T>
GT_HD T act_forward(Activation a, T x) {
  switch (a) {
    case Activation::relu: return x < T(0) ? T(0) : x;  // NaN stays NaN, as in torch.relu
    case Activation::tanh: return std::tanh(x);
    case Activation::sigmoid: return T(1) / (T(1) + std::exp(-x));
    case Activation::gelu: return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440)));
    case Activation::gelu_tanh: {
      // 0.5 x (1 + tanh(u)), u = √(2/π) (x + 0.044715 x³), written as x·σ(2u) (0.5 (1 + tanh u) = σ(2u)): one exp
      const T u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
      return x / (T(1) + std::exp(T(-2) * u));
    }
  }
  return x;
}

template <class T>
GT_HD T act_backward(Activation a, T x, T y, T dy) {
  switch (a) {
    case Activation::relu: return x > T(0) ? dy : T(0);
    case Activation::tanh: return dy * (T(1) - y * y);
    case Activation::sigmoid: return dy * y * (T(1) - y);
    case Activation::gelu: {
      // d/dx [x Φ(x)] = Φ(x) + x φ(x)
      const T cdf = T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440)));
      const T pdf = std::exp(T(-0.5) * x * x) * T(0.39894228040143267794);
      return dy * (cdf + x * pdf);
    }
    case Activation::gelu_tanh: {
      // d/dx = 0.5 (1 + t) + 0.5 x (1 − t²) u', t = tanh(u), u' = √(2/π) (1 + 3·0.044715 x²); with s = σ(2u):
      // = s + 2 x s (1 − s) u'
      const T x2 = x * x;
      const T s = T(1) / (T(1) + std::exp(T(-1.5957691216057307118) * (x + T(0.044715) * x2 * x)));
      const T du = T(0.79788456080286535588) * (T(1) + T(0.134145) * x2);
      return dy * (s + T(2) * x * s * (T(1) - s) * du);
    }
  }
  return dy;
}

/// SGD as torch.optim.SGD defines it: g += wd·p; buf = μ·buf + (1−dampening)·g (buf = g on the first step);
/// g = g + μ·buf (Nesterov) or buf; p −= lr·g.
struct SgdHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, first_step;
};

/// The flags are template parameters so that the per-element loop has no branches and vectorises.
template <class T, bool kMomentum, bool kNesterov>
GT_HD void sgd_update(const SgdHyper& h, T& p, T g, T& buf) {
  if (h.weight_decay != 0) g += T(h.weight_decay) * p;
  if constexpr (kMomentum) {
    buf = h.first_step ? g : T(h.momentum) * buf + T(1 - h.dampening) * g;
    if constexpr (kNesterov)
      g += T(h.momentum) * buf;
    else
      g = buf;
  }
  p -= T(h.lr) * g;
}

/// Adam and AdamW as torch.optim defines them (step t counted from 1; bias corrections folded into the step):
///   AdamW: p ← p·(1 − lr·wd);  Adam: g ← g + wd·p
///   m ← β1·m + (1 − β1)·g;  v ← β2·v + (1 − β2)·g²;  (amsgrad: v̂ ← max(v̂, v), used in place of v)
///   p ← p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε)
/// The scalars are double, as PyTorch's are: 1 − β2 in float would carry a 1e-5 relative error into every step.
struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  double bias_correction1, bias_correction2_sqrt;  ///< 1 − β1ᵗ and √(1 − β2ᵗ)
  bool decoupled;                                  ///< AdamW
};

template <class T, bool kAmsgrad>
GT_HD void adam_update(const AdamHyper& h, T& p, T g, T& m, T& v, T& vmax) {
  if (h.decoupled)
    p *= T(1 - h.lr * h.weight_decay);
  else
    g += T(h.weight_decay) * p;
  m = T(h.beta1) * m + T(1 - h.beta1) * g;
  v = T(h.beta2) * v + T(1 - h.beta2) * g * g;
  T second = v;
  if constexpr (kAmsgrad) {
    vmax = vmax > v ? vmax : v;
    second = vmax;
  }
  const T denom = std::sqrt(second) / T(h.bias_correction2_sqrt) + T(h.eps);
  p -= T(h.lr / h.bias_correction1) * m / denom;
}

}  // namespace gt
