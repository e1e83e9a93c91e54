// A 16 × 16 transpose of 32-bit elements in AVX-512 registers, shared by the GEMMs' packers (ops/bf16_gemm.cpp,
// ops/sgemm.cpp). Only for functions compiled for AVX-512 (their target includes avx512f), called where CPUID says so.
#pragma once

#if defined(__x86_64__)
// GCC 12 reports _mm512_undefined_epi32's deliberate self-initialisation, inside the unpack intrinsics, as maybe
// uninitialized once they are inlined (GCC bug 105593); the pragma must cover the header, where it is reported.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

namespace gt::cpu {

/// r[i] lane j ↔ r[j] lane i: unpacks of 32 and 64 bits within 128-bit lanes, then two shuffles of those lanes.
__attribute__((target("avx512f"), always_inline)) inline void transpose16(__m512i* r) {
  __m512i t[16], u[16], v[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      v[8 * h + i] = _mm512_shuffle_i32x4(u[8 * h + i], u[8 * h + 4 + i], 0x88);
      v[8 * h + 4 + i] = _mm512_shuffle_i32x4(u[8 * h + i], u[8 * h + 4 + i], 0xdd);
    }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(v[i], v[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_i32x4(v[i], v[8 + i], 0xdd);
  }
}

}  // namespace gt::cpu

#endif  // __x86_64__
