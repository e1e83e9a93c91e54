// The seam between core and the device backends (core/backend.h): Tensor storage on a device that is not the CPU
// goes through the installed DeviceHooks, whichever backend installed them.
#include "core/backend.h"
#include "core/tensor.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <vector>

using namespace gt;

namespace {

// A stand-in device whose memory is host memory, counting what Tensor asks of it.
struct Calls {
  int alloc = 0, free = 0, memset_zero = 0, copy = 0;
};
Calls g_calls;

DeviceHooks host_as_device() {
  DeviceHooks h = device_hooks();  // pinned memory as the build has it
  h.alloc = [](Device, size_t bytes) -> void* {
    ++g_calls.alloc;
    return std::malloc(bytes ? bytes : 1);
  };
  h.free = [](Device, void* p) {
    ++g_calls.free;
    std::free(p);
  };
  h.memset_zero = [](Device, void* p, size_t bytes) {
    ++g_calls.memset_zero;
    std::memset(p, 0, bytes);
  };
  h.copy = [](void* dst, Device, const void* src, Device, size_t bytes) {
    ++g_calls.copy;
    std::memcpy(dst, src, bytes);
  };
  h.copy_async = h.copy;
  return h;
}

}  // namespace

TEST_CASE("device hooks: Tensor storage off the CPU goes through the installed hooks, and only there", "[cpu]") {
  const DeviceHooks previous = device_hooks();
  install_device_hooks(host_as_device());
  g_calls = {};
  {
    Tensor host = Tensor::empty(Shape{3}, DType::f32, Device::cpu());
    const std::vector<float> values{1.5f, -2.0f, 3.25f};
    std::memcpy(host.data<float>(), values.data(), sizeof(float) * values.size());
    Tensor dev = Tensor::zeros(Shape{3}, DType::f32, Device::cuda(0));
    dev.copy_from(host);
    Tensor back = Tensor::zeros(Shape{3}, DType::f32, Device::cpu());
    back.copy_from(dev);
    for (size_t i = 0; i < values.size(); ++i) CHECK(back.data<float>()[i] == values[i]);
    CHECK(g_calls.alloc == 1);  // the CPU tensors never reach the hooks
    CHECK(g_calls.memset_zero == 1);
    CHECK(g_calls.copy == 2);
    CHECK(g_calls.free == 0);
  }
  CHECK(g_calls.free == 1);
  install_device_hooks(previous);
}
