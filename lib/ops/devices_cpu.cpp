// CPU half of the device report: model name, core count, SIMD level and BLAS configuration.
#include "ops/devices.h"

#include "core/half.h"
#include "ops/cpu/bf16_gemm.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/sgemm.h"
#include "ops/epilogue.h"

#include <cblas.h>
#include <fmt/format.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <fstream>
#include <optional>
#include <thread>

namespace gt {

CpuInfo query_cpu() {
  CpuInfo info;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      info.model = line.substr(line.find(':') + 2);
      break;
    }
  }
  if (info.model.empty()) info.model = "unknown CPU";
  info.cores = static_cast<int>(std::thread::hardware_concurrency());
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f"))
    info.simd = "avx512f";
  else if (__builtin_cpu_supports("avx2"))
    info.simd = __builtin_cpu_supports("fma") ? "avx2+fma" : "avx2";
  else if (__builtin_cpu_supports("avx"))
    info.simd = "avx";
  else if (__builtin_cpu_supports("sse4.2"))
    info.simd = "sse4.2";
  else
    info.simd = "baseline";
  info.blas = std::string(openblas_get_config()) + ", core " + openblas_get_corename();
  info.sgemm_path = cpu::describe(cpu::cpu_sgemm_path());
  const CpuHalfSupport h = query_cpu_half();
  auto mark = [](bool has, const char* name) { return fmt::format("{}{}", has ? "" : "no ", name); };
  info.half = fmt::format("{}, {}, {}, {}", mark(h.f16c, "f16c"), mark(h.avx512_bf16, "avx512_bf16"),
                          mark(h.avx512_fp16, "avx512_fp16"), mark(h.amx_bf16, "amx_bf16"));
  info.bf16_path = cpu::describe(cpu::cpu_bf16_path());
  switch (cpu::cpu_isa()) {
    case cpu::CpuIsa::avx512: info.kernel_isa = "AVX-512 (x86-64-v4)"; break;
    case cpu::CpuIsa::avx2: info.kernel_isa = "AVX2+FMA (x86-64-v3)"; break;
    case cpu::CpuIsa::baseline: info.kernel_isa = "baseline x86-64 (SSE2)"; break;
  }
  const std::optional<cpu::CpuConvAlgo> conv = cpu::env_cpu_conv_algo();
  info.conv_algo = !conv ? fmt::format(
                               "Winograd F(2x2,3x3) for 3x3 stride-1 layers of {}+ channels and at most {} "
                               "output tiles per image, else im2col",
                               cpu::kWinogradMinChannels, cpu::kWinogradMaxTiles)
                   : *conv == cpu::CpuConvAlgo::winograd ? "Winograd F(2x2,3x3) (GPUTRAIN_CPU_CONV=winograd)"
                                                         : "im2col (GPUTRAIN_CPU_CONV=im2col)";
  info.fusion = cpu::env_cpu_fusion()
                    ? "batch norm -> 2x2 max pool -> relu (or a part), and 2x2 max pool -> relu, in one pass each; "
                      "dense -> relu or GELU (tanh), and dense or attention -> residual add, on each block of the "
                      "product as it is finished"
                    : "off (GPUTRAIN_CPU_FUSE=off): every layer alone";
  return info;
}

CpuHalfSupport query_cpu_half() {
  CpuHalfSupport h;
#if defined(__x86_64__) || defined(__i386__)
  // By CPUID leaf rather than __builtin_cpu_supports, whose names for these (avx512bf16, amx-bf16) clang 14 lacks.
  __builtin_cpu_init();
  h.f16c = half_bulk_f16c();
  const bool avx512 = __builtin_cpu_supports("avx512f");  // (which also says the OS saves the AVX-512 state)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    h.avx512_fp16 = avx512 && (d >> 23 & 1u);
    h.amx_bf16 = (d >> 22 & 1u) != 0;
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) h.avx512_bf16 = avx512 && (a >> 5 & 1u);
#endif
  return h;
}

std::string format_cuda_version(int v) {
  if (v <= 0) return "not found";
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

}  // namespace gt
