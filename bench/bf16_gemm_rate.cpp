// GFLOP/s of one thread's f32 products on each path (ops/cpu/sgemm.h: OpenBLAS's SGEMM with the core it picked, our
// AVX-512 and AVX2+FMA kernels where the CPU runs them) against the CPU's two bf16 paths (ops/cpu/bf16_gemm.h) at the
// products of a training step: the native AVX-512 BF16 GEMM (where the CPU has it) and the conversion path (both
// operands rounded to bf16 in f32, then the default f32 path; a weight's rounding is paid once per step in training,
// here on every call, so this is that path's worst case). Ratios are against the best f32 path. Timed in process CPU
// time, the best of 5 rounds of at least 0.2 s each, so a machine shared with other jobs moves it less than wall time
// would. Usage: bench_bf16_gemm_rate
#include "core/half.h"
#include "ops/cpu/bf16_gemm.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/sgemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <vector>

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

template <class F>
double gflops(double flops, F&& f) {
  f();  // warm-up: packing buffers, caches
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    int calls = 0;
    const double t0 = cpu_seconds();
    double t = 0;
    do {
      f();
      ++calls;
      t = cpu_seconds() - t0;
    } while (t < 0.2);
    best = std::max(best, flops * calls / t / 1e9);
  }
  return best;
}

struct Shape {
  int m, n, k;
  bool ta, tb;
  const char* what;
};

}  // namespace

int main() {
  openblas_set_num_threads(1);
  const Shape shapes[] = {{128, 256, 784, false, true, "MLP forward: x 128x784 . W^T (256x784)"},
                          {256, 784, 128, true, false, "MLP dW: dy^T (128x256) . x 128x784"},
                          {768, 384, 128, false, true, "GPT qkv: 768x128 . W^T (384x128)"},
                          {768, 512, 128, false, true, "GPT fc: 768x128 . W^T (512x128)"},
                          {768, 128, 512, false, true, "GPT proj: 768x512 . W^T (128x512)"},
                          {768, 128, 512, false, false, "GPT fc dx: dy 768x512 . W (512x128)"},
                          {768, 512, 128, false, false, "GPT proj dx: dy 768x128 . W (128x512)"},
                          {512, 128, 768, true, false, "GPT fc dW: dy^T (512x768) . x 768x128"},
                          {128, 512, 768, true, false, "GPT proj dW: dy^T (128x768) . x 768x512"}};
  const bool native = gt::cpu::cpu_has_native_bf16();
  std::printf("one thread, process CPU time, best of 5; native bf16 %s\n",
              native ? "available" : "not available (this CPU has no avx512_bf16)");
  using gt::cpu::CpuSgemmPath;
  const CpuSgemmPath paths[] = {CpuSgemmPath::openblas, CpuSgemmPath::avx512, CpuSgemmPath::avx2};
  std::printf("f32 paths: OpenBLAS (core %s), ours (%s%s)\n", openblas_get_corename(),
              gt::cpu::cpu_sgemm_supported(CpuSgemmPath::avx512) ? "AVX-512, " : "",
              gt::cpu::cpu_sgemm_supported(CpuSgemmPath::avx2) ? "AVX2+FMA" : "none");
  std::printf("%-40s %9s %9s %9s %9s %9s %8s\n", "GFLOP/s", "OpenBLAS", "AVX-512", "AVX2", "bf16 conv", "bf16 nat",
              "nat/f32");
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    std::vector<float> a(static_cast<size_t>(s.m) * s.k), b(static_cast<size_t>(s.k) * s.n),
        c(static_cast<size_t>(s.m) * s.n), ra(a.size()), rb(b.size());
    for (float& x : a) x = static_cast<float>((seed = seed * 1664525u + 1013904223u) >> 8) * 0x1p-24f - 0.5f;
    for (float& x : b) x = static_cast<float>((seed = seed * 1664525u + 1013904223u) >> 8) * 0x1p-24f - 0.5f;
    const double flops = 2.0 * s.m * s.n * s.k;
    double f32[3] = {0, 0, 0}, best = 0;
    for (int i = 0; i < 3; ++i) {
      if (!gt::cpu::cpu_sgemm_supported(paths[i])) continue;
      gt::cpu::force_cpu_sgemm_path(paths[i]);
      f32[i] = gflops(flops, [&] {
        gt::cpu::gemm_raw<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n);
      });
      best = std::max(best, f32[i]);
    }
    gt::cpu::reset_cpu_sgemm_path();
    const double conv = gflops(flops, [&] {
      gt::round_to_half(gt::HalfFormat::bf16, a.data(), ra.data(), a.size());
      gt::round_to_half(gt::HalfFormat::bf16, b.data(), rb.data(), b.size());
      gt::cpu::gemm_raw<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, ra.data(), lda, rb.data(), ldb, 0.0f, c.data(), s.n);
    });
    const double nat = native ? gflops(flops,
                                       [&] {
                                         gt::cpu::gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb,
                                                            0.0f, c.data(), s.n);
                                       })
                              : 0.0;
    std::printf("%-40s %9.1f %9.1f %9.1f %9.1f %9.1f %7.2fx\n", s.what, f32[0], f32[1], f32[2], conv, nat, nat / best);
  }
  return 0;
}
