// CUDA kernels for the bias and sum ops (add_row_bias, sum_rows, sum_squares, scale_by, add) and the strided block
// copies behind concatenation. Sums accumulate in double, so they are at least as exact as the CPU's.
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/launch.h"

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kThreads = 256;
// Column sums: a block is 32 columns (one warp wide, so each row's read is coalesced) × kColRows row lanes.
constexpr int kColRows = 16;
// A reduction into one f64 scalar: a block adds its share with one atomicAdd; this many blocks keep an H200 busy
// without piling thousands of atomics onto one address.
constexpr int64_t kReduceBlocks = 1024;

// y (rows, cols) += bias (cols) on every row.
template <class T>
__global__ void add_row_bias_kernel(T* __restrict__ y, const T* __restrict__ bias, int64_t n, int64_t cols) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] += bias[i % cols];
}

// db (cols) = Σ_r dy (rows, cols) + beta · db. Each output is summed by one block in a fixed order: deterministic.
template <class T>
__global__ void sum_rows_kernel(const T* __restrict__ dy, T* __restrict__ db, int64_t rows, int64_t cols, double beta) {
  __shared__ double part[kColRows][kWarp + 1];  // +1: lanes of a row lane hit distinct banks
  const int64_t j = blockIdx.x * int64_t{kWarp} + threadIdx.x;
  double acc = 0;
  if (j < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kColRows) acc += static_cast<double>(dy[r * cols + j]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  double s = 0;
  for (int k = 0; k < kColRows; ++k) s += part[k][threadIdx.x];
  db[j] = static_cast<T>(s + (beta != 0 ? beta * static_cast<double>(db[j]) : 0.0));
}

// out[0] += Σ g² (f64).
template <class T>
__global__ void sum_squares_kernel(const T* __restrict__ g, int64_t n, double* out) {
  double acc = 0;
  for (int64_t i = global_index(); i < n; i += grid_stride()) acc += static_cast<double>(g[i]) * g[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

// x ← x · scale[0]; the scale stays on the device, so nothing waits for the host.
template <class T>
__global__ void scale_by_kernel(T* __restrict__ x, int64_t n, const double* __restrict__ scale) {
  const double k = *scale;
  for (int64_t i = global_index(); i < n; i += grid_stride()) x[i] = static_cast<T>(x[i] * k);
}

// y may alias a or b, so no __restrict__ here.
template <class T>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = a[i] + b[i];
}

// For o in [0, outer): dst[o·dst_stride + dst_off + j] = src[o·src_stride + src_off + j], j in [0, run).
template <class E>
__global__ void strided_copy_kernel(const E* __restrict__ src, E* __restrict__ dst, int64_t outer, int64_t run,
                                    int64_t src_stride, int64_t src_off, int64_t dst_stride, int64_t dst_off) {
  const int64_t n = outer * run;
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    const int64_t o = i / run, j = i - o * run;
    dst[o * dst_stride + dst_off + j] = src[o * src_stride + src_off + j];
  }
}

}  // namespace

void launch_add_row_bias(cudaStream_t s, bool is_double, void* y, const void* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    add_row_bias_kernel<T>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(bias), n, cols);
  });
  GT_CHECK_LAUNCH();
}

void launch_sum_rows(cudaStream_t s, bool is_double, const void* dy, void* db, int64_t rows, int64_t cols,
                     double beta) {
  if (cols == 0) return;
  const dim3 block(kWarp, kColRows);
  const auto grid = static_cast<unsigned>((cols + kWarp - 1) / kWarp);
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    sum_rows_kernel<T><<<grid, block, 0, s>>>(static_cast<const T*>(dy), static_cast<T*>(db), rows, cols, beta);
  });
  GT_CHECK_LAUNCH();
}

void launch_sum_squares(cudaStream_t s, bool is_double, const void* g, int64_t n, double* out) {
  if (n == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    sum_squares_kernel<T><<<grid_for(n, kThreads, kReduceBlocks), kThreads, 0, s>>>(static_cast<const T*>(g), n, out);
  });
  GT_CHECK_LAUNCH();
}

void launch_scale_by(cudaStream_t s, bool is_double, void* x, int64_t n, const double* scale) {
  if (n == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    scale_by_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(x), n, scale);
  });
  GT_CHECK_LAUNCH();
}

void launch_add(cudaStream_t s, bool is_double, const void* a, const void* b, void* y, int64_t n) {
  if (n == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    add_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                             static_cast<T*>(y), n);
  });
  GT_CHECK_LAUNCH();
}

void launch_strided_copy(cudaStream_t s, size_t elem_size, const void* src, void* dst, int64_t outer, int64_t run,
                         int64_t src_stride, int64_t src_off, int64_t dst_stride, int64_t dst_off) {
  if (outer * run == 0) return;
  auto go = [&](auto zero, int64_t k) {  // k: elements of type E per tensor element
    using E = decltype(zero);
    strided_copy_kernel<E><<<grid_for(outer * run * k, kThreads), kThreads, 0, s>>>(
        static_cast<const E*>(src), static_cast<E*>(dst), outer, run * k, src_stride * k, src_off * k, dst_stride * k,
        dst_off * k);
  };
  if (elem_size == 8)
    go(uint64_t{}, 1);
  else if (elem_size == 4)
    go(uint32_t{}, 1);
  else if (elem_size == 2)
    go(uint16_t{}, 1);
  else
    go(uint8_t{}, static_cast<int64_t>(elem_size));
  GT_CHECK_LAUNCH();
}

}  // namespace gt::cuda
