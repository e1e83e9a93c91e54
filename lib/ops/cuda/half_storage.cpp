// CUDA 16-bit activation copies (ops/half_storage.h): one conversion kernel each way on the device's stream
// (ops/cuda/half_scratch.cu), round to nearest even as the CPU.
#include "ops/half_storage.h"

#include "ops/cuda/half_scratch.h"

namespace gt::cuda {

void pack_activation(HalfFormat format, const Tensor& y, void* out) {
  f32_to_half(y.device().index, format, static_cast<const float*>(y.raw()), out, y.numel());
}

void unpack_activation(HalfFormat format, const void* in, Tensor& y) {
  half_to_f32(y.device().index, format, in, static_cast<float*>(y.raw()), y.numel(), 0.0f);
}

}  // namespace gt::cuda
