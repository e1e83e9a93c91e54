// Device memory, copies and the CUDA half of the device report, for builds with the CUDA backend.
#include "ops/backend.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/devices.h"

#include <cudnn.h>
#include <nccl.h>

namespace gt {

bool cuda_built() { return true; }

void* backend_alloc(Device device, size_t bytes) {
  GT_CHECK_CUDA(cudaSetDevice(device.index));
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes ? bytes : 1);
  if (status != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    throw Error(fmt::format("out of memory on {} allocating {} bytes ({} of {} bytes free): {}", device.str(), bytes,
                            free_b, total_b, cudaGetErrorString(status)));
  }
  return p;
}

void backend_free(Device device, void* ptr) {
  // Destructors only log; a failing free at exit must not throw.
  if (cudaSetDevice(device.index) == cudaSuccess) cudaFree(ptr);
}

void backend_memset_zero(Device device, void* ptr, size_t bytes) {
  GT_CHECK_CUDA(cudaSetDevice(device.index));
  GT_CHECK_CUDA(cudaMemset(ptr, 0, bytes));
}

void backend_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  const Device active = dst_device.is_cuda() ? dst_device : src_device;
  GT_CHECK_CUDA(cudaSetDevice(active.index));
  GT_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

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
  return info;
}

}  // namespace gt
