// bf16 matrix products on the CPU: the native AVX-512 BF16 GEMM (vdpbf16ps) and the run-time choice between it and
// the conversion path (operands rounded to bf16, multiplied by OpenBLAS's SGEMM; ops/precision.h).
#pragma once

#include <cstdint>
#include <string>

namespace gt::cpu {

/// How a bf16 product runs on the CPU. native: gemm_bf16 below (vdpbf16ps); conversion: operands rounded to bf16
/// and multiplied by the f32 path (ops/cpu/sgemm.h: our kernels round them as they pack them, OpenBLAS's path takes
/// rounded copies). Both sum exact products of bf16 values in f32.
enum class CpuBf16Path { native, conversion };

/// The path bf16 products take in this process: native where it pays (cpu_native_bf16_pays), else conversion,
/// unless the environment says GPUTRAIN_CPU_BF16=native (where the CPU has avx512_bf16) or convert. Read once; an
/// unknown value, or native on a CPU without it, throws std::runtime_error naming it (the first bf16 run's setup or
/// `gputrain devices` reads it first).
CpuBf16Path cpu_bf16_path();
/// Whether the native path is the faster one here: the CPU has avx512_bf16 and is an AMD one. Measured
/// (bench/bf16_gemm_rate.cpp and a loop of independent instructions): on this project's Zen 4, vdpbf16ps zmm issues
/// once a cycle like vfmadd231ps zmm, so bf16 doubles the products per cycle (our kernel 1.7-2.3× SGEMM); on its
/// Intel Xeon (family 6, model 207, no AMX exposed) it issues once in 4 cycles against FMA's 2 per cycle: half of
/// f32's rate (80-85 against 165-170 GFLOP/s on one core), so there the conversion path runs at f32's speed instead.
bool cpu_native_bf16_pays();
/// Whether bf16 products round their operands as the kernels pack them, keeping no rounded copies: on the native
/// path, and on the conversion path when the f32 products run on our kernels (ops/cpu/sgemm.h).
bool cpu_bf16_rounds_in_pack();
/// Whether this CPU can run the native path at all (avx512_bf16 and AVX-512 state enabled).
bool cpu_has_native_bf16();
/// "native (AVX-512 BF16, vdpbf16ps)" or "conversion (…)", for reports.
std::string describe(CpuBf16Path path);

/// Tests and benchmarks: make every later product of the process take `path` (native only where the CPU has it)
/// until reset_cpu_bf16_path() returns it to the environment's choice. Not for use while products run.
void force_cpu_bf16_path(CpuBf16Path path);
void reset_cpu_bf16_path();

/// c = op(a)·op(b) + beta·c on the calling thread, row-major as cblas_sgemm (op(a) m×k, op(b) k×n, c m×n), with
/// every element of a and b rounded to bf16 (nearest even, as float_to_bf16, except that f32 subnormals become
/// zero: the instruction treats bf16 subnormals as zero anyway) and the products summed in f32 (each product of two
/// bf16 values is exact in f32; pairs of k are summed by one vdpbf16ps, then into the f32 accumulator). beta 0 never
/// reads c. `bias` (null: none; n elements) is then added to each row of C, as a separate pass after the product
/// would: fl(Σ + bias[j]). Requires cpu_has_native_bf16().
void gemm_bf16(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
               float* c, int ldc, const float* bias = nullptr);
/// The same with b already in bf16 (an activation kept in 16 bits, ops/half_storage.h): its elements are multiplied
/// as they are (bf16 subnormals count as zero, as above).
void gemm_bf16(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const uint16_t* b, int ldb, float beta,
               float* c, int ldc);

/// gemm_bf16 on up to `threads` OpenMP threads (1: the calling thread), every element of C with the bits the one-thread
/// product gives it. Where op(a) is a not transposed, k spans more than one block of 256 and C has two chunks of 64
/// rows per thread or more, the threads pack each block of B together and take C's row chunks from a shared pile as
/// they free up; otherwise each takes one block of C's rows or columns (edges on multiples of 16) and packs what it
/// needs.
void gemm_bf16_threads(int threads, bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b,
                       int ldb, float beta, float* c, int ldc, const float* bias = nullptr);
void gemm_bf16_threads(int threads, bool ta, bool tb, int m, int n, int k, const float* a, int lda, const uint16_t* b,
                       int ldb, float beta, float* c, int ldc);

}  // namespace gt::cpu
