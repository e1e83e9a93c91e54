// Device memory, copies and the CUDA half of the device report, for builds with the CUDA backend.
#include "ops/backend.h"
#include "core/error.h"
#include "ops/cuda/allocator.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/devices.h"

#include <cudnn.h>
#include <nccl.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstdlib>

namespace gt {

bool cuda_built() { return true; }

void* backend_alloc(Device device, size_t bytes) { return cuda::device_alloc(device.index, bytes); }

void backend_free(Device device, void* ptr) { cuda::device_free(device.index, ptr); }

void backend_memset_zero(Device device, void* ptr, size_t bytes) {
  GT_CHECK_CUDA(cudaMemsetAsync(ptr, 0, bytes, cuda::stream(device.index)));
}

void backend_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  // Between two devices, the source's queued work must be done before the destination's stream reads it.
  if (src_device.is_cuda() && dst_device.is_cuda() && src_device.index != dst_device.index)
    GT_CHECK_CUDA(cudaStreamSynchronize(cuda::stream(src_device.index)));
  const Device active = dst_device.is_cuda() ? dst_device : src_device;
  const cudaStream_t s = cuda::stream(active.index);
  GT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  // The host side is pageable and may be read or reused right after: wait. Device to device stays queued.
  if (dst_device.is_cpu() || src_device.is_cpu()) GT_CHECK_CUDA(cudaStreamSynchronize(s));
}

void backend_copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  const Device active = dst_device.is_cuda() ? dst_device : src_device;
  GT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda::stream(active.index)));
}

void backend_synchronize(Device device) {
  if (device.is_cuda()) GT_CHECK_CUDA(cudaStreamSynchronize(cuda::stream(device.index)));
}

void* allocate_pinned(size_t bytes) {
  void* p = nullptr;
  // Without a usable device (a CUDA build on a machine with no GPU) page-locking fails: plain memory then.
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) == cudaSuccess) return p;
  cudaGetLastError();
  p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!p) throw Error(fmt::format("out of host memory allocating {} bytes", bytes));
  return p;
}

void free_pinned(void* ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) == cudaSuccess && attr.type == cudaMemoryTypeHost)
    cudaFreeHost(ptr);
  else {
    cudaGetLastError();
    std::free(ptr);
  }
}

StreamEvent::~StreamEvent() {
  if (m_event && cudaSetDevice(m_device.index) == cudaSuccess) cudaEventDestroy(static_cast<cudaEvent_t>(m_event));
}

void StreamEvent::record(Device device) {
  if (device.is_cpu()) return;
  if (m_event && !(device == m_device)) {
    cudaEventDestroy(static_cast<cudaEvent_t>(m_event));
    m_event = nullptr;
  }
  m_device = device;
  const cudaStream_t s = cuda::stream(device.index);
  if (!m_event) {
    cudaEvent_t e = nullptr;
    GT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    m_event = e;
  }
  GT_CHECK_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(m_event), s));
}

void StreamEvent::wait() {
  if (m_event) GT_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(m_event)));
}

DeviceClock::~DeviceClock() {
  if (m_events.empty() || cudaSetDevice(m_device.index) != cudaSuccess) return;
  for (void* e : m_events) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

int DeviceClock::record() {
  const cudaStream_t s = cuda::stream(m_device.index);  // makes the device current
  if (m_used == m_events.size()) {
    cudaEvent_t e = nullptr;
    GT_CHECK_CUDA(cudaEventCreate(&e));  // with timing
    m_events.push_back(e);
  }
  GT_CHECK_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(m_events[m_used]), s));
  return static_cast<int>(m_used++);
}

double DeviceClock::elapsed_ms(int from, int to) {
  GT_CHECK(from >= 0 && to >= 0 && static_cast<size_t>(std::max(from, to)) < m_used, "device timestamps {} and {}",
           from, to);
  const auto end = static_cast<cudaEvent_t>(m_events[static_cast<size_t>(to)]);
  GT_CHECK_CUDA(cudaEventSynchronize(end));
  float ms = 0;
  GT_CHECK_CUDA(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(m_events[static_cast<size_t>(from)]), end));
  return ms;
}

void range_push(const char* name) { nvtxRangePushA(name); }
void range_pop() { nvtxRangePop(); }

SideStream::SideStream(Device device) : m_device(device) {
  GT_CHECK(device.is_cuda(), "a side stream needs a CUDA device, not {}", device.str());
  GT_CHECK_CUDA(cudaSetDevice(device.index));
  cudaStream_t s = nullptr;
  // Non-blocking: the synchronous copies on the legacy default stream (Tensor::copy_from to the host) must not wait
  // for a long all-reduce here; the compute stream meets this one only through join_compute.
  GT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  m_stream = s;
  cudaEvent_t a = nullptr, b = nullptr;
  GT_CHECK_CUDA(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
  GT_CHECK_CUDA(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
  m_compute_done = a;
  m_side_done = b;
}

SideStream::~SideStream() {
  if (cudaSetDevice(m_device.index) != cudaSuccess) return;
  // Destroying a stream with queued work is allowed (it finishes first); the events go with it.
  cudaStreamDestroy(static_cast<cudaStream_t>(m_stream));
  cudaEventDestroy(static_cast<cudaEvent_t>(m_compute_done));
  cudaEventDestroy(static_cast<cudaEvent_t>(m_side_done));
}

void SideStream::wait_for_compute() {
  // An event may be recorded again at once: cudaStreamWaitEvent has taken the state of its last record.
  const auto e = static_cast<cudaEvent_t>(m_compute_done);
  GT_CHECK_CUDA(cudaEventRecord(e, cuda::stream(m_device.index)));
  GT_CHECK_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(m_stream), e, 0));
}

void SideStream::join_compute() {
  const auto e = static_cast<cudaEvent_t>(m_side_done);
  GT_CHECK_CUDA(cudaEventRecord(e, static_cast<cudaStream_t>(m_stream)));
  GT_CHECK_CUDA(cudaStreamWaitEvent(cuda::stream(m_device.index), e, 0));
}

DeviceMemoryStats device_memory_stats(Device device) {
  if (!device.is_cuda()) return {};
  const cuda::MemoryStats m = cuda::memory_stats(device.index);
  return {m.in_use, m.peak, m.reserved, m.allocations};
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
