// CUDA embedding lookups (ops/embedding.h): a thread per output element; the backward pass adds repeated rows with
// atomics.
#include "ops/embedding.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/math.h"

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kThreads = 256;

// y (n, dim) = weight[row(idx[k]), :]; a row of y whose index is invalid is NaN (ops/embedding.h).
template <class T>
__global__ void embedding_fwd_kernel(const T* __restrict__ idx, const T* __restrict__ weight, int64_t n, int64_t dim,
                                     int64_t vocab, T* __restrict__ y) {
  const int64_t total = n * dim;
  for (int64_t e = global_index(); e < total; e += grid_stride()) {
    const int64_t k = e / dim, j = e - k * dim;
    const int64_t row = embedding_row(idx[k], vocab);
    y[e] = row < 0 ? quiet_nan<T>() : weight[row * dim + j];
  }
}

template <class T>
__global__ void scale_kernel(T* __restrict__ x, int64_t n, double k) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) x[i] = static_cast<T>(k * x[i]);
}

// dweight[row(idx[k]), :] += dy[k, :]; repeated rows add up with atomics (in no fixed order); invalid rows skipped.
template <class T>
__global__ void embedding_bwd_kernel(const T* __restrict__ idx, const T* __restrict__ dy, int64_t n, int64_t dim,
                                     int64_t vocab, T* __restrict__ dweight) {
  const int64_t total = n * dim;
  for (int64_t e = global_index(); e < total; e += grid_stride()) {
    const int64_t k = e / dim, j = e - k * dim;
    const int64_t row = embedding_row(idx[k], vocab);
    if (row >= 0) atomicAdd(dweight + row * dim + j, dy[e]);
  }
}

void launch_embedding_forward(cudaStream_t s, bool is_double, const void* idx, const void* weight, int64_t n,
                              int64_t vocab, int64_t dim, void* y) {
  if (n * dim == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    embedding_fwd_kernel<T><<<grid_for(n * dim, kThreads), kThreads, 0, s>>>(
        static_cast<const T*>(idx), static_cast<const T*>(weight), n, dim, vocab, static_cast<T*>(y));
  });
  GT_CHECK_LAUNCH();
}

void launch_embedding_backward(cudaStream_t s, bool is_double, const void* idx, const void* dy, int64_t n,
                               int64_t vocab, int64_t dim, void* dweight, double beta) {
  const int64_t table = vocab * dim;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    T* dw = static_cast<T*>(dweight);
    if (table > 0 && beta == 0) {
      GT_CHECK_CUDA(cudaMemsetAsync(dw, 0, static_cast<size_t>(table) * sizeof(T), s));
    } else if (table > 0 && beta != 1) {
      scale_kernel<T><<<grid_for(table, kThreads), kThreads, 0, s>>>(dw, table, beta);
      GT_CHECK_LAUNCH();
    }
    if (n * dim == 0) return;
    embedding_bwd_kernel<T><<<grid_for(n * dim, kThreads), kThreads, 0, s>>>(
        static_cast<const T*>(idx), static_cast<const T*>(dy), n, dim, vocab, dw);
    GT_CHECK_LAUNCH();
  });
}

}  // namespace

void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y) {
  launch_embedding_forward(stream(weight.device().index), is_f64("embedding_forward", weight), idx.raw(), weight.raw(),
                           idx.numel(), weight.dim(0), weight.dim(1), y.raw());
}

void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta) {
  launch_embedding_backward(stream(dweight.device().index), is_f64("embedding_backward", dweight), idx.raw(), dy.raw(),
                            idx.numel(), dweight.dim(0), dweight.dim(1), dweight.raw(), beta);
}

}  // namespace gt::cuda
