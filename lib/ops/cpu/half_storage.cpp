// CPU 16-bit activation copies (ops/half_storage.h): the bulk conversions of ops/precision.h over OpenMP's threads.
#include "ops/half_storage.h"

#include "ops/precision.h"

#include <cstdint>

namespace gt::cpu {

void pack_activation(HalfFormat format, const Tensor& y, void* out) {
  pack_half(format, y.data<float>(), static_cast<uint16_t*>(out), y.numel());
}

void unpack_activation(HalfFormat format, const void* in, Tensor& y) {
  unpack_half(format, static_cast<const uint16_t*>(in), y.data<float>(), y.numel());
}

}  // namespace gt::cpu
