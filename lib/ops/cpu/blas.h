// Single-threaded GEMM on raw row-major pointers, for f32 and f64 (kernels that thread over other axes call it).
#pragma once

#include <cblas.h>

#include <type_traits>

namespace gt::cpu {

/// c = alpha · op(a) · op(b) + beta · c, row-major, on the calling thread.
template <class T>
inline void gemm_raw(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb, T beta,
                     T* c, int ldc) {
  const auto at = ta ? CblasTrans : CblasNoTrans, bt = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, at, bt, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, at, bt, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace gt::cpu
