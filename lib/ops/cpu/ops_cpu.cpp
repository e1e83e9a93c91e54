// CPU kernels: OpenBLAS for matrix products, OpenMP loops over the shared per-element math elsewhere.
// Every kernel is a template so that gradient checks run the same code in double.
#include "ops/cpu/ops_cpu.h"

#include "core/parallel.h"
#include "ops/cpu/blas.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace gt::cpu {
namespace {

// Below this many elements a loop runs on one thread: waking the others costs more than it saves.
constexpr int64_t kGrain = 1 << 15;

template <class T>
void gemm_call(bool ta, bool tb, int m, int n, int k, const T* a, int lda, const T* b, int ldb, double beta, T* c,
               int ldc) {
  gemm_raw<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, static_cast<T>(beta), c, ldc);
}

// OpenBLAS runs single-threaded (set_num_threads) and we split C into one block of rows or columns per
// thread: on the small, skinny products of a training step this scales far better than OpenBLAS's own
// threading, and only one thread pool (OpenMP's) competes for the cores.
template <class T> void gemm_t(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta) {
  const auto m = static_cast<int>(c.dim(0)), n = static_cast<int>(c.dim(1));
  const auto k = static_cast<int>(ta ? a.dim(0) : a.dim(1));
  const auto lda = static_cast<int>(a.dim(1)), ldb = static_cast<int>(b.dim(1));
  const T *pa = a.data<T>(), *pb = b.data<T>();
  T* pc = c.data<T>();
  constexpr int64_t kFlopsPerThread = 4 << 20;  // below this a second thread costs more than it saves
  const int64_t flops = 2LL * m * n * k;
  const bool split_m = m >= n;
  const int extent = split_m ? m : n;
  const int threads = static_cast<int>(
      std::clamp<int64_t>(std::min<int64_t>(flops / kFlopsPerThread, extent / 16), 1, num_threads()));
  if (threads <= 1) {
    gemm_call<T>(ta, tb, m, n, k, pa, lda, pb, ldb, beta, pc, n);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; ++t) {
    // Block edges on multiples of 16 keep every block's inner loops on full vectors.
    const int lo = static_cast<int>(int64_t{extent} * t / threads / 16 * 16);
    const int hi = t == threads - 1 ? extent : static_cast<int>(int64_t{extent} * (t + 1) / threads / 16 * 16);
    if (hi <= lo) continue;
    if (split_m)  // rows lo..hi of C come from rows of op(a): columns of a when transposed
      gemm_call<T>(ta, tb, hi - lo, n, k, ta ? pa + lo : pa + int64_t{lo} * lda, lda, pb, ldb, beta,
                   pc + int64_t{lo} * n, n);
    else  // columns lo..hi of C come from columns of op(b): rows of b when transposed
      gemm_call<T>(ta, tb, m, hi - lo, k, pa, lda, tb ? pb + int64_t{lo} * ldb : pb + lo, ldb, beta, pc + lo, n);
  }
}

template <class T> void add_row_bias_t(Tensor& y, const Tensor& bias) {
  const int64_t rows = y.dim(0), cols = y.dim(1);
  T* py = y.data<T>();
  const T* pb = bias.data<T>();
  parallel_for(rows, std::max<int64_t>(1, kGrain / cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* row = py + r * cols;
      for (int64_t j = 0; j < cols; ++j) row[j] += pb[j];
    }
  });
}

template <class T> void sum_rows_t(const Tensor& dy, Tensor& db, double beta) {
  const int64_t rows = dy.dim(0), cols = dy.dim(1);
  const T* p = dy.data<T>();
  T* out = db.data<T>();
  // Split over columns so each output is summed by one thread in row order: deterministic.
  parallel_for(cols, std::max<int64_t>(1, kGrain / std::max<int64_t>(rows, 1)), [&](int64_t c0, int64_t c1) {
    std::vector<T> acc(static_cast<size_t>(c1 - c0), T(0));
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = p + r * cols;
      for (int64_t j = c0; j < c1; ++j) acc[static_cast<size_t>(j - c0)] += row[j];
    }
    for (int64_t j = c0; j < c1; ++j)
      out[j] = acc[static_cast<size_t>(j - c0)] + (beta != 0 ? T(beta) * out[j] : T(0));
  });
}

template <class T> void act_fwd_t(Activation a, const Tensor& x, Tensor& y) {
  const T* px = x.data<T>();
  T* py = y.data<T>();
  auto loop = [&](auto act) {
    parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) py[i] = act_forward<T>(act, px[i]);
    });
  };
  // Instantiating the loop per activation lets the compiler drop the switch and vectorise.
  switch (a) {
    case Activation::relu: loop(std::integral_constant<Activation, Activation::relu>{}); break;
    case Activation::tanh: loop(std::integral_constant<Activation, Activation::tanh>{}); break;
    case Activation::sigmoid: loop(std::integral_constant<Activation, Activation::sigmoid>{}); break;
    case Activation::gelu: loop(std::integral_constant<Activation, Activation::gelu>{}); break;
  }
}

template <class T> void act_bwd_t(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const T *px = x.data<T>(), *py = y.data<T>(), *pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  auto loop = [&](auto act) {
    parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pdx[i] = act_backward<T>(act, px[i], py[i], pdy[i]);
    });
  };
  switch (a) {
    case Activation::relu: loop(std::integral_constant<Activation, Activation::relu>{}); break;
    case Activation::tanh: loop(std::integral_constant<Activation, Activation::tanh>{}); break;
    case Activation::sigmoid: loop(std::integral_constant<Activation, Activation::sigmoid>{}); break;
    case Activation::gelu: loop(std::integral_constant<Activation, Activation::gelu>{}); break;
  }
}

