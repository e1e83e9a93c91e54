// The machine's single-precision GEMM rate, the yardstick that the side-by-side benchmarks (bench/side_by_side.py)
// share each engine's achieved GFLOP/s against: the better of OpenBLAS's own sgemm (threaded by OpenBLAS, with the
// core it picked) and gputrain's f32 kernels (ops/cpu/sgemm.h; C split into one block of rows per thread, as gputrain's
// products do), both printed. At n = 2048 (the default) the O(n²) packing is small beside the O(n³) arithmetic and
// the rate is on its plateau: 1024³ ran ~7 % slower on OpenBLAS, 4096³ the same within noise at 8× the time. Best of 3
// calls after a warm-up call each. Prints one JSON line.
// Usage: bench_gemm_rate [THREADS [N]]
#include "ops/cpu/sgemm.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const int n = argc > 2 ? std::atoi(argv[2]) : 2048;
  if (argc > 3 || threads < 1 || threads > 1024 || n < 1 || n > 16384) {
    std::fprintf(stderr, "usage: %s [THREADS (1-1024) [N (1-16384)]]\n", argv[0]);
    return 2;
  }
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  auto best_gflops = [&](auto&& product) {
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      product();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0 && dt < best) best = dt;  // the first call pays for page faults and buffer set-up
    }
    return 2.0 * n * n * n / best * 1e-9;
  };
  openblas_set_num_threads(threads);
  const double openblas = best_gflops([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  openblas_set_num_threads(1);
  const bool own = gt::cpu::cpu_sgemm_path() != gt::cpu::CpuSgemmPath::openblas;
  const double ours = !own ? 0.0 : best_gflops([&] {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const int r0 = static_cast<int>(int64_t{n} * t / threads),
                  r1 = static_cast<int>(int64_t{n} * (t + 1) / threads);
        gt::cpu::sgemm(false, false, r1 - r0, n, n, a.data() + int64_t{r0} * n, n, b.data(), n, 0.0f,
                       c.data() + int64_t{r0} * n, n);
      });
    for (std::thread& th : pool) th.join();
  });
  std::printf(
      "{\"threads\": %d, \"n\": %d, \"gflops\": %.1f, \"openblas_gflops\": %.1f, \"openblas_core\": \"%s\", "
      "\"gputrain_gflops\": %.1f}\n",
      threads, n, std::max(openblas, ours), openblas, openblas_get_corename(), ours);
  return 0;
}
