// Tensor storage on devices other than the CPU. Core cannot call up into ops/, so the device side is a table of
// functions that core owns (DeviceHooks) and a device backend fills: ops/cuda/backend.cpp installs CUDA's at static
// initialisation. Its object is linked wherever CUDA runs (ops/cuda/context.cpp, which every CUDA op's stream comes
// from, refers to it), so the installation cannot be dropped by the linker as an unreferenced registrar would be.
// Until a backend is installed (a build without CUDA) any device but the CPU is refused with a message saying the
// build has no CUDA, and pinned memory is plain host memory. The report of a device's memory (device_memory_stats)
// is not core's business: it is ops/device_memory.h.
#pragma once

#include "core/device.h"
#include "core/noncopyable.h"

#include <cstddef>
#include <string>

namespace gt {

/// What Tensor storage needs from the backend of a device that is not the CPU; every member is set.
struct DeviceHooks {
  void* (*alloc)(Device device, size_t bytes);
  void (*free)(Device device, void* ptr);
  void (*memset_zero)(Device device, void* ptr, size_t bytes);
  void (*copy)(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
  void (*copy_async)(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
  void* (*allocate_pinned)(size_t bytes);
  void (*free_pinned)(void* ptr);
};

/// Makes `hooks` the device backend for every later call (at static initialisation, before any tensor exists);
/// returns true, so that it can initialise a variable.
bool install_device_hooks(const DeviceHooks& hooks);
/// The hooks in use (a test that installs its own restores these after).
DeviceHooks device_hooks();

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

/// Names what is being allocated, for out-of-memory messages ("activations of conv1"), on this thread while the
/// label lives.
class AllocLabel : NonCopyable {
 public:
  explicit AllocLabel(std::string what);
  ~AllocLabel();
  /// The innermost label, or "a tensor" when none is set.
  static const std::string& current();
  /// The innermost label that an exception unwound since the last call ("" when none), on any thread: what a
  /// std::bad_alloc from a container (not allocate_storage, which names its label itself) was allocating.
  static std::string take_unwound();

 private:
  std::string m_previous;
  int m_exceptions = 0;  ///< std::uncaught_exceptions() when made: more when destroyed means unwinding
};

/// The one line a host allocation of `bytes` that failed throws as gt::Error: the size, what it was for
/// (`what`, else AllocLabel::current()) and, under an address-space limit (ulimit -v), that limit. `bytes` 0: a size
/// not known (a std::bad_alloc).
std::string host_out_of_memory(size_t bytes, const std::string& what = "");

}  // namespace gt
