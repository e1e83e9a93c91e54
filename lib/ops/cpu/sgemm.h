// f32 matrix products on the CPU: our own packed GEMM kernels for AVX-512 and for AVX2+FMA, chosen at run time, and
// OpenBLAS's SGEMM where neither runs (or where asked for).
//
// Why not OpenBLAS everywhere: its DYNAMIC_ARCH build picks its kernels by CPU model, and 0.3.21 (Debian 12's) does
// not know newer ones. On this project's Intel Xeon (family 6, model 207) it falls back to its Prescott (SSE3) core:
// 26-30 GFLOP/s on a training step's products on one thread, where its Cooperlake core, forced by
// OPENBLAS_CORETYPE, runs 85-142 and ours 3-5× Prescott's (bench/bf16_gemm_rate.cpp prints all of them). A user's
// OPENBLAS_CORETYPE may also force an older core. Ours take over where OpenBLAS runs narrower vectors than the CPU,
// and on every AVX-512 CPU (on Zen 4 they beat OpenBLAS's Cooperlake core on whole training steps, sgemm.cpp).
#pragma once

#include <functional>
#include <string>

namespace gt::cpu {

/// How an f32 product runs on the CPU: avx512 (8 × 32 register tiles of zmm FMAs), avx2 (6 × 16 of ymm FMAs) or
/// openblas (cblas_sgemm, the only one off x86-64 or below AVX2+FMA).
enum class CpuSgemmPath { avx512, avx2, openblas };

/// The path f32 products take in this process: the best the CPU runs unless GPUTRAIN_CPU_SGEMM says avx512, avx2
/// or openblas (auto, the default: our AVX-512 kernel wherever the CPU has AVX-512; at AVX2, OpenBLAS where it runs
/// an AVX2 core and our AVX2 kernel where it fell back to an older one).
/// Read once; an unknown value, or a kernel this CPU cannot run, throws std::runtime_error naming it.
CpuSgemmPath cpu_sgemm_path();
/// Whether this CPU can run `path` (openblas: always).
bool cpu_sgemm_supported(CpuSgemmPath path);
/// "gputrain AVX-512 (8×32 FMA tiles)", …, for `gputrain devices`.
std::string describe(CpuSgemmPath path);

/// Tests and benchmarks: make every later f32 product of the process take `path` (when the CPU runs it; otherwise
/// the environment's choice stays) until reset_cpu_sgemm_path(). Not for use while products run.
void force_cpu_sgemm_path(CpuSgemmPath path);
void reset_cpu_sgemm_path();
/// Benchmarks: whether our kernels copy op(a) into packed panels even where they can read its rows in place (false,
/// the default: rows in place wherever a is not transposed and not rounded to bf16). C's bits are the same either way.
void set_sgemm_always_pack_a(bool always);

/// c = op(a)·op(b) + beta·c (+ bias per row) on the calling thread, row-major as cblas_sgemm with alpha 1 (op(a) m×k,
/// op(b) k×n, c m×n), on cpu_sgemm_path(). beta 0 never reads c. `bias` (null: none; n elements) is added to each row
/// after the product: fl(Σ + bias[j]). On our kernels an element of c depends only on its row of op(a) and column of
/// op(b) (k summed in blocks of 256, in order, one FMA chain per block), not on m, n or where c's block starts, so
/// splitting c between threads changes no bit. k ≤ 0 reads neither a nor b: c = beta·c (+ bias).
void sgemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
           float* c, int ldc, const float* bias = nullptr);

/// The same product with every element of a and b rounded to bf16 first (nearest even, as float_to_bf16: a NaN
/// quieted, subnormals kept): the conversion path of a bf16 product (ops/cpu/bf16_gemm.h). Our kernels round the
/// elements as they pack them; OpenBLAS's path rounds into copies first. Either way the same bits as sgemm on
/// copies rounded by round_to_half.
void sgemm_bf16_rounded(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                        float beta, float* c, int ldc, const float* bias = nullptr);

/// sgemm (round_bf16: sgemm_bf16_rounded) on up to `threads` OpenMP threads, for a product too large for one. On our
/// kernels, where c has two chunks of rows (64 for AVX-512, 48 for AVX2) per thread or more, the threads pack each
/// block of op(b) together and take c's row chunks as they free up, so a slower core takes fewer; with fewer rows,
/// one block of c's rows or columns per thread. Every element of c gets the bits sgemm gives it. On OpenBLAS's
/// path, or with one thread, it is sgemm on the calling thread (callers that want OpenBLAS threaded split c
/// themselves).
///
/// `done` (null: none) is called with each block of c as it is finished — rows r0..r1 and columns c0..c1 of c, their
/// final values — on the thread that finished it, while the block is still in that core's caches: a fused epilogue
/// (ops/epilogue.h) runs there instead of in a later pass over all of c. Blocks do not overlap and cover c.
using BlockDone = std::function<void(int r0, int r1, int c0, int c1)>;
void sgemm_threads(int threads, bool round_bf16, bool ta, bool tb, int m, int n, int k, const float* a, int lda,
                   const float* b, int ldb, float beta, float* c, int ldc, const float* bias = nullptr,
                   const BlockDone* done = nullptr);

}  // namespace gt::cpu
