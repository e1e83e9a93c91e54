// 16-bit scratch copies of f32 tensors for the CUDA ops' half products (train.precision bf16/fp16): the operands of
// cuBLASLt's and cuDNN's half calls (matmul.cu, conv2d.cpp) and the way back from a half result to f32. Blocks come
// from the caching allocator and go back when the object dies, right after the call that reads them is queued: every
// user of the allocator runs on the device's one stream (allocator.h), so a later kernel handed the block runs after.
#pragma once

#include "core/half.h"
#include "core/noncopyable.h"
#include "core/tensor.h"

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

/// out[i] = in[i] rounded to `format` (nearest even) into 16-bit device storage, on the device's stream.
void f32_to_half(int device, HalfFormat format, const float* in, void* out, int64_t n);

/// out[i] = in[i] (16-bit `format`, widened exactly to f32) + beta · out[i], on the device's stream; with beta = 0
/// out is not read.
void half_to_f32(int device, HalfFormat format, const void* in, float* out, int64_t n, float beta);

}  // namespace gt::cuda
