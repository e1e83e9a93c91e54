// What the AVX-512 GEMMs (ops/cpu/bf16_gemm.cpp, ops/cpu/sgemm.cpp) share: a 16 × 16 transpose of 32-bit elements in
// registers for their packers, and the store of a micro-kernel's tile of C. Only for functions compiled for AVX-512
// (their target includes avx512f), called where CPUID says so.
#pragma once

#if defined(__x86_64__)
// GCC 12 reports _mm512_undefined_epi32's deliberate self-initialisation, inside the unpack intrinsics, as maybe
// uninitialized once they are inlined (GCC bug 105593); the pragma must cover the header, where it is reported.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

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

/// Stores a micro-kernel's Mr × 32 tile of C (acc[r][0..1], 16 columns each), of which rows·cols are C's (ldc
/// apart): the first block of k writes beta·C + acc (C unread when beta is 0), later blocks add theirs; the last one
/// then adds bias[0 .. cols) to each row when bias is not null: fl(Σ + bias), as after the product.
template <int Mr>
__attribute__((target("avx512f"), always_inline)) inline void store_tile(const __m512 (&acc)[Mr][2], float* c, int ldc,
                                                                         int rows, int cols, bool first, bool last,
                                                                         float beta, const float* bias) {
  const __mmask16 m0 = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32 ? __mmask16(0xFFFF) : cols > 16 ? __mmask16((1u << (cols - 16)) - 1) : __mmask16(0);
  const bool overwrite = first && beta == 0.0f, scale = first && beta != 1.0f;
  const __m512 vbeta = _mm512_set1_ps(beta);
  const bool add_bias = last && bias != nullptr;
  const __m512 bias0 = add_bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
  const __m512 bias1 = add_bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < Mr; ++r) {
    if (r >= rows) break;
    float* cr = c + int64_t{r} * ldc;
    __m512 v0 = acc[r][0], v1 = acc[r][1];
    if (!overwrite) {
      __m512 c0 = _mm512_maskz_loadu_ps(m0, cr), c1 = _mm512_maskz_loadu_ps(m1, cr + 16);
      if (scale) {
        c0 = _mm512_mul_ps(c0, vbeta);
        c1 = _mm512_mul_ps(c1, vbeta);
      }
      v0 = _mm512_add_ps(c0, v0);
      v1 = _mm512_add_ps(c1, v1);
    }
    if (add_bias) {
      v0 = _mm512_add_ps(v0, bias0);
      v1 = _mm512_add_ps(v1, bias1);
    }
    _mm512_mask_storeu_ps(cr, m0, v0);
    _mm512_mask_storeu_ps(cr + 16, m1, v1);
  }
}

}  // namespace gt::cpu

#endif  // __x86_64__
