// Our own f32 GEMM for AVX-512 and AVX2+FMA, and the run-time choice between them and OpenBLAS (ops/cpu/sgemm.h).
//
// The blocking is the GotoBLAS one the bf16 kernel (ops/cpu/bf16_gemm.cpp) uses: a block of B (kKc × kNc) is packed
// into panels of Nr columns, a block of A (Mc × kKc) into panels of Mr rows, and a micro-kernel keeps an Mr × Nr tile
// of C in registers while it walks k through one A panel (in L2) and one B panel (AVX-512: 32 KiB at kKc 256, in L1).
// Only the functions marked GT_SGEMM_AVX512 / GT_SGEMM_AVX2 use those instructions; they are called only where
// CPUID says the CPU has them, and the rest of the binary stays baseline x86-64.
#include "ops/cpu/sgemm.h"

#include "core/env.h"
#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#if defined(__x86_64__)
#include "ops/cpu/avx512_tile.h"  // (and immintrin.h)
#define GT_SGEMM_AVX512 __attribute__((target("avx512f")))
#define GT_SGEMM_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace gt::cpu {
namespace {

constexpr int kKc = 256;
constexpr int kNc = 512;        // a multiple of both kernels' Nr
constexpr int kLanesRows = 16;  // rows of a lanes-contiguous source packed together (pack_lanes)

std::atomic<int> g_sgemm_forced{-1};       // a CpuSgemmPath forced by a test or benchmark; -1: the environment's choice
std::atomic<bool> g_always_pack_a{false};  // set_sgemm_always_pack_a

// The widest vectors of the core OpenBLAS runs, by the name it reports: 512 (its AVX-512 cores), 256 (its AVX2+FMA
// cores), 0 (anything older).
int openblas_core_width() {
  const std::string_view core = openblas_get_corename();
  for (const std::string_view name : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == name) return 512;
  for (const std::string_view name : {"Haswell", "Zen"})
    if (core == name) return 256;
  return 0;
}

// auto: our AVX-512 kernel wherever the CPU has AVX-512; at AVX2, ours where OpenBLAS runs a narrower core (it fell
// back, as 0.3.21 does to its Prescott core on this project's Intel Xeon, or OPENBLAS_CORETYPE forced it), OpenBLAS
// where it runs an AVX2 core. Measured on whole training steps (docs/measurements.md): on Zen 4, where
// OpenBLAS runs its Cooperlake (AVX-512) core, ours trains the GPT 1.05× and the MLP 1.07× faster (10 interleaved
// pairs each, 9 won), the CNN level; on the Xeon ours is 3–4× OpenBLAS's Prescott core. At AVX2 our kernel trained
// the GPT at 0.85× of OpenBLAS's Haswell core (Zen 4 held to AVX2, 8 pairs), so there OpenBLAS keeps the products.
CpuSgemmPath best_sgemm_path() {
  if (cpu_sgemm_supported(CpuSgemmPath::avx512)) return CpuSgemmPath::avx512;
  if (cpu_sgemm_supported(CpuSgemmPath::avx2))
    return openblas_core_width() >= 256 ? CpuSgemmPath::openblas : CpuSgemmPath::avx2;
  return CpuSgemmPath::openblas;
}

CpuSgemmPath sgemm_env_path() {
  static const CpuSgemmPath path = [] {
    constexpr std::array<std::string_view, 3> kNames{"avx512", "avx2", "openblas"};
    const std::optional<size_t> choice = env_choice("GPUTRAIN_CPU_SGEMM", {kNames[0], kNames[1], kNames[2]});
    if (!choice) return best_sgemm_path();
    const CpuSgemmPath p = std::array{CpuSgemmPath::avx512, CpuSgemmPath::avx2, CpuSgemmPath::openblas}[*choice];
    if (!cpu_sgemm_supported(p))
      throw Error("GPUTRAIN_CPU_SGEMM=" + std::string(kNames[*choice]) + ": this CPU lacks the instructions it needs");
    return p;
  }();
  return path;
}

#if defined(__x86_64__)

// The packers write, for kk < kc and lanes l < count, x(kk, l) to out[kk·w + l] of its panel: a panel's w lanes
// (rows of op(a) or columns of op(b)) of one k together. Lanes from count to the panel's end are not written.

// Each element rounded to bf16 (nearest even) and widened back, as bf16_to_float(float_to_bf16(x)) does: a NaN keeps
// its sign and top payload bits with the quiet bit set; subnormals round like any other value.
GT_SGEMM_AVX512 inline __m512 round_bf16(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
  r = _mm512_mask_or_epi32(r, nan, x, _mm512_set1_epi32(0x00400000));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// A source element as the kernels multiply it: as it is, or rounded to bf16 (Round).
template <bool Round>
float packed_value(float x) {
  if constexpr (Round) return bf16_to_float(float_to_bf16(x));
  return x;
}

struct Avx512 {
  static constexpr int mr = 8, nr = 32, mc = 128;

  template <bool Round>
  GT_SGEMM_AVX512 static __m512 load(__mmask16 mask, const float* p) {
    const __m512 v = _mm512_maskz_loadu_ps(mask, p);
    if constexpr (Round) return round_bf16(v);
    return v;
  }

  // x(kk, l) = src[kk·ld + l]: lanes contiguous. All of a block's panels (panel q at out + q·kc·w), kLanesRows
  // rows of src at a time: those rows (a few KiB) stay in L1 while each panel gets its kLanesRows·w contiguous
  // floats. Row by row, each row's stores went to every panel, kc·w floats apart: as many write streams as panels,
  // on the same L1 sets. In a GPT step's perf samples this packer fell from 17 % to 10 % of the micro-kernel's.
  template <bool Round>
  GT_SGEMM_AVX512 static void pack_lanes(const float* src, int ld, int kc, int count, int w, float* out) {
    for (int k0 = 0; k0 < kc; k0 += kLanesRows) {
      const int k1 = std::min(kc, k0 + kLanesRows);
      for (int q0 = 0; q0 < count; q0 += w) {
        float* dst = out + int64_t{q0 / w} * kc * w;
        const int n = std::min(w, count - q0);
        for (int l0 = 0; l0 < n; l0 += 16) {
          const __mmask16 mask = n - l0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - l0)) - 1);
          for (int kk = k0; kk < k1; ++kk)
            _mm512_mask_storeu_ps(dst + int64_t{kk} * w + l0, mask,
                                  load<Round>(mask, src + int64_t{kk} * ld + q0 + l0));
        }
      }
    }
  }

  // x(kk, l) = src[l·ld + kk]: each lane's k contiguous, so 16 lanes' 16 k come out of 16 loads and a transpose.
  template <bool Round>
  GT_SGEMM_AVX512 static void pack_rows(const float* src, int ld, int kc, int count, int w, float* out) {
    const int group = std::min(16, w);
    for (int l0 = 0; l0 < count; l0 += group) {
      const int g = std::min(group, count - l0);
      const __mmask16 lanes = g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << g) - 1);
      for (int k0 = 0; k0 < kc; k0 += 16) {
        const int left = std::min(16, kc - k0);
        const __mmask16 ks = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
        __m512i r[16];
#pragma GCC unroll 16
        for (int l = 0; l < 16; ++l)
          r[l] = l < g ? _mm512_castps_si512(load<Round>(ks, src + int64_t{l0 + l} * ld + k0)) : _mm512_setzero_si512();
        transpose16(r);  // r[q]: k0 + q of lanes l0 .. l0 + 15
        for (int q = 0; q < left; ++q)
          _mm512_mask_storeu_ps(out + int64_t{k0 + q} * w + l0, lanes, _mm512_castsi512_ps(r[q]));
      }
    }
  }

  // C's rows·cols (at most mr × nr, ldc apart) from an A panel and a B panel of kc k each: the first block of k
  // writes beta·C + A·B (C unread when beta is 0), later blocks add theirs; the last one then adds bias[0 .. cols)
  // to each row when bias is not null: fl(Σ + bias), as after the product.
  // A is a panel whose k are lda apart (InPlace false: element (r, p) at ap[p·lda + r] — packed, lda = mr, or a
  // transposed a's columns where they lie) or op(a)'s rows where they lie (at ap[r·lda + p]; rows past `rows` read
  // the last one's, and are not stored). The FMAs run in the same order either way, so C's bits do not depend on
  // which.
  template <bool InPlace>
  GT_SGEMM_AVX512 static void kernel(int kc, const float* ap, int64_t lda, const float* bp, float* c, int ldc, int rows,
                                     int cols, bool first, bool last, float beta, const float* bias) {
    const float* ar[mr];
#pragma GCC unroll 8
    for (int r = 0; r < mr; ++r) ar[r] = InPlace ? ap + std::min(r, rows - 1) * lda : ap + r;
    __m512 acc[mr][2];
#pragma GCC unroll 8
    for (int r = 0; r < mr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int p = 0; p < kc; ++p) {
      const __m512 b0 = _mm512_loadu_ps(bp + p * nr), b1 = _mm512_loadu_ps(bp + p * nr + 16);
#pragma GCC unroll 8
      for (int r = 0; r < mr; ++r) {
        const __m512 a = _mm512_set1_ps(InPlace ? ar[r][p] : ar[r][p * lda]);
        acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
      }
    }
    store_tile<mr>(acc, c, ldc, rows, cols, first, last, beta, bias);
  }
};

