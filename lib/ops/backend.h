// Device memory and synchronisation entry points that the CUDA backend provides.
// In a build without CUDA they fail with a message that says so.
#pragma once

#include "core/device.h"

#include <cstddef>
#include <string>
#include <vector>

namespace gt {

/// True when this binary was built with the CUDA backend.
bool cuda_built();
void* backend_alloc(Device device, size_t bytes);
void backend_free(Device device, void* ptr);
void backend_memset_zero(Device device, void* ptr, size_t bytes);
/// Synchronous copy (ordered after all work queued on the device's stream).
void backend_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
/// Queues a copy on the device's stream and returns at once; `host` must be pinned (allocate_pinned) and must not
/// be reused before backend_synchronize or a later synchronous copy.
void backend_copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
/// Waits for all work queued on the device.
void backend_synchronize(Device device);
/// Page-locked host memory (asynchronous copies read it directly); plain host memory in a build without CUDA.
void* allocate_pinned(size_t bytes);
void free_pinned(void* ptr);

/// A point in a device's stream: wait() returns once all work queued before the last record() has run. On the CPU
/// (and before any record) both are no-ops.
class StreamEvent {
 public:
  StreamEvent() = default;
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  void record(Device device);
  void wait();

 private:
  [[maybe_unused]] void* m_event = nullptr;  // unused in builds without CUDA
  [[maybe_unused]] Device m_device;
};

/// Timestamps on a device's stream for the profiler (CUDA events with timing): `record` queues one and returns its
/// number; `elapsed_ms(a, b)` waits for b and returns the device time from a to b; `clear` recycles them all.
/// Only for CUDA devices.
class DeviceClock {
 public:
  explicit DeviceClock(Device device) : m_device(device) {}
  ~DeviceClock();
  DeviceClock(const DeviceClock&) = delete;
  DeviceClock& operator=(const DeviceClock&) = delete;
  int record();
  double elapsed_ms(int from, int to);
  void clear() { m_used = 0; }

 private:
  Device m_device;
  std::vector<void*> m_events;
  size_t m_used = 0;
};

/// NVTX ranges (named spans that Nsight Systems shows on the CPU timeline); nothing in builds without CUDA.
void range_push(const char* name);
void range_pop();

/// A second stream on a CUDA device beside its compute stream (gt::cuda::stream), for work that overlaps the compute
/// stream's (the gradient all-reduce). The two are ordered only by the waits below, which the device keeps: the host
/// never blocks. Throws gt::Error in a build without CUDA.
class SideStream {
 public:
  explicit SideStream(Device device);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  /// The cudaStream_t, for libraries that queue on it (NCCL).
  void* handle() const { return m_stream; }
  /// Work queued here from now on runs after the work queued on the compute stream so far.
  void wait_for_compute();
  /// Work queued on the compute stream from now on runs after the work queued here so far.
  void join_compute();

 private:
  [[maybe_unused]] Device m_device;  // unused in builds without CUDA
  void* m_stream = nullptr;
  [[maybe_unused]] void* m_compute_done = nullptr;
  [[maybe_unused]] void* m_side_done = nullptr;
};

/// What the caching allocator of a device holds (all zero for the CPU).
struct DeviceMemoryStats {
  size_t in_use = 0, peak = 0, reserved = 0, allocations = 0;
};
DeviceMemoryStats device_memory_stats(Device device);

/// Names what is being allocated, for out-of-memory messages ("activations of conv1"), on this thread while the
/// label lives.
class AllocLabel {
 public:
  explicit AllocLabel(std::string what);
  ~AllocLabel();
  AllocLabel(const AllocLabel&) = delete;
  AllocLabel& operator=(const AllocLabel&) = delete;
  /// The innermost label, or "a tensor" when none is set.
  static const std::string& current();

 private:
  std::string m_previous;
};

}  // namespace gt
