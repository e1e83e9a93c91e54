// The device hooks of core/backend.h for builds with the CUDA backend (the caching allocator, copies and memsets
// queued on the device's stream, page-locked host memory), installed at static initialisation; and the device memory
// report of ops/device_memory.h.
#include "core/backend.h"
#include "ops/device_memory.h"

#include "core/error.h"
#include "ops/cuda/allocator.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"

#include <cstdlib>

namespace gt {
namespace {

void* cuda_alloc(Device device, size_t bytes) { return cuda::device_alloc(device.index, bytes); }

void cuda_free(Device device, void* ptr) { cuda::device_free(device.index, ptr); }

void cuda_memset_zero(Device device, void* ptr, size_t bytes) {
  GT_CHECK_CUDA(cudaMemsetAsync(ptr, 0, bytes, cuda::stream(device.index)));
}

void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  // Between two devices, the source's queued work must be done before the destination's stream reads it.
  if (src_device.is_cuda() && dst_device.is_cuda() && src_device.index != dst_device.index)
    GT_CHECK_CUDA(cudaStreamSynchronize(cuda::stream(src_device.index)));
  const Device active = dst_device.is_cuda() ? dst_device : src_device;
  const cudaStream_t s = cuda::stream(active.index);
  GT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  // The host side is pageable and may be read or reused right after: wait. Device to device stays queued.
  if (dst_device.is_cpu() || src_device.is_cpu()) GT_CHECK_CUDA(cudaStreamSynchronize(s));
}

void cuda_copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  const Device active = dst_device.is_cuda() ? dst_device : src_device;
  GT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda::stream(active.index)));
}

void* cuda_allocate_pinned(size_t bytes) {
  void* p = nullptr;
  // Without a usable device (a CUDA build on a machine with no GPU) page-locking fails: plain memory then.
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) == cudaSuccess) return p;
  cudaGetLastError();
  p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!p) throw Error(host_out_of_memory(bytes));
  return p;
}

void cuda_free_pinned(void* ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) == cudaSuccess && attr.type == cudaMemoryTypeHost)
    cudaFreeHost(ptr);
  else {
    cudaGetLastError();
    std::free(ptr);
  }
}

}  // namespace

namespace cuda {
const bool g_device_hooks_installed = install_device_hooks(DeviceHooks{
    cuda_alloc, cuda_free, cuda_memset_zero, cuda_copy, cuda_copy_async, cuda_allocate_pinned, cuda_free_pinned});
}  // namespace cuda

DeviceMemoryStats device_memory_stats(Device device) {
  if (!device.is_cuda()) return {};
  const cuda::MemoryStats m = cuda::memory_stats(device.index);
  return {m.in_use, m.peak, m.reserved, m.allocations};
}

size_t device_free_bytes(Device device) {
  if (!device.is_cuda()) return 0;
  GT_CHECK_CUDA(cudaSetDevice(device.index));
  size_t free_b = 0, total_b = 0;
  GT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const cuda::MemoryStats m = cuda::memory_stats(device.index);
  return free_b + (m.reserved > m.in_use ? m.reserved - m.in_use : 0);
}

}  // namespace gt