struct Avx2 {
  static constexpr int mr = 6, nr = 16, mc = 120;

  template <bool Round>
  GT_SGEMM_AVX2 static void pack_lanes(const float* src, int ld, int kc, int count, int w, float* out) {
    for (int k0 = 0; k0 < kc; k0 += kLanesRows) {  // (as Avx512::pack_lanes)
      const int k1 = std::min(kc, k0 + kLanesRows);
      for (int q0 = 0; q0 < count; q0 += w) {
        const int n = std::min(w, count - q0);
        for (int kk = k0; kk < k1; ++kk) {
          float* dst = out + int64_t{q0 / w} * kc * w + int64_t{kk} * w;
          const float* row = src + int64_t{kk} * ld + q0;
          for (int l = 0; l < n; ++l) dst[l] = packed_value<Round>(row[l]);
        }
      }
    }
  }

  // Lane by lane (reading each lane's k in order); the writes, w apart, stay inside the panel in L1.
  template <bool Round>
  GT_SGEMM_AVX2 static void pack_rows(const float* src, int ld, int kc, int count, int w, float* out) {
    for (int l = 0; l < count; ++l) {
      const float* row = src + int64_t{l} * ld;
      for (int kk = 0; kk < kc; ++kk) out[int64_t{kk} * w + l] = packed_value<Round>(row[kk]);
    }
  }

