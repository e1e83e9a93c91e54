// Element types a Tensor can hold, and the mapping from C++ types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gt {

/// bf16 and f16 hold activations between layers on a GPU under train.precision bf16/fp16 (Model::set_activation_dtype):
/// 16-bit storage whose math is f32 (core/half.h converts).
enum class DType : uint8_t { f32, f64, i32, bf16, f16 };

/// The element types of DType::bf16 and DType::f16: the 16 bits as they are stored (core/half.h converts them).
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<bf16_t> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16_t> {
  static constexpr DType value = DType::f16;
};

/// The 16-bit floating dtypes.
constexpr bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

}  // namespace gt
