// What a device's memory holds and has left, for the step log and the loader's sizing: defined by the device
// backend (ops/cuda/backend.cpp, or ops/no_cuda.cpp in a build without CUDA, where every number is zero).
#pragma once

#include "core/device.h"

#include <cstddef>

namespace gt {

/// What the caching allocator of a device holds (all zero for the CPU).
struct DeviceMemoryStats {
  size_t in_use = 0, peak = 0, reserved = 0, allocations = 0;
};
DeviceMemoryStats device_memory_stats(Device device);
/// Bytes a device could still hand out: the driver's free memory plus what the caching allocator holds unused (0 for
/// the CPU and in a build without CUDA).
size_t device_free_bytes(Device device);

}  // namespace gt