  // As Avx512::kernel (A packed or where it lies), 6 × 16; columns past `cols` are masked out of the loads and
  // stores of C and the bias.
  template <bool InPlace>
  GT_SGEMM_AVX2 static void kernel(int kc, const float* ap, int64_t lda, const float* bp, float* c, int ldc, int rows,
                                   int cols, bool first, bool last, float beta, const float* bias) {
    const float* ar[mr];
#pragma GCC unroll 6
    for (int r = 0; r < mr; ++r) ar[r] = InPlace ? ap + std::min(r, rows - 1) * lda : ap + r;
    __m256 acc[mr][2];
#pragma GCC unroll 6
    for (int r = 0; r < mr; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int p = 0; p < kc; ++p) {
      const __m256 b0 = _mm256_loadu_ps(bp + p * nr), b1 = _mm256_loadu_ps(bp + p * nr + 8);
#pragma GCC unroll 6
      for (int r = 0; r < mr; ++r) {
        const __m256 a = _mm256_broadcast_ss(InPlace ? ar[r] + p : ar[r] + p * lda);
        acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
      }
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - 8), lane);
    const bool overwrite = first && beta == 0.0f, scale = first && beta != 1.0f;
    const __m256 vbeta = _mm256_set1_ps(beta);
    const bool add_bias = last && bias != nullptr;
    const __m256 bias0 = add_bias ? _mm256_maskload_ps(bias, m0) : _mm256_setzero_ps();
    const __m256 bias1 = add_bias ? _mm256_maskload_ps(bias + 8, m1) : _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < mr; ++r) {
      if (r >= rows) break;
      float* cr = c + int64_t{r} * ldc;
      __m256 v0 = acc[r][0], v1 = acc[r][1];
      if (!overwrite) {
        __m256 c0 = _mm256_maskload_ps(cr, m0), c1 = _mm256_maskload_ps(cr + 8, m1);
        if (scale) {
          c0 = _mm256_mul_ps(c0, vbeta);
          c1 = _mm256_mul_ps(c1, vbeta);
        }
        v0 = _mm256_add_ps(c0, v0);
        v1 = _mm256_add_ps(c1, v1);
      }
      if (add_bias) {
        v0 = _mm256_add_ps(v0, bias0);
        v1 = _mm256_add_ps(v1, bias1);
      }
      _mm256_maskstore_ps(cr, m0, v0);
      _mm256_maskstore_ps(cr + 8, m1, v1);
    }
  }
};

