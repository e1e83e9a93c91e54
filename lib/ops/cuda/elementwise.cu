// CUDA element-wise sums and the strided block copies behind concatenation (ops/elementwise.h).
#include "ops/elementwise.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kThreads = 256;

// y may alias a or b, so no __restrict__ here.
template <class T>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = a[i] + b[i];
}

template <class T>
__global__ void scale_kernel(T* x, T s, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) x[i] *= s;
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

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  launch_add(stream(y.device().index), is_f64("add", y), a.raw(), b.raw(), y.raw(), y.numel());
}

void scale(Tensor& x, double s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  with_float_type(is_f64("scale", x), [&](auto t) {
    using T = decltype(t);
    scale_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(x.device().index)>>>(static_cast<T*>(x.raw()),
                                                                                      static_cast<T>(s), n);
  });
  GT_CHECK_LAUNCH();
}

void copy_blocks(const Tensor& src, Tensor& dst, int64_t outer, int64_t src_inner, int64_t dst_inner,
                 int64_t dst_offset) {
  launch_strided_copy(stream(dst.device().index), dtype_size(src.dtype()), src.raw(), dst.raw(), outer, src_inner,
                      src_inner, 0, dst_inner, dst_offset);
}

void split_blocks(const Tensor& whole, Tensor& part, int64_t outer, int64_t part_inner, int64_t whole_inner,
                  int64_t offset) {
  launch_strided_copy(stream(part.device().index), dtype_size(whole.dtype()), whole.raw(), part.raw(), outer,
                      part_inner, whole_inner, offset, part_inner, 0);
}

}  // namespace gt::cuda
