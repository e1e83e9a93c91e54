// Which instruction set the CPU kernels' hot loops run (ops/cpu/isa.h).
#include "ops/cpu/isa.h"

#include "core/env.h"
#include "core/error.h"

#include <array>
#include <atomic>

namespace gt::cpu {
namespace {

std::atomic<int> g_forced{-1};  // a CpuIsa, or -1: the best

}  // namespace

namespace detail {
thread_local uint64_t t_kernel_calls[3] = {};
}  // namespace detail

uint64_t cpu_kernel_calls(CpuIsa isa) { return detail::t_kernel_calls[static_cast<int>(isa)]; }

std::string to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512: return "avx512";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::baseline: return "baseline";
  }
  return "baseline";
}

CpuIsa best_cpu_isa() {
#if defined(__x86_64__)
  static const CpuIsa best = [] {
    __builtin_cpu_init();
    // (avx512f also says the OS saves the AVX-512 state; clang 14 knows no names for the psABI levels, nor f16c,
    // movbe or lzcnt, which every CPU with AVX2 and BMI2 has.)
    const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
                    __builtin_cpu_supports("bmi2");
    const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                    __builtin_cpu_supports("avx512vl");
    return v4 ? CpuIsa::avx512 : v3 ? CpuIsa::avx2 : CpuIsa::baseline;
  }();
  return best;
#else
  return CpuIsa::baseline;
#endif
}

CpuIsa env_cpu_isa() {
  static const CpuIsa isa = [] {
    const std::optional<size_t> choice = env_choice("GPUTRAIN_CPU_ISA", {"avx512", "avx2", "baseline"});
    if (!choice) return best_cpu_isa();
    const CpuIsa want = std::array{CpuIsa::avx512, CpuIsa::avx2, CpuIsa::baseline}[*choice];
    if (static_cast<int>(want) > static_cast<int>(best_cpu_isa()))
      throw Error("GPUTRAIN_CPU_ISA=" + to_string(want) +
                  ": this CPU lacks the instructions it needs (its widest: " + to_string(best_cpu_isa()) + ")");
    return want;
  }();
  return isa;
}

CpuIsa cpu_isa() {
  const int forced = g_forced.load(std::memory_order_relaxed);
  return forced < 0 ? env_cpu_isa() : static_cast<CpuIsa>(forced);
}

bool force_cpu_isa(std::optional<CpuIsa> isa) {
  if (isa && static_cast<int>(*isa) > static_cast<int>(best_cpu_isa())) return false;
  g_forced.store(isa ? static_cast<int>(*isa) : -1, std::memory_order_relaxed);
  return true;
}

}  // namespace gt::cpu
