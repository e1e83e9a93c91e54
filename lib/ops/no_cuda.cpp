// What stands in for ops/cuda/ in a build without the CUDA backend: the device memory hooks of core/backend.h and
// the stream classes of ops/stream.h say for any device but the CPU that CUDA is not built in; pinned memory is
// plain host memory; the device report has no devices.
#include "core/backend.h"
#include "core/error.h"
#include "ops/devices.h"
#include "ops/stream.h"

#include <cstdlib>

namespace gt {
namespace {
[[noreturn]] void no_cuda() {
  throw Error("this gputrain was built without the CUDA backend (configure with -DGPUTRAIN_CUDA=ON)");
}
}  // namespace

void* backend_alloc(Device, size_t) { no_cuda(); }
void backend_free(Device, void*) {}
void backend_memset_zero(Device, void*, size_t) { no_cuda(); }
void backend_copy(void*, Device, const void*, Device, size_t) { no_cuda(); }
void backend_copy_async(void*, Device, const void*, Device, size_t) { no_cuda(); }
void* allocate_pinned(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!p) throw Error(fmt::format("out of host memory allocating {} bytes", bytes));
  return p;
}
void free_pinned(void* ptr) { std::free(ptr); }
DeviceMemoryStats device_memory_stats(Device) { return {}; }
size_t device_free_bytes(Device) { return 0; }
StreamEvent::~StreamEvent() = default;
DeviceClock::~DeviceClock() = default;
int DeviceClock::record() { throw Error("device timestamps need a build with the CUDA backend"); }
double DeviceClock::elapsed_ms(int, int) { throw Error("device timestamps need a build with the CUDA backend"); }
void range_push(const char*) {}
void range_pop() {}
void StreamEvent::record(Device device) {
  if (!device.is_cpu()) no_cuda();
}
void StreamEvent::wait() {}
SideStream::SideStream(Device device) : m_device(device) { no_cuda(); }
SideStream::~SideStream() = default;
void SideStream::wait_for_compute() {}
void SideStream::join_compute() {}
void SideStream::wait(const StreamEvent&) {}
void SideStream::record(StreamEvent&) {}
void SideStream::copy(Tensor&, const Tensor&) {}
StepGraph::StepGraph(Device device) : m_device(device) { no_cuda(); }
StepGraph::~StepGraph() = default;
void StepGraph::begin_capture() { no_cuda(); }
void StepGraph::end_capture(const std::string&) { no_cuda(); }
void StepGraph::abandon_capture() noexcept {}
void StepGraph::launch() { no_cuda(); }
void StepGraph::reset() {}

CudaInfo query_cuda() {
  CudaInfo info;
  info.problem = "this binary was built without the CUDA backend";
  return info;
}

}  // namespace gt
