// The 16-bit float formats of mixed precision, bf16 (1-8-7) and fp16 (IEEE binary16, 1-5-10): conversions to and from
// f32, scalar and in bulk, and rounding f32 values to either format (what a half GEMM's operands become).
#pragma once

#include "core/dtype.h"

#include <bit>
#include <cstddef>
#include <cstdint>

namespace gt {

/// The 16-bit formats, for code that picks one at run time.
enum class HalfFormat { bf16, fp16 };

/// The tensor dtype of a 16-bit format (Model::set_activation_dtype), and the format of a 16-bit dtype (bf16 or f16).
constexpr DType half_dtype(HalfFormat f) { return f == HalfFormat::bf16 ? DType::bf16 : DType::f16; }
constexpr HalfFormat half_format_of(DType t) { return t == DType::bf16 ? HalfFormat::bf16 : HalfFormat::fp16; }

/// f32 → bf16, rounding to nearest even. bf16 keeps f32's exponent range: only values within half a bf16 ulp of
/// 2^128 overflow (to ±Inf); subnormals round like any other value. A NaN stays a NaN with the quiet bit set and the
/// top 7 bits of its payload (what AVX-512 BF16's vcvtneps2bf16 returns).
inline uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  // Adding 0x7FFF plus the kept part's lowest bit carries into it exactly when the dropped half is above one half
  // ulp, or exactly one half and the kept part is odd; a carry out of the largest finite value gives Inf.
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

/// bf16 → f32: exact (the bits are f32's upper half).
inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

/// f32 → fp16, rounding to nearest even: values of magnitude ≥ 65520 (65504, the largest finite, plus half an ulp)
/// become ±Inf, values below 2^-14 become fp16 subnormals (multiples of 2^-24; at most 2^-25 rounds to ±0), signs of
/// zero kept. A NaN stays a NaN with the quiet bit set and the top 10 bits of its payload (what F16C's vcvtps2ph
/// returns).
inline uint16_t float_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  const uint32_t e = a >> 23;                                  // biased f32 exponent
  if (e >= 143) return static_cast<uint16_t>(sign | 0x7C00u);  // ≥ 2^16 (and Inf): beyond fp16's range
  if (e >= 113) {                                              // fp16 normal range before rounding, [2^-14, 2^16)
    const uint32_t m = a & 0x7FFFFFu, rest = m & 0x1FFFu;
    uint32_t h = ((e - 112) << 10) | (m >> 13);
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may step the exponent, up to Inf: exact
    return static_cast<uint16_t>(sign | h);
  }
  // Below 2^-14: a multiple of 2^-24, the f32 significand shifted right with round to nearest even (rounding up
  // from the largest subnormal gives 0x0400, the smallest normal, as it should).
  if (e < 101) return sign;  // < 2^-26: well under half of 2^-24 (e = 0, f32's subnormals, included)
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..25
  uint32_t q = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

/// fp16 → f32: exact, subnormals included; a NaN keeps its payload and gets the quiet bit (as F16C's vcvtph2ps).
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u));
  if (e != 0) return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
  if (m == 0) return std::bit_cast<float>(sign);
  // A subnormal, m · 2^-24: normalise the significand into f32's.
  const int lead = std::countl_zero(m) - 22;  // zeros above m's top bit within 10 bits; m < 2^10
  const uint32_t mm = (m << (lead + 1)) & 0x3FFu;
  return std::bit_cast<float>(sign | (static_cast<uint32_t>(113 - lead - 1) << 23) | (mm << 13));
}

/// Bulk conversions, element for element the scalar functions above: F16C for fp16 and AVX2 for bf16 where the CPU
/// has them (checked once at run time), the scalar functions elsewhere and on the tail.
void floats_to_bf16(const float* in, uint16_t* out, size_t n);
void bf16_to_floats(const uint16_t* in, float* out, size_t n);
void floats_to_fp16(const float* in, uint16_t* out, size_t n);
void fp16_to_floats(const uint16_t* in, float* out, size_t n);

/// out[i] = in[i] rounded to `format` (nearest even) and back to f32: the operand a half GEMM multiplies. `in` and
/// `out` may be the same array.
void round_to_half(HalfFormat format, const float* in, float* out, size_t n);

/// Whether the bulk fp16 conversions use F16C, and the bf16 ones AVX2, on this CPU.
bool half_bulk_f16c();
bool half_bulk_avx2();

}  // namespace gt
