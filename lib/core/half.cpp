// Bulk bf16/fp16 conversions (core/half.h): eight floats at a time with F16C (fp16) or AVX2 integer rounding (bf16),
// compiled for those instruction sets by function attribute so the build flags stay as they are, and chosen at run
// time; the scalar functions do the rest and every element on a CPU without them.
#include "core/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define GT_HALF_X86 1
#else
#define GT_HALF_X86 0
#endif

namespace gt {
namespace {

#if GT_HALF_X86
// F16C by its CPUID bit (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports has no name for it. Its 256-bit
// forms need AVX, whose check also says the OS saves the YMM registers.
bool cpu_f16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
  }();
  return has;
}
bool cpu_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// bf16 rounding of eight floats, the scalar float_to_bf16 lane for lane, leaving the result in the upper 16 bits
// of each lane (the lower ones zero): a NaN gets the quiet bit, anything else the carry of round to nearest even.
__attribute__((target("avx2"))) inline __m256i bf16_round8(__m256i x) {
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), odd);
  const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  return _mm256_and_si256(_mm256_blendv_epi8(rounded, quiet, nan), _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
}

__attribute__((target("avx2"))) size_t floats_to_bf16_avx2(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i r = _mm256_srli_epi32(bf16_round8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
  }
  return i;
}

__attribute__((target("avx2"))) size_t bf16_to_floats_avx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(w, 16));
  }
  return i;
}

__attribute__((target("avx2"))) size_t round_bf16_avx2(const float* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        bf16_round8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  return i;
}

__attribute__((target("avx,f16c"))) size_t floats_to_fp16_f16c(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return i;
}

__attribute__((target("avx,f16c"))) size_t fp16_to_floats_f16c(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  return i;
}

__attribute__((target("avx,f16c"))) size_t round_fp16_f16c(const float* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(in + i),
                                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  return i;
}
#endif

}  // namespace

bool half_bulk_f16c() {
#if GT_HALF_X86
  return cpu_f16c();
#else
  return false;
#endif
}

bool half_bulk_avx2() {
#if GT_HALF_X86
  return cpu_avx2();
#else
  return false;
#endif
}

void floats_to_bf16(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
#if GT_HALF_X86
  if (cpu_avx2()) i = floats_to_bf16_avx2(in, out, n);
#endif
  for (; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

void bf16_to_floats(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
#if GT_HALF_X86
  if (cpu_avx2()) i = bf16_to_floats_avx2(in, out, n);
#endif
  for (; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

void floats_to_fp16(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
#if GT_HALF_X86
  if (cpu_f16c()) i = floats_to_fp16_f16c(in, out, n);
#endif
  for (; i < n; ++i) out[i] = float_to_fp16(in[i]);
}

void fp16_to_floats(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
#if GT_HALF_X86
  if (cpu_f16c()) i = fp16_to_floats_f16c(in, out, n);
#endif
  for (; i < n; ++i) out[i] = fp16_to_float(in[i]);
}

void round_to_half(HalfFormat format, const float* in, float* out, size_t n) {
  size_t i = 0;
  if (format == HalfFormat::bf16) {
#if GT_HALF_X86
    if (cpu_avx2()) i = round_bf16_avx2(in, out, n);
#endif
    for (; i < n; ++i) out[i] = bf16_to_float(float_to_bf16(in[i]));
  } else {
#if GT_HALF_X86
    if (cpu_f16c()) i = round_fp16_f16c(in, out, n);
#endif
    for (; i < n; ++i) out[i] = fp16_to_float(float_to_fp16(in[i]));
  }
}

}  // namespace gt
