// CUDA softmax over rows (ops/softmax.h): one block per row, the row's max and sum by block reductions, sums in
// double. Per-element math is ops/math.h's (the CPU runs the same functions).
#include "ops/softmax.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/math.h"

#include <cmath>

namespace gt::cuda {
namespace {

using namespace kern;

// y = softmax(x) over rows of d; one block per row. A NaN or +inf anywhere in a row makes the whole row NaN, on
// the CPU and here, so the order in which block_max meets NaNs does not matter.
template <class T>
__global__ void softmax_fwd_kernel(const T* __restrict__ x, int64_t d, T* __restrict__ y) {
  const int64_t r = blockIdx.x;
  const T* row = x + r * d;
  T* out = y + r * d;
  T m = -infinity<T>();
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) m = row[i] > m ? row[i] : m;
  const T mx = block_max(m);
  double s = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += (out[i] = std::exp(row[i] - mx));  // exp in T, as the CPU
  const T inv = static_cast<T>(1.0 / block_sum(s));
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out[i] *= inv;  // this thread wrote out[i] above
}

// dx = y (dy − Σ y·dy) over rows of d; one block per row.
template <class T>
__global__ void softmax_bwd_kernel(const T* __restrict__ y, const T* __restrict__ dy, int64_t d, T* __restrict__ dx) {
  const int64_t r = blockIdx.x;
  const T *py = y + r * d, *pdy = dy + r * d;
  double dot = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dot += py[i] * pdy[i];  // the product in T, as on the CPU
  dot = block_sum(dot);
  T* out = dx + r * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out[i] = softmax_dx<T>(py[i], pdy[i], dot);
}

void launch_softmax_forward(cudaStream_t s, bool is_double, const void* x, int64_t rows, int64_t d, void* y) {
  if (rows == 0 || d == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    softmax_fwd_kernel<T>
        <<<static_cast<unsigned>(rows), row_threads(d), 0, s>>>(static_cast<const T*>(x), d, static_cast<T*>(y));
  });
  GT_CHECK_LAUNCH();
}

void launch_softmax_backward(cudaStream_t s, bool is_double, const void* y, const void* dy, int64_t rows, int64_t d,
                             void* dx) {
  if (rows == 0 || d == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    softmax_bwd_kernel<T><<<static_cast<unsigned>(rows), row_threads(d), 0, s>>>(
        static_cast<const T*>(y), static_cast<const T*>(dy), d, static_cast<T*>(dx));
  });
  GT_CHECK_LAUNCH();
}

}  // namespace

void softmax_forward(const Tensor& x, int64_t d, Tensor& y) {
  launch_softmax_forward(stream(x.device().index), is_f64("softmax_forward", x), x.raw(), x.numel() / d, d, y.raw());
}

void softmax_backward(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx) {
  launch_softmax_backward(stream(y.device().index), is_f64("softmax_backward", y), y.raw(), dy.raw(), y.numel() / d, d,
                          dx.raw());
}

}  // namespace gt::cuda
