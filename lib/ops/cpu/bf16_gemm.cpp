// The native AVX-512 BF16 GEMM and the choice of the CPU's bf16 path (ops/cpu/bf16_gemm.h).
//
// Why our own kernel rather than oneDNN 2.6's dnnl_gemm_bf16bf16f32: measured single-threaded on this project's Zen 4
// at the products of a training step (MLP 128 × 784 → 256, GPT 768 × 128 → 128/384/512, 768 × 512 → 128, the
// 512 × 768ᵀ weight gradient; machine shared, so rough) ours runs 154-205 GFLOP/s, 1.7-2.3× OpenBLAS's SGEMM, and
// oneDNN 188-220 on operands already in bf16 but 156-207 once it pays their conversion, which ours does while it
// packs. A weight's bf16 copy made once per step would put oneDNN about half-way between, for a library whose bf16
// GEMM is exported but not declared in its public headers, that threads itself over OpenMP unless called inside our
// per-thread blocks, and that would need every other operand converted to a bf16 copy first.
//
// Only the functions marked GT_BF16_TARGET use AVX-512 instructions; the rest of this file, and of the binary, stays
// baseline x86-64, and gemm_bf16 is only called where CPUID says the CPU has avx512_bf16.
#include "ops/cpu/bf16_gemm.h"

#include "core/env.h"
#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/sgemm.h"
#include "ops/devices.h"

#include <omp.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include "ops/cpu/avx512_tile.h"  // (and immintrin.h)
#define GT_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

namespace gt::cpu {
namespace {

// The blocking: a micro-kernel computes kBf16Mr × kBf16Nr of C (16 zmm accumulators of the 32) from a packed panel
// of A (kBf16Mr rows of k-pairs, 4 KiB at kBf16Kc) and one of B (kBf16Nr columns of k-pairs, 16 KiB: stays in L1
// while the A panels of a block stream past it); a block of B (kBf16Kc × kBf16Nc, 256 KiB) stays in L2.
constexpr int kBf16Mr = 8;
constexpr int kBf16Nr = 32;
constexpr int kBf16Kc = 256;  // even: only the last block of k can hold an unpaired element
constexpr int kBf16Mc = 128;
constexpr int kBf16Nc = 512;

std::atomic<int> g_bf16_forced{-1};  // a CpuBf16Path forced by a test or benchmark; -1: the environment's choice

CpuBf16Path bf16_env_path() {
  static const CpuBf16Path path = [] {
    const std::optional<size_t> choice = env_choice("GPUTRAIN_CPU_BF16", {"native", "convert"});
    if (!choice) return cpu_native_bf16_pays() ? CpuBf16Path::native : CpuBf16Path::conversion;
    if (*choice == 1) return CpuBf16Path::conversion;
    if (!cpu_has_native_bf16()) throw Error("GPUTRAIN_CPU_BF16=native: this CPU has no avx512_bf16 (gputrain devices)");
    return CpuBf16Path::native;
  }();
  return path;
}

#if defined(__x86_64__)

// out[p·w + l], for the pairs p < ⌈kc/2⌉ and lanes l < count, is the bf16 pair (x(2p, l), x(2p+1, l)) as one 32-bit
// word, the even k in its low half (what vdpbf16ps multiplies with the same half of the other operand), with
// x(kk, l) = src[kk·ld + l]: lanes contiguous in memory. An odd kc's last pair holds a zero in its high half. Lanes
// from count to w are not written. src is f32 (rounded here, nearest even) or already bf16 (S = uint16_t: an
// activation kept in 16 bits, ops/half_storage.h, whose elements are taken as they are).
template <class S>
GT_BF16_TARGET void bf16_pack_lanes(const S* src, int ld, int kc, int count, int w, uint32_t* out) {
  // The 16-bit element e of the result is half e % 2 of lane e / 2: lo's element e/2, or hi's (element 16 + e/2).
  alignas(64) static constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                           21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                           11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const int pairs = (kc + 1) / 2;
  for (int l0 = 0; l0 < count; l0 += 16) {
    const __mmask16 mask = count - l0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (count - l0)) - 1);
    for (int p = 0; p < pairs; ++p) {
      const S* lo_row = src + int64_t{2 * p} * ld + l0;
      const bool has_hi = 2 * p + 1 < kc;
      __m512i words;
      if constexpr (std::is_same_v<S, float>) {
        const __m512 lo = _mm512_maskz_loadu_ps(mask, lo_row);
        const __m512 hi = has_hi ? _mm512_maskz_loadu_ps(mask, lo_row + ld) : _mm512_setzero_ps();
        const auto both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // lo's 16 bf16, then hi's
        words = _mm512_permutexvar_epi16(interleave, both);
      } else {
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, lo_row));
        const __m512i hi =
            has_hi ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, lo_row + ld)) : _mm512_setzero_si512();
        words = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
      }
      _mm512_mask_storeu_epi32(out + int64_t{p} * w + l0, mask, words);
    }
  }
}

