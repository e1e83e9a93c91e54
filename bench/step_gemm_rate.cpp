// Wall-clock GFLOP/s of the products of one configs/gpt_bytes.yaml training step (B 16 × T 64 = 1024 rows, C 128,
// MLP 512) through ops::matmul, as a step calls them (C split into one block per thread, ops/cpu/matmul.cpp), on 1
// and on 2 threads, and the speed-up. Best of 30 rounds of 10 calls each. Wall time, so it shows what threading
// gains or loses on small products, and it moves with a shared machine's load: compare runs made back to back.
// Usage: bench_step_gemm_rate [PRODUCT]   (one product by its name, e.g. "fc dx")
//        bench_step_gemm_rate --a-in-place [PRODUCT]: on one thread, op(a) read in place (the default) against packed
//        first (set_sgemm_always_pack_a), in alternating rounds, best of 30 each (only where a is not transposed).
#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/matmul.h"
#include "ops/sgemm.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

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
  const std::string only = argc > 1 + a_ab ? argv[1 + a_ab] : "";
  const Product products[] = {
      {1024, 384, 128, false, true, "qkv"},          {1024, 128, 128, false, true, "attn proj"},
      {1024, 512, 128, false, true, "fc"},           {1024, 128, 512, false, true, "proj"},
      {1024, 128, 512, false, false, "fc dx"},       {1024, 512, 128, false, false, "proj dx"},
      {1024, 128, 384, false, false, "qkv dx"},      {512, 128, 1024, true, false, "fc dW"},
      {128, 512, 1024, true, false, "proj dW"},      {384, 128, 1024, true, false, "qkv dW"},
      {128, 128, 1024, true, false, "attn proj dW"}};
  if (a_ab)
    std::printf("%-14s %5s %5s %5s %9s %9s %8s\n", "GFLOP/s", "m", "n", "k", "packed", "in place", "ratio");
  else
    std::printf("%-14s %5s %5s %5s %9s %9s %8s\n", "GFLOP/s", "m", "n", "k", "1 thread", "2 threads", "speed-up");
  for (const Product& p : products) {
    if ((!only.empty() && only != p.what) || (a_ab && p.ta)) continue;
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
