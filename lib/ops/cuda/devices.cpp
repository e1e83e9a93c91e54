// The CUDA half of the device report (ops/devices.h): driver, runtime and library versions, and each device.
#include "ops/devices.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <fmt/format.h>
#include <nccl.h>

namespace gt {

CudaInfo query_cuda() {
  CudaInfo info;
  info.built = true;
  cudaRuntimeGetVersion(&info.runtime_version);
  cudaDriverGetVersion(&info.driver_version);
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
    info.cublas_version = major * 10000 + minor * 100 + patch;
  info.cudnn_version = cudnnGetVersion();
  ncclGetVersion(&info.nccl_version);

  if (info.driver_version == 0) {
    info.problem = "no NVIDIA driver is loaded (libcuda.so.1 not found)";
    return info;
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    info.problem = fmt::format("no usable CUDA device: {}", cudaGetErrorString(status));
    cudaGetLastError();
    return info;
  }
  if (count == 0) {
    info.problem = "the driver reports no CUDA device (check CUDA_VISIBLE_DEVICES)";
    return info;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    CudaDeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.memory_total = prop.totalGlobalMem;
    d.cc_major = prop.major;
    d.cc_minor = prop.minor;
    d.sm_count = prop.multiProcessorCount;
    int clock_khz = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, i);
    d.clock_mhz = clock_khz / 1000;
    char bus[32] = {};
    cudaDeviceGetPCIBusId(bus, sizeof bus, i);
    d.pci_bus_id = bus;
    if (cudaSetDevice(i) == cudaSuccess) cudaMemGetInfo(&d.memory_free, &d.memory_total);
    info.devices.push_back(d);
  }
  for (auto& d : info.devices)
    for (const auto& other : info.devices) {
      int can = 0;
      if (other.index != d.index && cudaDeviceCanAccessPeer(&can, d.index, other.index) == cudaSuccess && can)
        d.peers.push_back(other.index);
    }
  cudaGetLastError();
  return info;
}

}  // namespace gt