// The same words with x(kk, l) = src[l·ld + kk]: each lane's k contiguous in memory, so a lane's 16 pairs come out
// of one load (f32: converted, 32 elements; bf16: already its 32-bit words, little-endian, the even k low), and a
// transpose of 16 lanes' vectors puts each pair's lanes together.
template <class S>
GT_BF16_TARGET void bf16_pack_rows(const S* src, int ld, int kc, int count, int w, uint32_t* out) {
  const int pairs = (kc + 1) / 2;
  const int group = std::min(16, w);
  for (int l0 = 0; l0 < count; l0 += group) {
    const int g = std::min(group, count - l0);
    const __mmask16 lanes = g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << g) - 1);
    for (int p0 = 0; p0 < pairs; p0 += 16) {
      const int k0 = 2 * p0, left = kc - k0, np = std::min(16, pairs - p0);
      __m512i r[16];
#pragma GCC unroll 16
      for (int l = 0; l < 16; ++l) {
        if (l >= g) {
          r[l] = _mm512_setzero_si512();
          continue;
        }
        const S* row = src + int64_t{l0 + l} * ld + k0;
        if constexpr (std::is_same_v<S, float>) {
          const __mmask16 m_lo = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
          const __mmask16 m_hi = left >= 32  ? __mmask16(0xFFFF)
                                 : left > 16 ? __mmask16((1u << (left - 16)) - 1)
                                             : __mmask16(0);
          r[l] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m_hi, row + 16), _mm512_maskz_loadu_ps(m_lo, row));
        } else {
          // The 16-bit elements k0 .. kc (at most 32; 2-byte aligned, so a masked load of halves, not of words):
          // an odd kc's last word keeps only its low half.
          const __mmask32 halves = left >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << left) - 1);
          r[l] = _mm512_maskz_loadu_epi16(halves, row);
        }
      }
      transpose16(r);  // r[q]: the pair p0 + q of lanes l0..l0+15
      for (int q = 0; q < np; ++q) _mm512_mask_storeu_epi32(out + int64_t{p0 + q} * w + l0, lanes, r[q]);
    }
  }
}

// Panels of `w` lanes (rows of op(a) or columns of op(b)) from lane `first` on, `count` lanes in all, k from 0 to
// kc: panel q at out + q·pairs·w, lanes past count zero (they multiply into C's rows or columns that are not stored).
template <class S>
GT_BF16_TARGET void bf16_pack_panels(const S* src, int ld, bool lanes_contiguous, int kc, int count, int w,
                                     uint32_t* out) {
  const int pairs = (kc + 1) / 2;
  for (int q0 = 0; q0 < count; q0 += w) {
    const int n = std::min(w, count - q0);
    uint32_t* panel = out + int64_t{q0 / w} * pairs * w;
    if (n < w) std::memset(panel, 0, sizeof(uint32_t) * static_cast<size_t>(pairs) * static_cast<size_t>(w));
    if (lanes_contiguous)
      bf16_pack_lanes(src + q0, ld, kc, n, w, panel);
    else
      bf16_pack_rows(src + int64_t{q0} * ld, ld, kc, n, w, panel);
  }
}

