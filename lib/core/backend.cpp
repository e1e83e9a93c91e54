// The device hooks of core/backend.h: the installed table, and until one is installed the behaviour of a build
// without a device backend.
#include "core/backend.h"

#include "core/error.h"

#include <cstdlib>

namespace gt {
namespace {

[[noreturn]] void no_backend() {
  throw Error("this gputrain was built without the CUDA backend (configure with -DGPUTRAIN_CUDA=ON)");
}

void* host_pinned(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!p) throw Error(host_out_of_memory(bytes));
  return p;
}

DeviceHooks& hooks() {
  static DeviceHooks h{
      [](Device, size_t) -> void* { no_backend(); },
      [](Device, void*) {},
      [](Device, void*, size_t) { no_backend(); },
      [](void*, Device, const void*, Device, size_t) { no_backend(); },
      [](void*, Device, const void*, Device, size_t) { no_backend(); },
      host_pinned,
      [](void* p) { std::free(p); },
  };
  return h;
}

}  // namespace

bool install_device_hooks(const DeviceHooks& h) {
  hooks() = h;
  return true;
}

DeviceHooks device_hooks() { return hooks(); }

void* backend_alloc(Device device, size_t bytes) { return hooks().alloc(device, bytes); }
void backend_free(Device device, void* ptr) { hooks().free(device, ptr); }
void backend_memset_zero(Device device, void* ptr, size_t bytes) { hooks().memset_zero(device, ptr, bytes); }
void backend_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  hooks().copy(dst, dst_device, src, src_device, bytes);
}
void backend_copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  hooks().copy_async(dst, dst_device, src, src_device, bytes);
}
void* allocate_pinned(size_t bytes) { return hooks().allocate_pinned(bytes); }
void free_pinned(void* ptr) { hooks().free_pinned(ptr); }

}  // namespace gt
