// Wall-clock GFLOP/s of the products of one configs/gpt_bytes.yaml training step (B 16 × T 64 = 1024 rows, C 128,
// MLP 512) through ops::matmul, as a step calls them (C split into one block per thread, ops/cpu/matmul.cpp), on 1
// and on 2 threads, and the speed-up. Best of 30 rounds of 10 calls each. Wall time, so it shows what threading
// gains or loses on small products, and it moves with a shared machine's load: compare runs made back to back.
// Usage: bench_step_gemm_rate [PRODUCT]   (one product by its name, e.g. "fc dx")
//        bench_step_gemm_rate --a-in-place [PRODUCT]: on one thread, op(a) read in place (the default) against packed
//        first (set_sgemm_always_pack_a), in alternating rounds, best of 30 each.
//        bench_step_gemm_rate --bf16 [PRODUCT]: the products under train.precision bf16 (the CPU's bf16 path,
//        ops/cpu/bf16_gemm.h: native where `gputrain devices` says so).
//        bench_step_gemm_rate --bf16-threads [PRODUCT]: on 2 threads, the native bf16 GEMM with one block of C per
//        thread (each packing its own B) against gemm_bf16_threads (B packed once, shared; rows taken from a pile),
//        operands rotated over 8 sets so that they come from L3 or memory as in a step; alternating rounds, the median
//        of 31 rounds each.
#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/cpu/bf16_gemm.h"
#include "ops/cpu/sgemm.h"
#include "ops/matmul.h"
#include "ops/precision.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace {

struct Product {
  int m, n, k;
  bool ta, tb;
  const char* what;
};

gt::Tensor filled(const gt::Shape& shape) {
  gt::Tensor t = gt::Tensor::empty(shape, gt::DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  return t;
}

}  // namespace

// Seconds per call of c = op(a)·op(b): the best of 10-call rounds.
struct Timer {
  double best = 1e30;
  void round(const gt::Tensor& a, bool ta, const gt::Tensor& b, bool tb, gt::Tensor& c) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int call = 0; call < 10; ++call) gt::ops::matmul(a, ta, b, tb, c, 0.0);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 10);
  }
};

