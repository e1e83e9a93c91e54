// CPU half of the device report: model name, core count, SIMD level and BLAS configuration.
#include "ops/devices.h"

#include <cblas.h>

#include <fstream>
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
  return info;
}

std::string format_cuda_version(int v) {
  if (v <= 0) return "not found";
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

}  // namespace gt
