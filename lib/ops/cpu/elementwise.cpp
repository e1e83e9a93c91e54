// CPU element-wise sums and the strided block copies behind concatenation (ops/elementwise.h).
#include "ops/elementwise.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/vec_math.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace gt::cpu {
namespace {

// y[i] = a[i] + b[i] for i in [i0, i1); y may be a or b (element i reads only element i). Compiled per instruction
// set: as a plain template loop it ran on SSE (a residual stream's sums, ~2 % of a GPT step's samples).
template <class T>
GT_INLINE void add_span_t(const T* a, const T* b, T* y, int64_t i0, int64_t i1) {
  GT_SIMD
  for (int64_t i = i0; i < i1; ++i) y[i] = a[i] + b[i];
}
GT_CPU_KERNEL(add_span_f32, (const float* a, const float* b, float* y, int64_t i0, int64_t i1), (a, b, y, i0, i1),
              add_span_t)

template <class T>
void add_t(const Tensor& a, const Tensor& b, Tensor& y) {
  const T *pa = a.data<T>(), *pb = b.data<T>();
  T* py = y.data<T>();
  parallel_for(y.numel(), kGrain, [&](int64_t i0, int64_t i1) {
    if constexpr (std::is_same_v<T, float>)
      add_span_f32(pa, pb, py, i0, i1);
    else
      add_span_t(pa, pb, py, i0, i1);
  });
}

}  // namespace

void add_span(const float* a, const float* b, float* y, int64_t n) { add_span_f32(a, b, y, 0, n); }
void add_span(const double* a, const double* b, double* y, int64_t n) { add_span_t(a, b, y, 0, n); }

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  for_float_type(y.dtype(), [&](auto t) { add_t<decltype(t)>(a, b, y); });
}

void scale(Tensor& x, double s) {
  for_float_type(x.dtype(), [&](auto t) {
    using T = decltype(t);
    T* p = x.data<T>();
    const T f = static_cast<T>(s);
    parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      GT_SIMD
      for (int64_t i = i0; i < i1; ++i) p[i] *= f;
    });
  });
}

namespace {

// For o in [0, outer): copy `run` elements from src[o·src_stride + src_off] to dst[o·dst_stride + dst_off].
// Concatenation and its inverse are both this strided block copy.
void strided_copy(const Tensor& src, Tensor& dst, int64_t outer, int64_t run, int64_t src_stride, int64_t src_off,
                  int64_t dst_stride, int64_t dst_off) {
  const size_t es = dtype_size(src.dtype());
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
  parallel_for(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(run, 1)), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      std::memcpy(d + static_cast<size_t>(o * dst_stride + dst_off) * es,
                  s + static_cast<size_t>(o * src_stride + src_off) * es, static_cast<size_t>(run) * es);
  });
}

}  // namespace

void copy_blocks(const Tensor& src, Tensor& dst, int64_t outer, int64_t src_inner, int64_t dst_inner,
                 int64_t dst_offset) {
  strided_copy(src, dst, outer, src_inner, src_inner, 0, dst_inner, dst_offset);
}

void split_blocks(const Tensor& whole, Tensor& part, int64_t outer, int64_t part_inner, int64_t whole_inner,
                  int64_t offset) {
  strided_copy(whole, part, outer, part_inner, whole_inner, offset, part_inner, 0);
}

}  // namespace gt::cpu
