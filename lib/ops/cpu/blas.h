// Single-threaded GEMM on raw row-major pointers, for f32 and f64 (kernels that thread over other axes call it).
#pragma once

#include "ops/cpu/sgemm.h"

#include <cblas.h>

#include <type_traits>

namespace gt::cpu {

/// c = alpha · op(a) · op(b) + beta · c, row-major, on the calling thread: f32 with alpha 1 on the CPU's f32 path
/// (ops/cpu/sgemm.h), the rest through OpenBLAS.
template <class T>
inline void gemm_raw(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb, T beta,
                     T* c, int ldc) {
  const auto at = ta ? CblasTrans : CblasNoTrans, bt = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    if (alpha == 1.0f) {
      sgemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    cblas_sgemm(CblasRowMajor, at, bt, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, at, bt, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace gt::cpu
