// The contract of the element-wise ops (ops/elementwise.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/elementwise.h"

#include "ops/dispatch.h"
#include "ops/wide.h"

#include <algorithm>
#include <cmath>

namespace gt::ops {
namespace {

// Whether the CUDA kernels take the operands as they are: 16-bit tensors of one dtype on a CUDA device (the sums in
// f32, rounded once; the copies move 2-byte elements). The CPU and mixed dtypes go through Wide.
bool cuda_takes_half(std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  return first.device().is_cuda() &&
         std::all_of(ts.begin(), ts.end(), [&](const Tensor* t) { return t->dtype() == first.dtype(); });
}

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  if (any_half({&a, &b, &y}) && !cuda_takes_half({&a, &b, &y})) {  // ops/wide.h: computed in f32
    Wide wide;
    Tensor yw = wide.out(y);
    add(wide.in(a), wide.in(b), yw);
    wide.finish();
    return;
  }
  const Operands op("add", {&a, &b, &y});
  GT_CHECK(a.numel() == y.numel() && b.numel() == y.numel(), "add {} + {} → {}", a.shape().str(), b.shape().str(),
           y.shape().str());
  GT_DISPATCH(op, add(a, b, y));
}

void scale(Tensor& x, double s) {
  if (any_half({&x}) && !cuda_takes_half({&x})) {  // ops/wide.h: computed in f32
    Wide wide;
    Tensor xw = wide.out(x, true);
    scale(xw, s);
    wide.finish();
    return;
  }
  const Operands op("scale", {&x});
  GT_CHECK(std::isfinite(s), "scale by {}", s);
  GT_DISPATCH(op, scale(x, s));
}

void copy_blocks(const Tensor& src, Tensor& dst, int64_t outer, int64_t src_inner, int64_t dst_inner,
                 int64_t dst_offset) {
  if (any_half({&src, &dst}) && !cuda_takes_half({&src, &dst})) {  // ops/wide.h: computed in f32
    Wide wide;
    Tensor dw = wide.out(dst, true);
    copy_blocks(wide.in(src), dw, outer, src_inner, dst_inner, dst_offset);
    wide.finish();
    return;
  }
  const Operands op("copy_blocks", {&src, &dst});
  GT_CHECK(src.numel() == outer * src_inner && dst.numel() == outer * dst_inner && dst_offset + src_inner <= dst_inner,
           "copy_blocks sizes");
  GT_DISPATCH(op, copy_blocks(src, dst, outer, src_inner, dst_inner, dst_offset));
}

void split_blocks(const Tensor& whole, Tensor& part, int64_t outer, int64_t part_inner, int64_t whole_inner,
                  int64_t offset) {
  if (any_half({&whole, &part}) && !cuda_takes_half({&whole, &part})) {  // ops/wide.h: computed in f32
    Wide wide;
    Tensor pw = wide.out(part);
    split_blocks(wide.in(whole), pw, outer, part_inner, whole_inner, offset);
    wide.finish();
    return;
  }
  const Operands op("split_blocks", {&whole, &part});
  GT_CHECK(part.numel() == outer * part_inner && whole.numel() == outer * whole_inner &&
               offset + part_inner <= whole_inner,
           "split_blocks sizes");
  GT_DISPATCH(op, split_blocks(whole, part, outer, part_inner, whole_inner, offset));
}

}  // namespace gt::ops