// C's rows·cols (at most kBf16Mr × kBf16Nr, ldc apart) from an A panel and a B panel of `pairs` k-pairs: the first
// block of k writes beta·C + A·B (C unread when beta is 0), later blocks add theirs; the last block then adds
// bias[0 .. cols) to each row when bias is not null, so that an element is fl(Σ + bias) as after the product.
GT_BF16_TARGET void bf16_kernel(int pairs, const uint32_t* ap, const uint32_t* bp, float* c, int ldc, int rows,
                                int cols, bool first, bool last, float beta, const float* bias) {
  __m512 acc[kBf16Mr][2];
#pragma GCC unroll 8
  for (int r = 0; r < kBf16Mr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int p = 0; p < pairs; ++p) {
    const auto b0 = (__m512bh)_mm512_loadu_si512(bp + p * kBf16Nr);
    const auto b1 = (__m512bh)_mm512_loadu_si512(bp + p * kBf16Nr + 16);
#pragma GCC unroll 8
    for (int r = 0; r < kBf16Mr; ++r) {
      const auto a = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[p * kBf16Mr + r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
    }
  }
  store_tile<kBf16Mr>(acc, c, ldc, rows, cols, first, last, beta, bias);
}

// Panels jp0 .. jp1 of a block of op(b) (op(b)(kk, j) is b[kk·ldb + j], or b[j·ldb + kk] when transposed): k from k0,
// kc of it, columns j0 + 32·jp on (at most nc in all), each pairs(kc)·kBf16Nr words, the first at out.
template <class SB>
GT_BF16_TARGET void bf16_pack_b_panels(bool tb, const SB* b, int ldb, int k0, int kc, int j0, int nc, int jp0, int jp1,
                                       uint32_t* out) {
  const int pairs = (kc + 1) / 2;
  for (int jp = jp0; jp < jp1; ++jp) {
    const int j = j0 + jp * kBf16Nr, count = std::min(kBf16Nr, nc - jp * kBf16Nr);
    uint32_t* panel = out + int64_t{jp - jp0} * pairs * kBf16Nr;
    if (tb)
      bf16_pack_panels(b + int64_t{j} * ldb + k0, ldb, false, kc, count, kBf16Nr, panel);
    else
      bf16_pack_panels(b + int64_t{k0} * ldb + j, ldb, true, kc, count, kBf16Nr, panel);
  }
}

// C's rows i0 .. i0 + mc and columns j0 .. j0 + nc over the blocks of k kb0 .. kb1, from B's panels packed for
// them (block kb's at b_round + (kb − kb0)·kBf16Kc/2·n_panels·kBf16Nr, panel jp of it jp·pairs·kBf16Nr further on),
// A packed here into the calling thread's a_pack: the work of one thread on its block of C, or of a shared-B item.
GT_BF16_TARGET void bf16_item(bool ta, int k, const float* a, int lda, const uint32_t* b_round, int n_panels, int i0,
                              int mc, int j0, int nc, int kb0, int kb1, float beta, float* c, int ldc,
                              const float* bias, std::vector<uint32_t>& a_pack) {
  const int m_panels = (mc + kBf16Mr - 1) / kBf16Mr;
  for (int kb = kb0; kb < kb1; ++kb) {
    const int k0 = kb * kBf16Kc, kc = std::min(kBf16Kc, k - k0), pairs = (kc + 1) / 2;
    const size_t a_need = static_cast<size_t>(m_panels) * pairs * kBf16Mr;
    if (a_pack.size() < a_need) a_pack.resize(a_need);
    if (ta)
      bf16_pack_panels(a + int64_t{k0} * lda + i0, lda, true, kc, mc, kBf16Mr, a_pack.data());
    else
      bf16_pack_panels(a + int64_t{i0} * lda + k0, lda, false, kc, mc, kBf16Mr, a_pack.data());
    const uint32_t* bp = b_round + int64_t{kb - kb0} * (kBf16Kc / 2) * n_panels * kBf16Nr;
    for (int jp = 0; jp < n_panels; ++jp)
      for (int ip = 0; ip < m_panels; ++ip) {
        const int rows = std::min(kBf16Mr, mc - ip * kBf16Mr), cols = std::min(kBf16Nr, nc - jp * kBf16Nr);
        bf16_kernel(pairs, a_pack.data() + int64_t{ip} * pairs * kBf16Mr, bp + int64_t{jp} * pairs * kBf16Nr,
                    c + int64_t{i0 + ip * kBf16Mr} * ldc + j0 + jp * kBf16Nr, ldc, rows, cols, k0 == 0, k0 + kc == k,
                    beta, bias ? bias + j0 + jp * kBf16Nr : nullptr);
      }
  }
}

// B is f32 (rounded as it is packed) or already bf16 (SB = uint16_t).
template <class SB>
GT_BF16_TARGET void bf16_gemm_avx512(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const SB* b,
                                     int ldb, float beta, float* c, int ldc, const float* bias) {
  // The packed operands, per thread: they grow to the largest block once and stay.
  thread_local std::vector<uint32_t> a_pack, b_pack;
  for (int j0 = 0; j0 < n; j0 += kBf16Nc) {
    const int nc = std::min(kBf16Nc, n - j0);
    const int n_panels = (nc + kBf16Nr - 1) / kBf16Nr;
    for (int k0 = 0; k0 < k; k0 += kBf16Kc) {
      const int kc = std::min(kBf16Kc, k - k0), pairs = (kc + 1) / 2;
      // Grown, never shrunk: resizing down and up again would zero the regrown part on every call.
      const size_t b_need = static_cast<size_t>(n_panels) * pairs * kBf16Nr;
      if (b_pack.size() < b_need) b_pack.resize(b_need);
      bf16_pack_b_panels(tb, b, ldb, k0, kc, j0, nc, 0, n_panels, b_pack.data());
      for (int i0 = 0; i0 < m; i0 += kBf16Mc)
        bf16_item(ta, k, a, lda, b_pack.data(), n_panels, i0, std::min(kBf16Mc, m - i0), j0, nc, k0 / kBf16Kc,
                  k0 / kBf16Kc + 1, beta, c, ldc, bias, a_pack);
    }
  }
}

// gemm_bf16 on `threads` OpenMP threads sharing the packed B, as the f32 kernels' gemm_packed_threads
// (ops/cpu/sgemm.cpp) does: each thread packing all of B for its own block of C's rows packs B twice, and a static half
// of C each leaves the faster thread waiting for the slower one at the product's end. Measured on gpt_bytes' products,
// 2 threads of the Zen 4, operands rotated over 8 sets so that they come from L3 as in a step (`bench_step_gemm_rate
// --bf16-threads`, medians of 31 alternating rounds, three runs): 1.07-1.14× where a is not transposed and k spans
// two blocks or more (proj, fc dx, qkv dx: k 384-512), within ±3 % where k is one block (B is small), and 0.93-0.97×
// for the weight gradients (a transposed, B the 1024 tokens of an activation: half of B then comes from the other
// core's L2); gemm_bf16_threads takes it only where it won. Chunks of 128 rows ran 0.93-1.02×. For each block of
// kBf16Nc columns,
// a round packs as many blocks of k as fit kBf16SharedB words: the threads pack its panels together (a barrier),
// then take items — kBf16ChunkRows rows of C over the round's k, their A packed by the thread that takes them — from
// a WorkPile (own rows first, in order, then the other's from the far end), and a barrier before the next round
// reuses B's buffer. The kernel, its blocks of k and their order are bf16_gemm_avx512's, so every element of C has
// the bits the one-thread product gives it, whichever thread computed it.
constexpr int kBf16ChunkRows = 64;
constexpr int64_t kBf16SharedB = 128 * 1024;  // words (512 KiB): two blocks of k at 512 columns, four at 128

// (Not itself GT_BF16_TARGET: the parallel region's outlined body calls the target functions above.)
template <class SB>
void bf16_gemm_shared_b(int threads, bool ta, bool tb, int m, int n, int k, const float* a, int lda, const SB* b,
                        int ldb, float beta, float* c, int ldc, const float* bias) {
  const int m_chunks = (m + kBf16ChunkRows - 1) / kBf16ChunkRows;
  const int k_blocks = (k + kBf16Kc - 1) / kBf16Kc;
  const int max_panels = (std::min(kBf16Nc, n) + kBf16Nr - 1) / kBf16Nr;
  const int block_words = kBf16Kc / 2 * max_panels * kBf16Nr;
  const int per_round = static_cast<int>(std::clamp<int64_t>(kBf16SharedB / block_words, 1, k_blocks));
  // The round's packed B: the calling thread's (another may run products of its own meanwhile), grown, never shrunk.
  thread_local std::vector<uint32_t> b_shared;
  const size_t b_need = static_cast<size_t>(per_round) * static_cast<size_t>(block_words);
  if (b_shared.size() < b_need) b_shared.resize(b_need);
  uint32_t* const bp = b_shared.data();
  WorkPile items(threads);
#pragma omp parallel num_threads(threads)
  {
    thread_local std::vector<uint32_t> a_pack;  // this thread's block of A, grown, never shrunk
    const int me = omp_get_thread_num(), team = omp_get_num_threads();
    for (int j0 = 0; j0 < n; j0 += kBf16Nc) {
      const int nc = std::min(kBf16Nc, n - j0);
      const int n_panels = (nc + kBf16Nr - 1) / kBf16Nr;
      for (int kb0 = 0; kb0 < k_blocks; kb0 += per_round) {
        const int kb1 = std::min(k_blocks, kb0 + per_round);
        items.deal(me, team, m_chunks);  // (the previous round's items are all taken: its last barrier)
        // The round's B in jobs of (block of k, up to 4 panels): a block's panels are contiguous.
        constexpr int kPanelsPerJob = 4;
        const int jobs_per_block = (n_panels + kPanelsPerJob - 1) / kPanelsPerJob;
#pragma omp for schedule(static)
        for (int job = 0; job < (kb1 - kb0) * jobs_per_block; ++job) {
          const int kb = kb0 + job / jobs_per_block, jp0 = job % jobs_per_block * kPanelsPerJob;
          const int k0 = kb * kBf16Kc, kc = std::min(kBf16Kc, k - k0), pairs = (kc + 1) / 2;
          bf16_pack_b_panels(tb, b, ldb, k0, kc, j0, nc, jp0, std::min(n_panels, jp0 + kPanelsPerJob),
                             bp + int64_t{kb - kb0} * (kBf16Kc / 2) * n_panels * kBf16Nr +
                                 int64_t{jp0} * pairs * kBf16Nr);
        }  // (the loop's barrier: the round's B is whole, and every thread's items dealt, before any is taken)
        for (int64_t item = items.take(me); item >= 0; item = items.take(me)) {
          const int i0 = static_cast<int>(item) * kBf16ChunkRows;
          bf16_item(ta, k, a, lda, bp, n_panels, i0, std::min(kBf16ChunkRows, m - i0), j0, nc, kb0, kb1, beta, c, ldc,
                    bias, a_pack);
        }
#pragma omp barrier  // every item is done before the next round reuses B's buffer
      }
    }
  }
}

#endif  // __x86_64__

}  // namespace

