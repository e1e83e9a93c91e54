// CUDA embedding lookups (ops/embedding.h): a thread per output element. The backward pass adds a row's repeats in
// token order, as the CPU does, so its bits are the CPU's and the same on every run: the tokens are sorted by row
// (CUB's radix sort, stable), then one thread per (row, column) adds the row's tokens' gradients in order. (An
// atomicAdd per token, as before, added them in whatever order the threads ran.)
#include "ops/embedding.h"

#include "ops/cuda/allocator.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/math.h"

#include <cub/device/device_radix_sort.cuh>

#include <limits>

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kThreads = 256;

// y (n, dim) = weight[row(idx[k]), :]; a row of y whose index is invalid is NaN (ops/embedding.h). y is stored as Y
// (T, or a 16-bit activation: each weight rounded once, kernel_util.cuh's store).
template <class T, class Y>
__global__ void embedding_fwd_kernel(const T* __restrict__ idx, const T* __restrict__ weight, int64_t n, int64_t dim,
                                     int64_t vocab, Y* __restrict__ y) {
  const int64_t total = n * dim;
  for (int64_t e = global_index(); e < total; e += grid_stride()) {
    const int64_t k = e / dim, j = e - k * dim;
    const int64_t row = embedding_row(idx[k], vocab);
    y[e] = store<Y>(row < 0 ? quiet_nan<T>() : weight[row * dim + j]);
  }
}

template <class T>
__global__ void scale_kernel(T* __restrict__ x, int64_t n, double k) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) x[i] = static_cast<T>(k * x[i]);
}

// keys[k] = the row of token k (vocab for an invalid index: sorted after every row and skipped), tokens[k] = k.
template <class T>
__global__ void embedding_keys_kernel(const T* __restrict__ idx, int64_t n, int64_t vocab, int32_t* __restrict__ keys,
                                      int32_t* __restrict__ tokens) {
  for (int64_t k = global_index(); k < n; k += grid_stride()) {
    const int64_t row = embedding_row(idx[k], vocab);
    keys[k] = static_cast<int32_t>(row < 0 ? vocab : row);
    tokens[k] = static_cast<int32_t>(k);
  }
}

// keys and tokens sorted by key, each key's tokens in increasing order: the thread of (i, j) where sorted position i
// starts a key's run adds dy[token, j] of the run's tokens, in order, to dweight[key, j] (the CPU's order). dy is
// stored as G (T, or a 16-bit activation gradient, widened exactly), the sum is in T.
template <class T, class G>
__global__ void embedding_runs_kernel(const int32_t* __restrict__ keys, const int32_t* __restrict__ tokens,
                                      const G* __restrict__ dy, int64_t n, int64_t dim, int64_t vocab,
                                      T* __restrict__ dweight) {
  const int64_t total = n * dim;
  for (int64_t e = global_index(); e < total; e += grid_stride()) {
    const int64_t i = e / dim, j = e - i * dim;
    const int32_t key = keys[i];
    if (key >= vocab || (i > 0 && keys[i - 1] == key)) continue;
    T acc = dweight[key * dim + j];
    for (int64_t m = i; m < n && keys[m] == key; ++m) acc += load(dy[int64_t{tokens[m]} * dim + j]);
    dweight[key * dim + j] = acc;
  }
}

