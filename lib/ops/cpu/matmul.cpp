// CPU matrix products (OpenBLAS, one block of C per thread) and the bias ops of a dense layer (ops/matmul.h).
#include "ops/matmul.h"

#include "core/parallel.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/kernel_util.h"

#include <algorithm>
#include <vector>

namespace gt::cpu {
namespace {

template <class T>
void gemm_call(bool ta, bool tb, int m, int n, int k, const T* a, int lda, const T* b, int ldb, double beta, T* c,
               int ldc) {
  gemm_raw<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, static_cast<T>(beta), c, ldc);
}

// OpenBLAS runs single-threaded (set_num_threads) and we split C into one block of rows or columns per
// thread: on the small, skinny products of a training step this scales far better than OpenBLAS's own
// threading, and only one thread pool (OpenMP's) competes for the cores.
template <class T>
void gemm_t(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta) {
  const auto m = static_cast<int>(c.dim(0)), n = static_cast<int>(c.dim(1));
  const auto k = static_cast<int>(ta ? a.dim(0) : a.dim(1));
  const auto lda = static_cast<int>(a.dim(1)), ldb = static_cast<int>(b.dim(1));
  const T *pa = a.data<T>(), *pb = b.data<T>();
  T* pc = c.data<T>();
  constexpr int64_t kFlopsPerThread = 4 << 20;  // below this a second thread costs more than it saves
  const int64_t flops = 2LL * m * n * k;
  const bool split_m = m >= n;
  const int extent = split_m ? m : n;
  const int threads =
      static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(flops / kFlopsPerThread, extent / 16), 1, num_threads()));
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

template <class T>
void add_row_bias_t(Tensor& y, const Tensor& bias) {
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

template <class T>
void sum_rows_t(const Tensor& dy, Tensor& db, double beta) {
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
    for (int64_t j = c0; j < c1; ++j) out[j] = acc[static_cast<size_t>(j - c0)] + (beta != 0 ? T(beta) * out[j] : T(0));
  });
}

}  // namespace

void matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta) {
  for_float_type(c.dtype(), [&](auto t) { gemm_t<decltype(t)>(a, ta, b, tb, c, beta); });
}
void add_row_bias(Tensor& y, const Tensor& bias) {
  for_float_type(y.dtype(), [&](auto t) { add_row_bias_t<decltype(t)>(y, bias); });
}
void sum_rows(const Tensor& dy, Tensor& db, double beta) {
  for_float_type(dy.dtype(), [&](auto t) { sum_rows_t<decltype(t)>(dy, db, beta); });
}

}  // namespace gt::cpu
