// What the GPU/host monitor costs the training loop: 512x512 GEMMs timed with the monitor off and on (sampling
// every 0.1 s, ten times the default rate, through the fake NVML unless GT_NVML_LIBRARY says otherwise), and the
// sampler's own CPU time per sample, projected onto the default 1 s interval (the share of one core it takes,
// the most it can slow a loop down). Prints one JSON line.
// Usage: bench_monitor_cost [ROUNDS] [THREADS] [INTERVAL_S]
#include "core/parallel.h"
#include "core/tensor.h"
#include "log/gpu_monitor.h"
#include "log/logging.h"
#include "ops/matmul.h"
#include "timing.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>

namespace {

using gt::bench::Clock;
using gt::bench::median;
using gt::bench::since;

double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 21;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const double interval = argc > 3 ? std::atof(argv[3]) : 0.1;
#ifdef GT_FAKE_NVML_LIB
  setenv("GT_NVML_LIBRARY", GT_FAKE_NVML_LIB, 0);  // keeps a GT_NVML_LIBRARY that is already set
  setenv("FAKE_NVML_GPUS", "8", 0);                // an 8-GPU node: the most work one sample does
#endif
  spdlog::set_level(spdlog::level::warn);  // the fake's scripted values must not print while timing
  gt::set_num_threads(threads);
  constexpr int64_t n = 512;
  constexpr int gemms = 20;  // per timed block: long enough (~0.1-0.5 s) to span samples
  gt::Tensor a = gt::Tensor::empty(gt::Shape{n, n}, gt::DType::f32);
  gt::Tensor b = gt::Tensor::empty(gt::Shape{n, n}, gt::DType::f32);
  gt::Tensor c = gt::Tensor::zeros(gt::Shape{n, n}, gt::DType::f32);
  for (int64_t i = 0; i < n * n; ++i) {
    a.data<float>()[i] = static_cast<float>(i % 7) * 0.1f;
    b.data<float>()[i] = static_cast<float>(i % 5) * 0.2f;
  }
  std::vector<gt::GpuTarget> gpus;
  for (int g = 0; g < 8; ++g) gpus.push_back({g, ""});

  auto block = [&] {
    const auto t0 = Clock::now();
    for (int i = 0; i < gemms; ++i) gt::ops::matmul(a, false, b, false, c, 0.0);
    return since(t0) / gemms;
  };
  block();  // warm-up: thread pool, page faults

  // Off and on alternate so that the neighbours' load on a shared machine hits both alike.
  std::vector<double> off, on;
  uint64_t samples = 0;
  for (int r = 0; r < rounds; ++r) {
    off.push_back(block());
    gt::GpuMonitor monitor(gpus, interval);
    monitor.start();
    monitor.wait_newer(0, std::chrono::seconds(5));  // NVML opened: time the steady state, not the start
    on.push_back(block());
    samples += monitor.latest().seq;
  }

  // The sampler's CPU time per sample, measured while this thread sleeps: an upper bound, since idle OpenMP and
  // BLAS workers still spinning after the GEMMs count too.
  gt::GpuMonitor idle(gpus, 0.01);
  idle.start();
  idle.wait_newer(0, std::chrono::seconds(5));
  const double cpu0 = process_cpu_s();
  const uint64_t seq0 = idle.latest().seq;
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double cpu1 = process_cpu_s();
  const uint64_t seq1 = idle.latest().seq;
  const bool gpu_on = idle.gpu_metrics_on();
  idle.stop();
  const double per_sample_s = seq1 > seq0 ? (cpu1 - cpu0) / static_cast<double>(seq1 - seq0) : 0.0;

  // Medians, and minima: on a shared machine the neighbours' noise is larger than the sampler, and the fastest
  // block of each kind is the one least disturbed by them.
  const double t_off = median(off), t_on = median(on);
  const double min_off = *std::min_element(off.begin(), off.end()), min_on = *std::min_element(on.begin(), on.end());
  std::printf(
      "{\"gemm_n\": %lld, \"threads\": %d, \"rounds\": %d, \"interval_s\": %.3f, \"gpus\": %zu, "
      "\"nvml\": %s, \"samples_during_on\": %llu, \"off_ms_per_gemm\": %.3f, \"on_ms_per_gemm\": %.3f, "
      "\"on_over_off\": %.4f, \"min_on_over_min_off\": %.4f, \"sampler_cpu_us_per_sample\": %.1f, "
      "\"projected_share_at_1s\": %.6f}\n",
      static_cast<long long>(n), threads, rounds, interval, gpus.size(), gpu_on ? "true" : "false",
      static_cast<unsigned long long>(samples), 1e3 * t_off, 1e3 * t_on, t_on / t_off, min_on / min_off,
      1e6 * per_sample_s, per_sample_s / 1.0);
  return 0;
}
