// CPU embedding lookups (ops/embedding.h); the backward pass adds rows in index order, so repeats are deterministic.
#include "ops/embedding.h"

#include "ops/cpu/kernel_util.h"
#include "ops/math.h"

#include <algorithm>

namespace gt::cpu {
namespace {

template <class T>
void embedding_fwd_t(const Tensor& idx, const Tensor& weight, Tensor& y) {
  const int64_t n = idx.numel(), dim = weight.dim(1), vocab = weight.dim(0);
  const T* pi = idx.data<T>();
  const T* pw = weight.data<T>();
  T* py = y.data<T>();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t row = embedding_row(pi[k], vocab);
    if (row < 0)
      throw Error(fmt::format("embedding: input {} is not an index in [0, {})", static_cast<double>(pi[k]), vocab));
    std::copy(pw + row * dim, pw + (row + 1) * dim, py + k * dim);
  }
}

template <class T>
void embedding_bwd_t(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta_acc) {
  const int64_t n = idx.numel(), dim = dweight.dim(1);
  const T* pi = idx.data<T>();
  const T* pdy = dy.data<T>();
  T* pw = dweight.data<T>();
  if (beta_acc == 0)
    std::fill(pw, pw + dweight.numel(), T(0));
  else if (beta_acc != 1)
    for (int64_t i = 0; i < dweight.numel(); ++i) pw[i] = static_cast<T>(beta_acc * pw[i]);
  for (int64_t k = 0; k < n; ++k) {  // in index order: repeated rows add up deterministically
    const int64_t row = embedding_row(pi[k], dweight.dim(0));
    if (row < 0) continue;  // the forward pass has thrown on it already
    for (int64_t j = 0; j < dim; ++j) pw[row * dim + j] += pdy[k * dim + j];
  }
}

}  // namespace

void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y) {
  for_float_type(weight.dtype(), [&](auto t) { embedding_fwd_t<decltype(t)>(idx, weight, y); });
}
void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta) {
  for_float_type(dy.dtype(), [&](auto t) { embedding_bwd_t<decltype(t)>(idx, dy, dweight, beta); });
}

}  // namespace gt::cpu
