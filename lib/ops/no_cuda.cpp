// What stands in for ops/cuda/ in a build without the CUDA backend: the stream classes of ops/stream.h say for any
// device but the CPU that CUDA is not built in (core/backend.h's device hooks do so by themselves until a backend
// installs its own); the device report has no devices and the memory report is zero.
#include "core/error.h"
#include "ops/device_memory.h"
#include "ops/devices.h"
#include "ops/stream.h"

namespace gt {
namespace {
[[noreturn]] void no_cuda() {
  throw Error("this gputrain was built without the CUDA backend (configure with -DGPUTRAIN_CUDA=ON)");
}
}  // namespace

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
void SideStream::compute_wait(const StreamEvent&) {}
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
