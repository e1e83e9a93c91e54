// The machine's single-precision GEMM rate through OpenBLAS's own sgemm, the yardstick that the side-by-side
// benchmarks (bench/side_by_side.py) share each engine's achieved GFLOP/s against. At n = 2048 (the default) the
// O(n²) packing is small beside the O(n³) arithmetic and the rate is on its plateau: 1024³ runs ~7 % slower here,
// 4096³ the same within noise at 8× the time. Best of 3 calls after a warm-up call. Prints one JSON line.
// Usage: bench_gemm_rate [THREADS [N]]
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const int n = argc > 2 ? std::atoi(argv[2]) : 2048;
  if (argc > 3 || threads < 1 || threads > 1024 || n < 1 || n > 16384) {
    std::fprintf(stderr, "usage: %s [THREADS (1-1024) [N (1-16384)]]\n", argv[0]);
    return 2;
  }
  openblas_set_num_threads(threads);
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0 && dt < best) best = dt;  // the first call pays for page faults and buffer set-up
  }
  std::printf("{\"threads\": %d, \"n\": %d, \"gflops\": %.1f}\n", threads, n, 2.0 * n * n * n / best * 1e-9);
  return 0;
}