// Panels of w lanes from lane 0 on, `count` lanes in all, k from 0 to kc: panel q at out + q·kc·w, lanes past count
// zero (they multiply into rows or columns of C that are not stored).
template <class Isa, bool Round>
void pack_panels(const float* src, int ld, bool lanes_contiguous, int kc, int count, int w, float* out) {
  if (count % w != 0)
    std::memset(out + int64_t{count / w} * kc * w, 0, sizeof(float) * static_cast<size_t>(kc) * static_cast<size_t>(w));
  if (lanes_contiguous) {
    Isa::template pack_lanes<Round>(src, ld, kc, count, w, out);
    return;
  }
  for (int q0 = 0; q0 < count; q0 += w)
    Isa::template pack_rows<Round>(src + int64_t{q0} * ld, ld, kc, std::min(w, count - q0), w,
                                   out + int64_t{q0 / w} * kc * w);
}

// op(a)'s rows [i0, i0 + mc) over k in [k0, k0 + kc), as panels of mr rows; op(a)(i, kk) is a[i·lda + kk], or
// a[kk·lda + i] when transposed.
template <class Isa, bool Round>
void pack_a(bool ta, const float* a, int lda, int i0, int mc, int k0, int kc, float* out) {
  if (ta)
    pack_panels<Isa, Round>(a + int64_t{k0} * lda + i0, lda, true, kc, mc, Isa::mr, out);
  else
    pack_panels<Isa, Round>(a + int64_t{i0} * lda + k0, lda, false, kc, mc, Isa::mr, out);
}

// op(b)'s columns [j0, j0 + nc) over k in [k0, k0 + kc), as panels of nr columns; op(b)(kk, j) is b[kk·ldb + j], or
// b[j·ldb + kk] when transposed.
template <class Isa, bool Round>
void pack_b(bool tb, const float* b, int ldb, int k0, int kc, int j0, int nc, float* out) {
  if (tb)
    pack_panels<Isa, Round>(b + int64_t{j0} * ldb + k0, ldb, false, kc, nc, Isa::nr, out);
  else
    pack_panels<Isa, Round>(b + int64_t{k0} * ldb + j0, ldb, true, kc, nc, Isa::nr, out);
}