// Device scratch from the caching allocator, given back when it goes out of scope (after the kernels that use it are
// queued: every user of the allocator runs on the device's one stream, allocator.h).
class Scratch {
 public:
  Scratch(int device, size_t bytes) : m_device(device), m_ptr(device_alloc(device, bytes)) {}
  ~Scratch() { device_free(m_device, m_ptr); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class U>
  U* as() const {
    return static_cast<U*>(m_ptr);
  }

 private:
  int m_device;
  void* m_ptr;
};

void launch_embedding_forward(cudaStream_t s, DType weight_type, DType y_type, const void* idx, const void* weight,
                              int64_t n, int64_t vocab, int64_t dim, void* y) {
  if (n * dim == 0) return;
  with_storage_pair("embedding_forward", weight_type, y_type, [&](auto sw, auto sy) {
    using T = decltype(sw);
    using Y = decltype(sy);
    if constexpr (!is_half_storage<T>)  // (the table is f32 or f64: the op layer widens a 16-bit one)
      embedding_fwd_kernel<T, Y><<<grid_for(n * dim, kThreads), kThreads, 0, s>>>(
          static_cast<const T*>(idx), static_cast<const T*>(weight), n, dim, vocab, static_cast<Y*>(y));
  });
  GT_CHECK_LAUNCH();
}

// The backward pass with the table in T (f32 or f64) and dy stored as G.
template <class T, class G>
void launch_embedding_backward_t(int device, cudaStream_t s, const void* idx, const void* dy, int64_t n, int64_t vocab,
                                 int64_t dim, void* dweight, double beta) {
  const int64_t table = vocab * dim;
  T* dw = static_cast<T*>(dweight);
  if (table > 0 && beta == 0) {
    GT_CHECK_CUDA(cudaMemsetAsync(dw, 0, static_cast<size_t>(table) * sizeof(T), s));
  } else if (table > 0 && beta != 1) {
    scale_kernel<T><<<grid_for(table, kThreads), kThreads, 0, s>>>(dw, table, beta);
    GT_CHECK_LAUNCH();
  }
  if (n * dim == 0) return;
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  GT_CHECK(n <= kMax && vocab < kMax, "embedding backward on CUDA: {} tokens of a {}-row table (at most 2^31 − 1)", n,
           vocab);
  const int count = static_cast<int>(n);
  int end_bit = 1;  // keys run to vocab inclusive
  while (end_bit < 32 && (int64_t{1} << end_bit) <= vocab) ++end_bit;
  const Scratch keys(device, sizeof(int32_t) * static_cast<size_t>(n)),
      sorted_keys(device, sizeof(int32_t) * static_cast<size_t>(n)),
      tokens(device, sizeof(int32_t) * static_cast<size_t>(n)),
      sorted_tokens(device, sizeof(int32_t) * static_cast<size_t>(n));
  embedding_keys_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const T*>(idx), n, vocab,
                                                                      keys.as<int32_t>(), tokens.as<int32_t>());
  GT_CHECK_LAUNCH();
  size_t temp_bytes = 0;
  GT_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys.as<int32_t>(), sorted_keys.as<int32_t>(),
                                                tokens.as<int32_t>(), sorted_tokens.as<int32_t>(), count, 0, end_bit,
                                                s));
  const Scratch temp(device, std::max<size_t>(temp_bytes, 1));
  GT_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys.as<int32_t>(),
                                                sorted_keys.as<int32_t>(), tokens.as<int32_t>(),
                                                sorted_tokens.as<int32_t>(), count, 0, end_bit, s));
  embedding_runs_kernel<T, G><<<grid_for(n * dim, kThreads), kThreads, 0, s>>>(
      sorted_keys.as<int32_t>(), sorted_tokens.as<int32_t>(), static_cast<const G*>(dy), n, dim, vocab, dw);
  GT_CHECK_LAUNCH();
}

void launch_embedding_backward(int device, DType dweight_type, DType dy_type, const void* idx, const void* dy,
                               int64_t n, int64_t vocab, int64_t dim, void* dweight, double beta) {
  const cudaStream_t s = stream(device);
  with_storage_pair("embedding_backward", dweight_type, dy_type, [&](auto sw, auto sg) {
    using T = decltype(sw);
    using G = decltype(sg);
    if constexpr (!is_half_storage<T>)
      launch_embedding_backward_t<T, G>(device, s, idx, dy, n, vocab, dim, dweight, beta);
  });
}

}  // namespace

void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y) {
  is_f64("embedding_forward", weight);  // (the table: f32 or f64; y may be a 16-bit activation beside an f32 one)
  launch_embedding_forward(stream(weight.device().index), weight.dtype(), y.dtype(), idx.raw(), weight.raw(),
                           idx.numel(), weight.dim(0), weight.dim(1), y.raw());
}

void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta) {
  is_f64("embedding_backward", dweight);
  launch_embedding_backward(dweight.device().index, dweight.dtype(), dy.dtype(), idx.raw(), dy.raw(), idx.numel(),
                            dweight.dim(0), dweight.dim(1), dweight.raw(), beta);
}

}  // namespace gt::cuda
