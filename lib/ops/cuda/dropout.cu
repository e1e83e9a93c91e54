// CUDA dropout (ops/dropout.h): the CPU's Philox mask (ops/math.h), regenerated from key, step and index.
#include "ops/dropout.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/math.h"

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kThreads = 256;

// y = x · keep · scale. One thread per quad of elements: a Philox block gives the four words of elements 4q … 4q+3
// (ops/math.h dropout_keep), so each block is drawn once. y may alias x.
template <class T>
__global__ void dropout_kernel(const T* x, double p, uint64_t key, uint64_t step, T scale, T* y, int64_t n) {
  const int64_t quads = (n + 3) / 4;
  for (int64_t q = global_index(); q < quads; q += grid_stride()) {
    const PhiloxBlock b = philox4x32(static_cast<uint64_t>(q), step, key);
    for (int e = 0; e < 4; ++e) {
      const int64_t i = 4 * q + e;
      if (i < n) y[i] = dropout_keep_word(b.v[e], p) ? x[i] * scale : T(0);
    }
  }
}

void launch_dropout(cudaStream_t s, bool is_double, const void* x, double p, uint64_t key, uint64_t step, void* y,
                    int64_t n) {
  if (n == 0) return;
  const double scale = 1.0 / (1.0 - p);  // as the CPU computes it, then rounded to T
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    dropout_kernel<T><<<grid_for((n + 3) / 4, kThreads), kThreads, 0, s>>>(
        static_cast<const T*>(x), p, key, step, static_cast<T>(scale), static_cast<T*>(y), n);
  });
  GT_CHECK_LAUNCH();
}

}  // namespace

void dropout(const Tensor& x, double p, uint64_t key, uint64_t step, Tensor& y) {
  launch_dropout(stream(x.device().index), is_f64("dropout", x), x.raw(), p, key, step, y.raw(), x.numel());
}

}  // namespace gt::cuda