// The block of op(a) a product reads, rows [i0, i0 + mc) over k in [k0, k0 + kc), for nc columns of C: op(a)'s rows
// where they lie when a is not transposed, not rounded and nc is at most kInPlaceCols (lda > 0; the kernels read each
// row's k in order), otherwise packed into `pack` (lda 0). Measured one product against the other in alternating
// rounds (bench_step_gemm_rate --a-in-place, GPT step shapes, AVX-512): in place 4-12 % faster at 128 columns (the
// packing pass saved), level at 384, 4-8 % slower at 512, where each A panel is read once per panel of B (16 times)
// and the packed copy's one contiguous stream served the kernel better than eight rows.
// A transposed a (a weight gradient's dyᵀ) is read in place too where its block has whole panels of mr rows and C at
// most kInPlaceCols columns: a panel's mr rows of one k are then contiguous in a, as in a packed panel, only lda
// apart from one k to the next. Unless lda is a power of two of 512 floats or more: those strides map a panel's k
// onto a few cache sets. Measured (bench_step_gemm_rate --a-in-place, k 1024, 128 columns, AVX-512, one thread):
// in place 1.02-1.08x at lda 128, 256, 384, 640, 768, 2304 and 3072, but 0.84-0.92x at 512 and 1024; level at 256
// columns, 0.98x at 512.
constexpr int kInPlaceCols = 256;
inline bool aliasing_stride(int lda) { return lda >= 512 && (lda & (lda - 1)) == 0; }
struct ABlock {
  const float* p;
  int64_t lda;         ///< > 0: op(a)'s rows where they lie, lda apart (Isa::kernel<true>)
  int64_t k_step;      ///< otherwise: the distance between one k and the next within a panel (Isa::kernel<false>)
  int64_t panel_step;  ///< from one panel of mr rows to the next
};
template <class Isa, bool Round>
ABlock a_block(bool ta, const float* a, int lda, int i0, int mc, int k0, int kc, int nc, std::vector<float>& pack) {
  constexpr int mr = Isa::mr;
  const bool may = !Round && !g_always_pack_a.load(std::memory_order_relaxed);
  if (may && !ta && nc <= kInPlaceCols) return {a + int64_t{i0} * lda + k0, lda, 1, int64_t{mr} * lda};
  if (may && ta && mc % mr == 0 && nc <= kInPlaceCols && !aliasing_stride(lda))
    return {a + int64_t{k0} * lda + i0, 0, lda, mr};
  const size_t need = static_cast<size_t>((mc + mr - 1) / mr) * kc * mr;
  if (pack.size() < need) pack.resize(need);
  pack_a<Isa, Round>(ta, a, lda, i0, mc, k0, kc, pack.data());
  return {pack.data(), 0, mr, int64_t{kc} * mr};
}

// C's mc × nc block at c (bias: its columns' part, or null) from a block of A (mc rows, a_block) and nc columns of
// packed B (panel jp at bp + jp·kc·nr), over one block of k: the first of k writes beta·C + A·B, the last adds the
// bias.
template <class Isa>
void multiply_block(int kc, ABlock a, int mc, const float* bp, int nc, float* c, int ldc, bool first, bool last,
                    float beta, const float* bias) {
  constexpr int mr = Isa::mr, nr = Isa::nr;
  const int m_panels = (mc + mr - 1) / mr, n_panels = (nc + nr - 1) / nr;
  for (int jp = 0; jp < n_panels; ++jp)
    for (int ip = 0; ip < m_panels; ++ip) {
      const int rows = std::min(mr, mc - ip * mr), cols = std::min(nr, nc - jp * nr);
      const float *ap = a.p + ip * a.panel_step, *bpp = bp + int64_t{jp} * kc * nr;
      float* cp = c + int64_t{ip * mr} * ldc + jp * nr;
      const float* bias_p = bias ? bias + jp * nr : nullptr;
      if (a.lda > 0)
        Isa::template kernel<true>(kc, ap, a.lda, bpp, cp, ldc, rows, cols, first, last, beta, bias_p);
      else
        Isa::template kernel<false>(kc, ap, a.k_step, bpp, cp, ldc, rows, cols, first, last, beta, bias_p);
    }
}

