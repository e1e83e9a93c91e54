// Device memory and synchronisation entry points that the CUDA backend provides.
// In a build without CUDA they fail with a message that says so.
#pragma once

#include "core/device.h"

#include <cstddef>

namespace gt {

/// True when this binary was built with the CUDA backend.
bool cuda_built();
void* backend_alloc(Device device, size_t bytes);
void backend_free(Device device, void* ptr);
void backend_memset_zero(Device device, void* ptr, size_t bytes);
void backend_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

}  // namespace gt
