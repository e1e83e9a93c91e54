// The device memory hooks that Tensor storage calls for non-CPU devices. Core declares them; the device backend
// defines them (ops/cuda/backend.cpp, or ops/no_cuda.cpp in a build without CUDA, where each says so), so core
// needs nothing from the layers above it.
#pragma once

#include "core/device.h"
#include "core/noncopyable.h"

#include <cstddef>
#include <string>

namespace gt {

void* backend_alloc(Device device, size_t bytes);
void backend_free(Device device, void* ptr);
void backend_memset_zero(Device device, void* ptr, size_t bytes);
/// Synchronous copy (ordered after all work queued on the device's stream).
void backend_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
/// Queues a copy on the device's stream and returns at once; `host` must be pinned (allocate_pinned) and must not
/// be reused before a later synchronous copy (or an event recorded after this one) says it is done.
void backend_copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
/// Page-locked host memory (asynchronous copies read it directly); plain host memory in a build without CUDA.
void* allocate_pinned(size_t bytes);
void free_pinned(void* ptr);

/// What the caching allocator of a device holds (all zero for the CPU).
struct DeviceMemoryStats {
  size_t in_use = 0, peak = 0, reserved = 0, allocations = 0;
};
DeviceMemoryStats device_memory_stats(Device device);
/// Bytes a device could still hand out: the driver's free memory plus what the caching allocator holds unused (0 for
/// the CPU and in a build without CUDA).
size_t device_free_bytes(Device device);

/// Names what is being allocated, for out-of-memory messages ("activations of conv1"), on this thread while the
/// label lives.
class AllocLabel : NonCopyable {
 public:
  explicit AllocLabel(std::string what);
  ~AllocLabel();
  /// The innermost label, or "a tensor" when none is set.
  static const std::string& current();

 private:
  std::string m_previous;
};

}  // namespace gt
