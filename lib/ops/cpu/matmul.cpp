// CPU matrix products (OpenBLAS, one block of C per thread), the bias ops and the forward of a dense layer
// (ops/matmul.h).
#include "ops/matmul.h"

#include "core/half.h"
#include "core/parallel.h"
#include "ops/activation.h"
#include "ops/cpu/bf16_gemm.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/vec_math.h"
#include "ops/elementwise.h"
#include "ops/half_storage.h"
#include "ops/precision.h"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace gt::cpu {
namespace {

template <class T>
void gemm_call(bool ta, bool tb, int m, int n, int k, const T* a, int lda, const T* b, int ldb, double beta, T* c,
               int ldc) {
  gemm_raw<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, static_cast<T>(beta), c, ldc);
}

// y[r, c0..c1) += bias[c0..c1) for rows r0..r1 of a row-major y with n columns.
template <class T>
void add_bias_block(T* y, int64_t n, const T* bias, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  for (int64_t r = r0; r < r1; ++r) {
    T* row = y + r * n;
    for (int64_t j = c0; j < c1; ++j) row[j] += bias[j];
  }
}

// On OpenBLAS's path (ops/cpu/sgemm.h), the bias of linear_forward enters a block of C before the product when it sums
// all of k in one pass over C (k ≤ kBiasFirstK): C starts as the bias, and beta = 1 makes the kernel add the product to
// it, fl(bias + Σ), the same number as fl(Σ + bias) after a product into a zeroed C (beta = 0). That skips OpenBLAS's
// zeroing pass and our pass over C for the bias (measured: ~0.15-0.3 ms of CPU per call at gpt_bytes' 1024 × 128 →
// 128..512 products, caches cold). Past one pass (its kernels take 256 to 512 of k at a time; OpenBLAS 0.3.21's Zen one
// 320) the bias would be summed with the first part of k only, so larger k adds the bias after the product. (Sole
// difference: a product of exactly −0 plus a bias of −0 is now −0, before +0.)
constexpr int kBiasFirstK = 128;

// A half product by conversion (train.precision bf16 or fp16, ops/precision.h): the operands' elements rounded to the
// format (nearest even), so that an f32 GEMM on them computes what a GPU's half GEMM with f32 accumulation does (up to
// the order of the sums: each product of two half values is exact in f32). A weight's copy comes from the scope's
// rounded weights (made once per step); any other operand is rounded into the calling thread's scratch `buf`, which
// grows to the largest operand once and stays.
const float* half_operand(const Tensor& t, bool weight, HalfFormat format, std::vector<float>& buf) {
  if (weight) return half_weight(t, format);
  if (const float* cached = find_half_weight(t, format)) return cached;  // dx = dy·W reads the forward's copy of W
  return rounded_copy(t, format, buf);
}

// The threads a product of m × n from k takes: one per 4 MFLOP, and per 16 rows or columns of C.
int product_threads(int m, int n, int k) {
  constexpr int64_t kFlopsPerThread = 4 << 20;  // below this a second thread costs more than it saves
  const int64_t flops = 2LL * m * n * k;
  return static_cast<int>(
      std::clamp<int64_t>(std::min<int64_t>(flops / kFlopsPerThread, std::max(m, n) / 16), 1, num_threads()));
}

// Calls block(r0, r1, c0, c1) for C's (m × n, from products over k) rows r0..r1 and columns c0..c1: one block of
// rows or columns per thread (rows of C come from rows of op(a), columns from columns of op(b)), or all of C on the
// calling thread when the product is small.
template <class F>
void for_c_blocks(int m, int n, int k, F&& block) {
  for_matrix_blocks(m, n, product_threads(m, n, k), block);
}

// A fused epilogue for each finished block of C: an activation (linear_forward_act), y[r·n + j] = act(c[r·n + j])
// (y may be C), or a residual sum (linear_forward_add, `residual` set), c[r·n + j] += residual[r·n + j] (y is C).
template <class T>
struct ActOut {
  Activation act;
  T* y;
  const T* residual = nullptr;
};

