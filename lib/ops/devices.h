// What compute devices this machine has, and which CUDA libraries were found: the `gputrain devices` report.
#pragma once

#include "core/device.h"
#include "ops/precision.h"

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace gt {

struct CpuInfo {
  std::string model;
  int cores = 0;           ///< logical CPUs available to this process
  std::string simd;        ///< best vector extension the CPU reports (avx512f, avx2, sse4.2, …)
  std::string blas;        ///< BLAS library and its configuration
  std::string sgemm_path;  ///< which kernels multiply f32 matrices (ops/cpu/sgemm.h's describe)
  std::string half;        ///< the bf16/fp16 instruction sets the CPU has and lacks, as `gputrain devices` prints them
  std::string bf16_path;   ///< how train.precision bf16 multiplies on this CPU (ops/cpu/bf16_gemm.h's describe)
  std::string kernel_isa;  ///< the instruction set the other kernels' hot loops run (ops/cpu/isa.h)
  std::string conv_algo;   ///< how 3×3 stride-1 convolutions multiply (ops/cpu/conv_algo.h)
  std::string fusion;      ///< which layer chains run fused (graph/model.h's Model::chains, GPUTRAIN_CPU_FUSE)
};

/// The CPU's 16-bit float instructions (CPUID, checked at run time): F16C converts fp16 ⇄ f32 (vcvtph2ps/vcvtps2ph);
/// AVX-512 BF16 has bf16 dot products (vdpbf16ps); AVX512-FP16 fp16 arithmetic; AMX-BF16 bf16 tile products.
struct CpuHalfSupport {
  bool f16c = false, avx512_bf16 = false, avx512_fp16 = false, amx_bf16 = false;
};
CpuHalfSupport query_cpu_half();

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  size_t memory_total = 0, memory_free = 0;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int clock_mhz = 0;
  std::string pci_bus_id;
  std::vector<int> peers;  ///< devices this one can read and write directly (NVLink or PCIe peer access)
};

struct CudaInfo {
  bool built = false;      ///< this binary contains the CUDA backend
  int driver_version = 0;  ///< 0 when no driver is loaded
  int runtime_version = 0;
  int cublas_version = 0;
  size_t cudnn_version = 0;
  int nccl_version = 0;
  std::string problem;  ///< why no device is usable, in words; empty when devices were found
  std::vector<CudaDeviceInfo> devices;
};

CpuInfo query_cpu();
CudaInfo query_cuda();

/// The device a config's `device` names: cpu; auto (cuda:0 when one is usable, else the CPU); cuda or cuda:N, which
/// must be usable. `reason` says why, for the log. Throws gt::Error (exit 1) when the device asked for cannot be
/// used: no GPU, an index past the visible ones, or a GPU older than this build's kernels.
Device resolve_device(const std::string& requested, std::string& reason);

/// Dense peak arithmetic rate of one GPU model in TFLOP/s, from the vendor's data sheets (boost clock, SXM where a
/// model has several forms and the name does not say): fp32 on the CUDA cores (what gputrain's fp32 training runs
/// on), tf32 and bf16 on the tensor cores without sparsity (the data sheets' starred figures are twice these). 0
/// where the GPU has no such tensor-core format (V100 and T4: no bf16 or tf32).
struct PeakTflops {
  double fp32 = 0, tf32 = 0, bf16 = 0;
  /// The peak a run's matrix products meet at `train.precision`: fp32, tf32, or bf16 for bf16 and fp16 (every GPU
  /// in the table multiplies fp16 with fp32 sums at its bf16 rate). 0 when the GPU has none.
  double at(Precision p) const;
};
/// The peak of the GPU that `name` (as the driver reports it, "NVIDIA H100 80GB HBM3") describes; nullopt for a
/// model the table does not know, so that nobody is shown a percentage of a guessed peak.
std::optional<PeakTflops> known_peak(const std::string& name);

/// Formats a CUDA-style version number (12040 → "12.4", 90100 → "9.1.0" for cuDNN) for people.
std::string format_cuda_version(int v);

}  // namespace gt