bool cpu_has_native_bf16() {
#if defined(__x86_64__)
  static const bool has = query_cpu_half().avx512_bf16;
  return has;
#else
  return false;
#endif
}

bool cpu_native_bf16_pays() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return cpu_has_native_bf16() && __builtin_cpu_is("amd");
#else
  return false;
#endif
}

bool cpu_bf16_rounds_in_pack() {
  return cpu_bf16_path() == CpuBf16Path::native || cpu_sgemm_path() != CpuSgemmPath::openblas;
}

CpuBf16Path cpu_bf16_path() {
  const int forced = g_bf16_forced.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<CpuBf16Path>(forced);
  return bf16_env_path();
}

std::string describe(CpuBf16Path path) {
  if (path == CpuBf16Path::native) return "native (AVX-512 BF16, vdpbf16ps)";
  return cpu_sgemm_path() == CpuSgemmPath::openblas
             ? "conversion (bf16-rounded copies of the operands, OpenBLAS SGEMM)"
             : "conversion (operands rounded to bf16 as the f32 kernels pack them)";
}

void force_cpu_bf16_path(CpuBf16Path path) {
  if (path == CpuBf16Path::native && !cpu_has_native_bf16()) path = CpuBf16Path::conversion;
  g_bf16_forced.store(static_cast<int>(path), std::memory_order_relaxed);
}
void reset_cpu_bf16_path() { g_bf16_forced.store(-1, std::memory_order_relaxed); }

