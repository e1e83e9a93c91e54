// 16-bit scratch copies of f32 tensors for the CUDA ops' half products (train.precision bf16/fp16): the operands of
// cuBLASLt's and cuDNN's half calls (matmul.cu, conv2d.cpp) and the way back from a half result to f32. Blocks come
// from the caching allocator and go back when the object dies, right after the call that reads them is queued: every
// user of the allocator runs on the device's one stream (allocator.h), so a later kernel handed the block runs after.
#pragma once

#include "core/half.h"
#include "core/noncopyable.h"
#include "core/tensor.h"
#include "ops/precision.h"

#include <cstdint>

namespace gt::cuda {

/// `n` 16-bit elements of device scratch, uninitialised.
class HalfBuffer : NonCopyable {
 public:
  HalfBuffer(int device, int64_t n);
  ~HalfBuffer();
  void* get() const { return m_ptr; }

 private:
  int m_device;
  void* m_ptr = nullptr;
};

/// An f32 CUDA tensor's elements rounded to `format` (nearest even) in 16-bit scratch.
class HalfOperand : public HalfBuffer {
 public:
  HalfOperand(const Tensor& t, HalfFormat format);
};

/// The f32 CUDA weight `w` as a 16-bit copy in `format`, made by the first product that reads `w` inside the calling
/// thread's innermost ProductPrecisionScope (there must be one) and handed to every later product of that scope: a
/// dense layer's w is read by its forward and by dx = dy·W, a convolution's by its forward and its backward data
/// product, once per micro-batch each, and converted once per step (the CPU's half_weight, ops/precision.h; the
/// bookkeeping is the same ScopeCopies). The copies' blocks stay with the thread between scopes and are remade in
/// place; a weight no product read in the last scope gives its block back. Only ops whose contract names an operand
/// a weight call this (linear_forward's w, conv2d's w), and the weight must stay alive and unchanged while the scope
/// lives (the optimizer updates it after the step's scope ends).
const void* half_weight(const Tensor& w, HalfFormat format);

/// The copy half_weight made in this scope for the same tensor (same data, element count and format), or null: how
/// cuda::matmul, whose contract does not say which operand is a weight, finds the one of dx = dy·W.
const void* find_half_weight(const Tensor& t, HalfFormat format);

/// What the calling thread's 16-bit weight copies hold now (2 bytes per element) and, over its life, how many
/// copies half_weight made and how many times a product was handed one made before it in the same scope.
HalfWeightCacheStats half_weight_cache_stats();

/// How many HalfOperand copies (operands rounded into scratch for one call) the calling thread has made: tests count
/// what a step converts.
int64_t half_operand_copies();

/// out[i] = in[i] rounded to `format` (nearest even) into 16-bit device storage, on the device's stream.
void f32_to_half(int device, HalfFormat format, const float* in, void* out, int64_t n);

/// out[i] = in[i] (16-bit `format`, widened exactly to f32) + beta · out[i], on the device's stream; with beta = 0
/// out is not read.
void half_to_f32(int device, HalfFormat format, const void* in, float* out, int64_t n, float beta);

}  // namespace gt::cuda