template <class T>
void cross_entropy_t(const Tensor& logits, const Tensor& labels, double eps, double scale, Tensor& dlogits,
                     Tensor& stats) {
  const int64_t batch = logits.dim(0), k = logits.dim(1);
  const T* px = logits.data<T>();
  const int32_t* py = labels.data<int32_t>();
  T* pd = dlogits.defined() ? dlogits.data<T>() : nullptr;
  std::vector<double> row_loss(static_cast<size_t>(batch));
  std::vector<uint8_t> row_hit(static_cast<size_t>(batch));
  parallel_for(batch, std::max<int64_t>(1, kGrain / (4 * k)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const T* x = px + b * k;
      const int32_t y = py[b];
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
      const double xy = static_cast<double>(x[y]);
      row_loss[static_cast<size_t>(b)] = ce_row_loss(lse, xy, sum_x, k, eps);
      row_hit[static_cast<size_t>(b)] = argmax == y;
      if (pd) {
        T* d = pd + b * k;
        for (int64_t j = 0; j < k; ++j)
          d[j] = static_cast<T>(ce_dlogit(std::exp(static_cast<double>(x[j]) - lse), j == y, k, eps, scale));
      }
    }
  });
  double loss = 0, hits = 0;
  for (int64_t b = 0; b < batch; ++b) loss += row_loss[static_cast<size_t>(b)], hits += row_hit[static_cast<size_t>(b)];
  double* s = stats.data<double>();
  s[0] += loss;
  s[1] += hits;
}

template <class T> void mse_t(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats) {
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

template <class T> void sgd_t(const SgdHyper& h, Tensor& param, const Tensor& grad, Tensor& momentum) {
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

template <class T> double sum_squares_t(const Tensor& grad) {
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

template <class T> void add_t(const Tensor& a, const Tensor& b, Tensor& y) {
  const T *pa = a.data<T>(), *pb = b.data<T>();
  T* py = y.data<T>();
  parallel_for(y.numel(), kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) py[i] = pa[i] + pb[i];
  });
}

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  for_float_type(y.dtype(), [&](auto t) { add_t<decltype(t)>(a, b, y); });
}

namespace {

// For o in [0, outer): copy `run` elements from src[o·src_stride + src_off] to dst[o·dst_stride + dst_off].
// Concatenation and its inverse are both this strided block copy.
void strided_copy(const Tensor& src, Tensor& dst, int64_t outer, int64_t run, int64_t src_stride, int64_t src_off,
                  int64_t dst_stride, int64_t dst_off) {
  const size_t es = dtype_size(src.dtype());
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
  parallel_for(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(run, 1)), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      std::memcpy(d + static_cast<size_t>(o * dst_stride + dst_off) * es,
                  s + static_cast<size_t>(o * src_stride + src_off) * es, static_cast<size_t>(run) * es);
  });
}

}  // namespace

void copy_blocks(const Tensor& src, Tensor& dst, int64_t outer, int64_t src_inner, int64_t dst_inner,
                 int64_t dst_offset) {
  strided_copy(src, dst, outer, src_inner, src_inner, 0, dst_inner, dst_offset);
}

void split_blocks(const Tensor& whole, Tensor& part, int64_t outer, int64_t part_inner, int64_t whole_inner,
                  int64_t offset) {
  strided_copy(whole, part, outer, part_inner, whole_inner, offset, part_inner, 0);
}

void matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta) {
  for_float_type(c.dtype(), [&](auto t) { gemm_t<decltype(t)>(a, ta, b, tb, c, beta); });
}
void add_row_bias(Tensor& y, const Tensor& bias) {
  for_float_type(y.dtype(), [&](auto t) { add_row_bias_t<decltype(t)>(y, bias); });
}
void sum_rows(const Tensor& dy, Tensor& db, double beta) {
  for_float_type(dy.dtype(), [&](auto t) { sum_rows_t<decltype(t)>(dy, db, beta); });
}
void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) { act_fwd_t<decltype(t)>(a, x, y); });
}
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  for_float_type(x.dtype(), [&](auto t) { act_bwd_t<decltype(t)>(a, x, y, dy, dx); });
}
void cross_entropy(const Tensor& logits, const Tensor& labels, double eps, double scale, Tensor& dlogits,
                   Tensor& stats) {
  for_float_type(logits.dtype(),
                [&](auto t) { cross_entropy_t<decltype(t)>(logits, labels, eps, scale, dlogits, stats); });
}
void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats) {
  for_float_type(pred.dtype(), [&](auto t) { mse_t<decltype(t)>(pred, target, scale, dpred, stats); });
}
void sgd_step(const SgdHyper& h, Tensor& param, const Tensor& grad, Tensor& momentum) {
  for_float_type(param.dtype(), [&](auto t) { sgd_t<decltype(t)>(h, param, grad, momentum); });
}
void adam_step(const AdamHyper& h, bool amsgrad, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, Tensor& vmax) {
  for_float_type(param.dtype(), [&](auto t) { adam_t<decltype(t)>(h, amsgrad, param, grad, m, v, vmax); });
}
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

}  // namespace gt::cpu