// OpenBLAS runs single-threaded (set_num_threads) and we split C into one block of rows or columns per
// thread: on the small, skinny products of a training step this scales far better than OpenBLAS's own
// threading, and only one thread pool (OpenMP's) competes for the cores. `bias` (null: none; c = op(a)·op(b) + bias
// per row, beta 0 only) is added to each thread's block of C as part of the thread's work. `b_weight`: b is a weight
// (linear_forward's w), whose half copy is made once per scope. `out` (null: none) finishes each block of C as it
// is finished where our kernels or the blocks below compute it, and after the product on the native bf16 path.
template <class T>
void gemm_t(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta, const T* bias = nullptr,
            bool b_weight = false, const ActOut<T>* out = nullptr) {
  const auto m = static_cast<int>(c.dim(0)), n = static_cast<int>(c.dim(1));
  const auto k = static_cast<int>(ta ? a.dim(0) : a.dim(1));
  const auto lda = static_cast<int>(a.dim(1)), ldb = static_cast<int>(b.dim(1));
  const T *pa = a.data<T>(), *pb = b.data<T>();
  // gemm_bf16 rounds the f32 operands itself while it packs them, and so do our f32 kernels on the conversion path
  // (sgemm_bf16_rounded): no rounded copies then.
  bool native_bf16 = false, bf16_in_pack = false;
  if constexpr (std::is_same_v<T, float>) {
    const auto format = half_format(product_precision());
    native_bf16 = format == HalfFormat::bf16 && cpu_bf16_path() == CpuBf16Path::native;
    bf16_in_pack = format == HalfFormat::bf16 && !native_bf16 && cpu_bf16_rounds_in_pack();
    if (format && !native_bf16 && !bf16_in_pack) {
      thread_local std::vector<float> buf_a, buf_b;
      pa = half_operand(a, false, *format, buf_a);
      pb = half_operand(b, b_weight, *format, buf_b);
    }
  }
  T* pc = c.data<T>();
  // C's rows r0..r1, columns c0..c1, activated into out->y, or with the residual added.
  auto activate = [&](int r0, int r1, int c0, int c1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* row = pc + r * n + c0;
      if (out->residual)
        add_span(row, out->residual + r * n + c0, row, c1 - c0);
      else
        activation_span(out->act, row, out->y + r * n + c0, c1 - c0);
    }
  };
  const bool own_sgemm = std::is_same_v<T, float> && cpu_sgemm_path() != CpuSgemmPath::openblas;
  if constexpr (std::is_same_v<T, float>) {
    if (native_bf16) {  // the kernel adds the bias as it stores C's last sums: the same fl(Σ + bias)
      gemm_bf16_threads(product_threads(m, n, k), ta, tb, m, n, k, pa, lda, pb, ldb, static_cast<float>(beta), pc, n,
                        bias);
      if (out)
        parallel_for(m, std::max<int64_t>(1, kGrain / n),
                     [&](int64_t r0, int64_t r1) { activate(static_cast<int>(r0), static_cast<int>(r1), 0, n); });
      return;
    }
    if (own_sgemm) {  // our kernels thread the product themselves, the bias added as they store C
      const BlockDone done = out ? BlockDone(activate) : BlockDone();
      sgemm_threads(product_threads(m, n, k), bf16_in_pack, ta, tb, m, n, k, pa, lda, pb, ldb, static_cast<float>(beta),
                    pc, n, bias, out ? &done : nullptr);
      return;
    }
  }
  const bool bias_first = bias && k <= kBiasFirstK;
  // C's rows r0..r1, columns c0..c1, from the rows of op(a) and the columns of op(b) they need.
  auto block = [&](int r0, int r1, int c0, int c1) {
    const T* ba = ta ? pa + r0 : pa + int64_t{r0} * lda;
    const T* bb = tb ? pb + int64_t{c0} * ldb : pb + c0;
    T* bc = pc + int64_t{r0} * n + c0;
    if (bias_first)
      for (int64_t r = r0; r < r1; ++r) std::copy(bias + c0, bias + c1, pc + r * n + c0);
    gemm_call<T>(ta, tb, r1 - r0, c1 - c0, k, ba, lda, bb, ldb, bias_first ? 1.0 : beta, bc, n);
    if (bias && !bias_first) add_bias_block(pc, n, bias, r0, r1, c0, c1);
    if (out) activate(r0, r1, c0, c1);
  };
  for_c_blocks(m, n, k, block);
}

// c = op(a)·b + beta·c with b (k × n, not transposed) already in bf16, on the native path: gemm_bf16 packs it as it
// is, on the threads gemm_t would give the product.
void gemm_half_b_native(const Tensor& a, bool ta, const uint16_t* b, Tensor& c, double beta) {
  const auto m = static_cast<int>(c.dim(0)), n = static_cast<int>(c.dim(1));
  const auto k = static_cast<int>(ta ? a.dim(0) : a.dim(1));
  gemm_bf16_threads(product_threads(m, n, k), ta, false, m, n, k, a.data<float>(), static_cast<int>(a.dim(1)), b, n,
                    static_cast<float>(beta), c.data<float>(), n);
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

// acc[j] += Σ_r p[r·ld + j] for j < w, each column summed in row order. Compiled per instruction set: as a plain
// template loop it ran on SSE (~2 % of a GPT step's samples, its bias gradients).
template <class T>
GT_INLINE void column_sums(const T* p, int64_t rows, int64_t ld, int64_t w, T* __restrict acc) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* __restrict row = p + r * ld;
    for (int64_t j = 0; j < w; ++j) acc[j] += row[j];
  }
}
GT_CPU_KERNEL(column_sums_f32, (const float* p, int64_t rows, int64_t ld, int64_t w, float* acc), (p, rows, ld, w, acc),
              column_sums)

