// Element-wise sums and scaling, and the block copies behind concatenation: add, scale, copy_blocks, split_blocks. ops/elementwise.cpp
// checks the contract; ops/cpu/elementwise.cpp and ops/cuda/elementwise.cu implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"

namespace gt::ops {

/// y = a + b, element-wise (y may be a or b).
void add(const Tensor& a, const Tensor& b, Tensor& y);
/// x ← s · x, element-wise, s rounded to x's type first (LoRA's α/r).
void scale(Tensor& x, double s);
/// Block copy for concatenation: for each of `outer` blocks, copies src's `src_inner` contiguous elements into dst
/// at offset `dst_offset` of dst's block of `dst_inner` elements.
void copy_blocks(const Tensor& src, Tensor& dst, int64_t outer, int64_t src_inner, int64_t dst_inner,
                 int64_t dst_offset);
/// The inverse of copy_blocks: part's blocks are taken out of whole's.
void split_blocks(const Tensor& whole, Tensor& part, int64_t outer, int64_t part_inner, int64_t whole_inner,
                  int64_t offset);

}  // namespace gt::ops

namespace gt::cpu {

/// y[i] = a[i] + b[i] for i < n on the calling thread, with add's arithmetic (the same bits): fused epilogues run it
/// on blocks of a product while they are in cache. y may be a or b.
void add_span(const float* a, const float* b, float* y, int64_t n);
void add_span(const double* a, const double* b, double* y, int64_t n);

}  // namespace gt::cpu

// The backends' entry points: the ops above call them once the contract holds.
GT_BACKEND_ENTRY_POINTS(add, scale, copy_blocks, split_blocks)