namespace {

template <class SB>
void gemm_bf16_t(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const SB* b, int ldb, float beta,
                 float* c, int ldc, const float* bias) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // no products: c = beta·c (+ bias), which sgemm does without reading a or b
    sgemm(ta, tb, m, n, 0, nullptr, lda, nullptr, ldb, beta, c, ldc, bias);
    return;
  }
#if defined(__x86_64__)
  bf16_gemm_avx512(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias);
#else
  (void)ta, (void)tb, (void)a, (void)lda, (void)b, (void)ldb, (void)bias;
  throw std::logic_error("gemm_bf16: no AVX-512 BF16 on this architecture");
#endif
}

// gemm_bf16 on up to `threads` threads (ops/cpu/bf16_gemm.h).
template <class SB>
void gemm_bf16_threads_t(int threads, bool ta, bool tb, int m, int n, int k, const float* a, int lda, const SB* b,
                         int ldb, float beta, float* c, int ldc, const float* bias) {
#if defined(__x86_64__)
  if (threads > 1 && !ta && k > kBf16Kc && m >= 2 * threads * kBf16ChunkRows) {
    bf16_gemm_shared_b(threads, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias);
    return;
  }
#endif
  // C's rows r0..r1 come from rows of op(a) (columns of a when transposed), its columns c0..c1 from columns of op(b)
  // (rows of b when transposed).
  for_matrix_blocks(m, n, threads, [&](int r0, int r1, int c0, int c1) {
    gemm_bf16_t(ta, tb, r1 - r0, c1 - c0, k, ta ? a + r0 : a + int64_t{r0} * lda, lda,
                tb ? b + int64_t{c0} * ldb : b + c0, ldb, beta, c + int64_t{r0} * ldc + c0, ldc,
                bias ? bias + c0 : nullptr);
  });
}

}  // namespace

void gemm_bf16_threads(int threads, bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b,
                       int ldb, float beta, float* c, int ldc, const float* bias) {
  gemm_bf16_threads_t(threads, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias);
}

void gemm_bf16_threads(int threads, bool ta, bool tb, int m, int n, int k, const float* a, int lda, const uint16_t* b,
                       int ldb, float beta, float* c, int ldc) {
  gemm_bf16_threads_t(threads, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, static_cast<const float*>(nullptr));
}

void gemm_bf16(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
               float* c, int ldc, const float* bias) {
  gemm_bf16_t(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, bias);
}

void gemm_bf16(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const uint16_t* b, int ldb, float beta,
               float* c, int ldc) {
  gemm_bf16_t(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, static_cast<const float*>(nullptr));
}

}  // namespace gt::cpu
