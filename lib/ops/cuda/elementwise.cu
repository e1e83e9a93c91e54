// CUDA element-wise sums and the strided block copies behind concatenation (ops/elementwise.h). Each takes 16-bit
// activations of one dtype as they are: the sums in f32, rounded once; the copies move the 2-byte elements.
#include "ops/elementwise.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kThreads = 256;

// y may alias a or b, so no __restrict__ here. S is the storage type (f32, f64 or 16 bits: kernel_util.cuh's
// load/store); the sum is in float or double and rounded once into a 16-bit y.
template <class S>
__global__ void add_kernel(const S* a, const S* b, S* y, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = store<S>(load(a[i]) + load(b[i]));
}

// s is the factor as the CPU multiplies by it: in T, the compute type (float for 16-bit x).
template <class S, class T = compute_t<S>>
__global__ void scale_kernel(S* x, T s, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) x[i] = store<S>(load(x[i]) * s);
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

void launch_add(cudaStream_t s, DType type, const void* a, const void* b, void* y, int64_t n) {
  if (n == 0) return;
  with_storage("add", type, [&](auto t) {
    using S = decltype(t);
    add_kernel<S><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const S*>(a), static_cast<const S*>(b),
                                                             static_cast<S*>(y), n);
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
  launch_add(stream(y.device().index), y.dtype(), a.raw(), b.raw(), y.raw(), y.numel());
}

void scale(Tensor& x, double s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  with_storage("scale", x.dtype(), [&](auto t) {
    using S = decltype(t);
    scale_kernel<S><<<grid_for(n, kThreads), kThreads, 0, stream(x.device().index)>>>(static_cast<S*>(x.raw()),
                                                                                      static_cast<compute_t<S>>(s), n);
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