// `done` (null: none) gets each finished block of C's rows and columns, offset by (r_off, c_off): sgemm_threads.
template <class Isa, bool Round>
void gemm_packed(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
                 float* c, int ldc, const float* bias, const BlockDone* done = nullptr, int r_off = 0, int c_off = 0) {
  constexpr int nr = Isa::nr;
  // The packed operands, per thread: they grow to the largest block once and stay (never shrunk: resizing down and
  // up again would zero the regrown part on every call).
  thread_local std::vector<float> a_pack, b_pack;
  for (int j0 = 0; j0 < n; j0 += kNc) {
    const int nc = std::min(kNc, n - j0);
    const int n_panels = (nc + nr - 1) / nr;
    for (int k0 = 0; k0 < k; k0 += kKc) {
      const int kc = std::min(kKc, k - k0);
      const size_t b_need = static_cast<size_t>(n_panels) * kc * nr;
      if (b_pack.size() < b_need) b_pack.resize(b_need);
      pack_b<Isa, Round>(tb, b, ldb, k0, kc, j0, nc, b_pack.data());
      for (int i0 = 0; i0 < m; i0 += Isa::mc) {
        const int mc = std::min(Isa::mc, m - i0);
        const ABlock ab = a_block<Isa, Round>(ta, a, lda, i0, mc, k0, kc, nc, a_pack);
        multiply_block<Isa>(kc, ab, mc, b_pack.data(), nc, c + int64_t{i0} * ldc + j0, ldc, k0 == 0, k0 + kc == k, beta,
                            bias ? bias + j0 : nullptr);
        if (done && k0 + kc == k) (*done)(r_off + i0, r_off + i0 + mc, c_off + j0, c_off + j0 + nc);
      }
    }
  }
}

// gemm_packed on `threads` OpenMP threads sharing the packed B, for a product with at least two chunks of C's rows
// per thread. For each block of kNc columns, a round packs as many blocks of k as fit kSharedB floats (at least
// one): the threads pack its panels together, then take work items — a chunk of C's rows over the round's k, its
// blocks of A packed by the thread that takes it — one at a time as they finish the last, so a core that runs
// slower (a busy neighbour on a shared host) takes fewer. Each thread takes the items of its own share of C's rows
// first, in order (WorkPile: the rows a parallel_for before it gave it, whose A is in its core's cache), then the
// other's from the far end. Against items handed out in order to whichever thread asked (OpenMP's dynamic
// schedule) a GPT step ran 2.5 % faster (median of 40 interleaved pairs, 26 of them faster); a static half each,
// for the cache alone, ran 5 % slower than the dynamic schedule. Two barriers per round (B packed; every item done
// before B's buffer is reused): one round for most of a training step's products (a weight gradient's k of 1024 tokens
// at 128 columns is 512 KiB). Split in halves instead, each thread packed all of B, and the faster thread waited for
// the slower one: ~19 % of one thread's time in a GPT step. Packing all of k at once lost more than it saved where
// B is large (the MLP's 784 × 512 weight: 1.6 MiB, out of L2 by the time the items read it). The kernels and the
// order of k are gemm_packed's, so every element of C has the bits the single-threaded product gives it.
constexpr int64_t kSharedB = 128 * 1024;
template <class Isa>
constexpr int kChunkRows = 8 * Isa::mr;  // rows of C per work item (64 for AVX-512, 48 for AVX2)