template <class T>
void sum_rows_t(const Tensor& dy, Tensor& db, double beta) {
  const int64_t rows = dy.dim(0), cols = dy.dim(1);
  const T* p = dy.data<T>();
  T* out = db.data<T>();
  // Split over columns so each output is summed by one thread in row order: deterministic.
  parallel_for(cols, std::max<int64_t>(1, kGrain / std::max<int64_t>(rows, 1)), [&](int64_t c0, int64_t c1) {
    std::vector<T> acc(static_cast<size_t>(c1 - c0), T(0));
    if constexpr (std::is_same_v<T, float>)
      column_sums_f32(p + c0, rows, cols, c1 - c0, acc.data());
    else
      column_sums(p + c0, rows, cols, c1 - c0, acc.data());
    for (int64_t j = c0; j < c1; ++j) out[j] = acc[static_cast<size_t>(j - c0)] + (beta != 0 ? T(beta) * out[j] : T(0));
  });
}

}  // namespace

void matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta) {
  for_float_type(c.dtype(), [&](auto t) { gemm_t<decltype(t)>(a, ta, b, tb, c, beta); });
}
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  for_float_type(y.dtype(), [&](auto t) {
    using T = decltype(t);
    gemm_t<T>(x, false, w, true, y, 0.0, bias.defined() ? bias.data<T>() : nullptr, true);
  });
}
void linear_forward_act(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act, Tensor& h, Tensor& y) {
  for_float_type(y.dtype(), [&](auto t) {
    using T = decltype(t);
    const ActOut<T> out{act, y.data<T>()};
    gemm_t<T>(x, false, w, true, h.defined() ? h : y, 0.0, bias.defined() ? bias.data<T>() : nullptr, true, &out);
  });
}
void linear_forward_add(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& r, Tensor& y) {
  for_float_type(y.dtype(), [&](auto t) {
    using T = decltype(t);
    const ActOut<T> out{Activation::relu, y.data<T>(), r.data<T>()};  // (no activation runs with a residual)
    gemm_t<T>(x, false, w, true, y, 0.0, bias.defined() ? bias.data<T>() : nullptr, true, &out);
  });
}
void matmul_half_b(const Tensor& a, bool ta, const ops::HalfMatrix& b, Tensor& c, double beta) {
  if (b.format == HalfFormat::bf16 && product_precision() == Precision::bf16 &&
      cpu_bf16_path() == CpuBf16Path::native) {
    gemm_half_b_native(a, ta, static_cast<const uint16_t*>(b.data), c, beta);
    return;
  }
  // Elsewhere the product takes f32 operands: b widened into the calling thread's scratch, kept for the next call.
  thread_local Tensor wide;
  const int64_t numel = b.rows * b.cols;
  if (!wide.defined() || wide.numel() < numel) wide = Tensor::empty(Shape{numel}, DType::f32);
  Tensor bw = wide.narrow0(numel).view(Shape{b.rows, b.cols});
  unpack_activation(b.format, b.data, bw);
  matmul(a, ta, bw, false, c, beta);
}
void add_row_bias(Tensor& y, const Tensor& bias) {
  for_float_type(y.dtype(), [&](auto t) { add_row_bias_t<decltype(t)>(y, bias); });
}
void sum_rows(const Tensor& dy, Tensor& db, double beta) {
  for_float_type(dy.dtype(), [&](auto t) { sum_rows_t<decltype(t)>(dy, db, beta); });
}
void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, double beta) {
  matmul(dy, true, x, false, dw, beta);
  if (db.defined()) sum_rows(dy, db, beta);
}

void linear_backward(const Tensor& dy, const Tensor& x, const ops::HalfMatrix* x_half, const Tensor& w, Tensor& dw,
                     Tensor& db, Tensor& dx, double beta) {
  if (dw.defined() && x_half) {
    cpu::matmul_half_b(dy, true, *x_half, dw, beta);
    if (db.defined()) sum_rows(dy, db, beta);
  } else if (dw.defined()) {
    linear_backward_weight(dy, x, dw, db, beta);
  } else if (db.defined())
    sum_rows(dy, db, beta);
  if (dx.defined()) matmul(dy, false, w, false, dx, 0.0);
}

}  // namespace gt::cpu