int main(int argc, char** argv) {
  const bool a_ab = argc > 1 && std::string(argv[1]) == "--a-in-place";
  const bool bf16 = argc > 1 && std::string(argv[1]) == "--bf16";
  const bool bf16_threads = argc > 1 && std::string(argv[1]) == "--bf16-threads";
  const int first = 1 + (a_ab || bf16 || bf16_threads);
  const std::string only = argc > first ? argv[first] : "";
  std::optional<gt::ProductPrecisionScope> scope;
  if (bf16) scope.emplace(gt::Precision::bf16);
  const Product products[] = {{1024, 384, 128, false, true, "qkv"},         {1024, 128, 128, false, true, "attn proj"},
                              {1024, 512, 128, false, true, "fc"},          {1024, 128, 512, false, true, "proj"},
                              {1024, 128, 512, false, false, "fc dx"},      {1024, 512, 128, false, false, "proj dx"},
                              {1024, 128, 384, false, false, "qkv dx"},     {512, 128, 1024, true, false, "fc dW"},
                              {128, 512, 1024, true, false, "proj dW"},     {384, 128, 1024, true, false, "qkv dW"},
                              {128, 128, 1024, true, false, "attn proj dW"}};
  if (bf16_threads) {
    if (!gt::cpu::cpu_has_native_bf16()) {
      std::printf("this CPU has no avx512_bf16\n");
      return 1;
    }
    gt::set_num_threads(2);
    std::printf("%-14s %5s %5s %5s %9s %9s %8s\n", "GFLOP/s", "m", "n", "k", "blocks", "shared", "ratio");
  }
  for (const Product& p : products) {
    if (!bf16_threads || (!only.empty() && only != p.what)) continue;
    constexpr int kSets = 8;
    std::vector<gt::Tensor> as, bs, cs;
    for (int s = 0; s < kSets; ++s) {
      as.push_back(filled(p.ta ? gt::Shape{p.k, p.m} : gt::Shape{p.m, p.k}));
      bs.push_back(filled(p.tb ? gt::Shape{p.n, p.k} : gt::Shape{p.k, p.n}));
      cs.push_back(gt::Tensor::empty(gt::Shape{p.m, p.n}, gt::DType::f32));
    }
    const int lda = p.ta ? p.m : p.k, ldb = p.tb ? p.k : p.n;
    auto blocks = [&](int s) {
      const float *a = as[s].data<float>(), *b = bs[s].data<float>();
      float* c = cs[s].data<float>();
      gt::for_matrix_blocks(p.m, p.n, 2, [&](int r0, int r1, int c0, int c1) {
        gt::cpu::gemm_bf16(p.ta, p.tb, r1 - r0, c1 - c0, p.k, p.ta ? a + r0 : a + int64_t{r0} * lda, lda,
                           p.tb ? b + int64_t{c0} * ldb : b + c0, ldb, 0.0f, c + int64_t{r0} * p.n + c0, p.n);
      });
    };
    auto shared = [&](int s) {
      gt::cpu::gemm_bf16_threads(2, p.ta, p.tb, p.m, p.n, p.k, as[s].data<float>(), lda, bs[s].data<float>(), ldb, 0.0f,
                                 cs[s].data<float>(), p.n);
    };
    std::vector<double> t_blocks, t_shared;
    auto time = [&](auto&& f, std::vector<double>& out) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < kSets; ++s) f(s);
      out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kSets);
    };
    time(blocks, t_blocks), time(shared, t_shared);  // warm-up: packing buffers
    t_blocks.clear(), t_shared.clear();
    for (int round = 0; round < 31; ++round) time(blocks, t_blocks), time(shared, t_shared);
    std::sort(t_blocks.begin(), t_blocks.end()), std::sort(t_shared.begin(), t_shared.end());
    const double flop = 2.0 * p.m * p.n * p.k, tb = t_blocks[15], ts = t_shared[15];
    std::printf("%-14s %5d %5d %5d %9.1f %9.1f %7.2fx\n", p.what, p.m, p.n, p.k, flop / tb * 1e-9, flop / ts * 1e-9,
                tb / ts);
  }
  if (bf16_threads) return 0;
  if (a_ab)
    std::printf("%-14s %5s %5s %5s %9s %9s %8s\n", "GFLOP/s", "m", "n", "k", "packed", "in place", "ratio");
  else
    std::printf("%-14s %5s %5s %5s %9s %9s %8s\n", "GFLOP/s", "m", "n", "k", "1 thread", "2 threads", "speed-up");
  for (const Product& p : products) {
    if (!only.empty() && only != p.what) continue;
    const gt::Tensor a = filled(p.ta ? gt::Shape{p.k, p.m} : gt::Shape{p.m, p.k});
    const gt::Tensor b = filled(p.tb ? gt::Shape{p.n, p.k} : gt::Shape{p.k, p.n});
    gt::Tensor c = gt::Tensor::empty(gt::Shape{p.m, p.n}, gt::DType::f32);
    const double flop = 2.0 * p.m * p.n * p.k;
    if (a_ab) {
      gt::set_num_threads(1);
      Timer packed, in_place;
      for (int round = 0; round < 30; ++round) {
        gt::cpu::set_sgemm_always_pack_a(true);
        packed.round(a, p.ta, b, p.tb, c);
        gt::cpu::set_sgemm_always_pack_a(false);
        in_place.round(a, p.ta, b, p.tb, c);
      }
      std::printf("%-14s %5d %5d %5d %9.1f %9.1f %7.2fx\n", p.what, p.m, p.n, p.k, flop / packed.best * 1e-9,
                  flop / in_place.best * 1e-9, packed.best / in_place.best);
      continue;
    }
    double rate[2] = {0, 0};
    for (int threads = 1; threads <= 2; ++threads) {
      gt::set_num_threads(threads);
      gt::ops::matmul(a, p.ta, b, p.tb, c, 0.0);  // warm-up: packing buffers
      Timer timer;
      for (int round = 0; round < 30; ++round) timer.round(a, p.ta, b, p.tb, c);
      rate[threads - 1] = flop / timer.best * 1e-9;
    }
    std::printf("%-14s %5d %5d %5d %9.1f %9.1f %7.2fx\n", p.what, p.m, p.n, p.k, rate[0], rate[1], rate[1] / rate[0]);
  }
  return 0;
}