template <class Isa, bool Round>
void gemm_packed_threads(int threads, bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b,
                         int ldb, float beta, float* c, int ldc, const float* bias, const BlockDone* done) {
  constexpr int nr = Isa::nr;
  const int m_chunks = (m + kChunkRows<Isa> - 1) / kChunkRows<Isa>;
  const int k_blocks = (k + kKc - 1) / kKc;
  const int max_panels = (std::min(kNc, n) + nr - 1) / nr;
  const int per_round = static_cast<int>(std::clamp<int64_t>(kSharedB / (int64_t{kKc} * max_panels * nr), 1, k_blocks));
  // The packed B of a round: the calling thread's (another thread may run products of its own at the same time),
  // grown, never shrunk. The round's block r (k from (kb0 + r)·kKc), panel jp, at (r·kKc·panels + jp·kc)·nr.
  thread_local std::vector<float> b_shared;
  const size_t b_need = static_cast<size_t>(std::min(k, per_round * kKc)) * static_cast<size_t>(max_panels) * nr;
  if (b_shared.size() < b_need) b_shared.resize(b_need);
  float* const bp = b_shared.data();
  WorkPile items(threads);
#pragma omp parallel num_threads(threads)
  {
    thread_local std::vector<float> a_pack;  // this thread's block of A, grown, never shrunk
    const int me = omp_get_thread_num(), team = omp_get_num_threads();
    for (int j0 = 0; j0 < n; j0 += kNc) {
      const int nc = std::min(kNc, n - j0);
      const int n_panels = (nc + nr - 1) / nr;
      for (int kb0 = 0; kb0 < k_blocks; kb0 += per_round) {
        const int rounds_blocks = std::min(per_round, k_blocks - kb0);
        auto b_panel = [&](int kb, int jp) {
          return bp + (int64_t{kb - kb0} * kKc * n_panels + int64_t{jp} * std::min(kKc, k - kb * kKc)) * nr;
        };
        items.deal(me, team, m_chunks);  // (the previous round's items are all taken: its last barrier)
#pragma omp for schedule(static)
        for (int job = 0; job < rounds_blocks * n_panels; ++job) {
          const int kb = kb0 + job / n_panels, jp = job % n_panels;
          const int k0 = kb * kKc, kc = std::min(kKc, k - k0);
          pack_b<Isa, Round>(tb, b, ldb, k0, kc, j0 + jp * nr, std::min(nr, nc - jp * nr), b_panel(kb, jp));
        }  // (the loop's barrier: the round's B is whole, and every thread's items dealt, before any is taken)
        for (int item = items.take(me); item >= 0; item = items.take(me)) {
          const int i0 = item * kChunkRows<Isa>;
          const int mc = std::min(kChunkRows<Isa>, m - i0);
          for (int kb = kb0; kb < kb0 + rounds_blocks; ++kb) {
            const int k0 = kb * kKc, kc = std::min(kKc, k - k0);
            const ABlock ab = a_block<Isa, Round>(ta, a, lda, i0, mc, k0, kc, nc, a_pack);
            multiply_block<Isa>(kc, ab, mc, b_panel(kb, 0), nc, c + int64_t{i0} * ldc + j0, ldc, k0 == 0, k0 + kc == k,
                                beta, bias ? bias + j0 : nullptr);
          }
          if (done && kb0 + rounds_blocks == k_blocks) (*done)(i0, i0 + mc, j0, j0 + nc);
        }
#pragma omp barrier  // every item is done before the next round reuses B's buffer
      }
    }
  }
}

// A product on `threads` threads: shared blocks of B and row chunks taken as threads free up where C has two chunks
// of rows per thread or more (gemm_packed_threads); otherwise one block of C's rows or columns per thread (edges on
// multiples of 16), each thread packing what its block needs — with few rows to take turns over, the items of a
// shared B cost their barriers and balanced nothing (the MLP's batch of 128 rows trained ~5 % slower).
template <class Isa, bool Round>
void gemm_split(int threads, bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                float beta, float* c, int ldc, const float* bias, const BlockDone* done) {
  if (m >= 2 * threads * kChunkRows<Isa>) {
    gemm_packed_threads<Isa, Round>(threads, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias, done);
    return;
  }
  // C's rows r0..r1 come from rows of op(a) (columns of a when transposed), its columns c0..c1 from columns of op(b)
  // (rows of b when transposed).
  for_matrix_blocks(m, n, threads, [&](int r0, int r1, int c0, int c1) {
    gemm_packed<Isa, Round>(ta, tb, r1 - r0, c1 - c0, k, ta ? a + r0 : a + int64_t{r0} * lda, lda,
                            tb ? b + int64_t{c0} * ldb : b + c0, ldb, beta, c + int64_t{r0} * ldc + c0, ldc,
                            bias ? bias + c0 : nullptr, done, r0, c0);
  });
}

#endif  // __x86_64__

}  // namespace

bool cpu_sgemm_supported(CpuSgemmPath path) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  switch (path) {
    case CpuSgemmPath::avx512:  // (the check also says the OS saves the AVX-512 state)
      return __builtin_cpu_supports("avx512f");
    case CpuSgemmPath::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuSgemmPath::openblas: return true;
  }
  return false;
#else
  return path == CpuSgemmPath::openblas;
#endif
}

CpuSgemmPath cpu_sgemm_path() {
  const int forced = g_sgemm_forced.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<CpuSgemmPath>(forced);
  return sgemm_env_path();
}

std::string describe(CpuSgemmPath path) {
  switch (path) {
    case CpuSgemmPath::avx512: return "gputrain AVX-512 (8×32 FMA tiles)";
    case CpuSgemmPath::avx2: return "gputrain AVX2+FMA (6×16 FMA tiles)";
    case CpuSgemmPath::openblas: break;
  }
  return "OpenBLAS sgemm";
}

void force_cpu_sgemm_path(CpuSgemmPath path) {
  if (cpu_sgemm_supported(path)) g_sgemm_forced.store(static_cast<int>(path), std::memory_order_relaxed);
}
void reset_cpu_sgemm_path() { g_sgemm_forced.store(-1, std::memory_order_relaxed); }
void set_sgemm_always_pack_a(bool always) { g_always_pack_a.store(always, std::memory_order_relaxed); }

namespace {

template <bool Round>
void sgemm_t(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
             float* c, int ldc, const float* bias) {
  if (m <= 0 || n <= 0) return;
  const CpuSgemmPath path = cpu_sgemm_path();
  if (path == CpuSgemmPath::openblas || k <= 0) {  // (no products: c = beta·c, as SGEMM, then the bias)
    if (k > 0) {
      if constexpr (Round) {  // rounded copies of op(a)'s and op(b)'s rows as they lie, padding and all
        thread_local std::vector<float> ra, rb;  // grown, never shrunk
        // (the last row ends at its last element: what follows it may not be the caller's)
        const size_t na = static_cast<size_t>(ta ? k - 1 : m - 1) * static_cast<size_t>(lda) + (ta ? m : k),
                     nb = static_cast<size_t>(tb ? n - 1 : k - 1) * static_cast<size_t>(ldb) + (tb ? k : n);
        ra.resize(std::max(ra.size(), na));
        rb.resize(std::max(rb.size(), nb));
        round_to_half(HalfFormat::bf16, a, ra.data(), na);
        round_to_half(HalfFormat::bf16, b, rb.data(), nb);
        a = ra.data();
        b = rb.data();
      }
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda,
                  b, ldb, beta, c, ldc);
    }
    for (int i = 0; i < m; ++i) {
      float* row = c + int64_t{i} * ldc;
      if (k <= 0) {
        if (beta == 0.0f)
          std::fill(row, row + n, 0.0f);
        else
          for (int j = 0; j < n; ++j) row[j] *= beta;
      }
      if (bias)
        for (int j = 0; j < n; ++j) row[j] += bias[j];
    }
    return;
  }
#if defined(__x86_64__)
  if (path == CpuSgemmPath::avx512)
    gemm_packed<Avx512, Round>(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias);
  else
    gemm_packed<Avx2, Round>(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias);
#endif
}

template <bool Round>
void sgemm_threads_t(int threads, bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b,
                     int ldb, float beta, float* c, int ldc, const float* bias, const BlockDone* done) {
  if (m <= 0 || n <= 0) return;
  const CpuSgemmPath path = cpu_sgemm_path();
  if (path == CpuSgemmPath::openblas || k <= 0) {
    sgemm_t<Round>(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias);
    if (done) (*done)(0, m, 0, n);
    return;
  }
#if defined(__x86_64__)
  if (threads <= 1) {
    if (path == CpuSgemmPath::avx512)
      gemm_packed<Avx512, Round>(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias, done);
    else
      gemm_packed<Avx2, Round>(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias, done);
    return;
  }
  if (path == CpuSgemmPath::avx512)
    gemm_split<Avx512, Round>(threads, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias, done);
  else
    gemm_split<Avx2, Round>(threads, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias, done);
#endif
}

}  // namespace

void sgemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
           float* c, int ldc, const float* bias) {
  sgemm_t<false>(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias);
}

void sgemm_threads(int threads, bool round_bf16, bool ta, bool tb, int m, int n, int k, const float* a, int lda,
                   const float* b, int ldb, float beta, float* c, int ldc, const float* bias, const BlockDone* done) {
  if (round_bf16)
    sgemm_threads_t<true>(threads, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias, done);
  else
    sgemm_threads_t<false>(threads, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias, done);
}

void sgemm_bf16_rounded(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                        float beta, float* c, int ldc, const float* bias) {
  sgemm_t<true>(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias);
}

}  // namespace gt::cpu
