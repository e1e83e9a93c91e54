// Events, device timestamps, NVTX ranges and side streams (ops/stream.h) on CUDA streams.
#include "ops/stream.h"

#include "core/error.h"
#include "core/tensor.h"
#include "ops/cuda/allocator.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>

namespace gt {

StreamEvent::~StreamEvent() {
  if (m_event && cudaSetDevice(m_device.index) == cudaSuccess) cudaEventDestroy(static_cast<cudaEvent_t>(m_event));
}

void StreamEvent::record(Device device) {
  if (device.is_cpu()) return;
  if (m_event && !(device == m_device)) {
    cudaEventDestroy(static_cast<cudaEvent_t>(m_event));
    m_event = nullptr;
  }
  m_device = device;
  const cudaStream_t s = cuda::stream(device.index);
  if (!m_event) {
    cudaEvent_t e = nullptr;
    GT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    m_event = e;
  }
  GT_CHECK_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(m_event), s));
}

void StreamEvent::wait() {
  if (m_event) GT_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(m_event)));
}

DeviceClock::~DeviceClock() {
  if (m_events.empty() || cudaSetDevice(m_device.index) != cudaSuccess) return;
  for (void* e : m_events) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

int DeviceClock::record() {
  const cudaStream_t s = cuda::stream(m_device.index);  // makes the device current
  if (m_used == m_events.size()) {
    cudaEvent_t e = nullptr;
    GT_CHECK_CUDA(cudaEventCreate(&e));  // with timing
    m_events.push_back(e);
  }
  GT_CHECK_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(m_events[m_used]), s));
  return static_cast<int>(m_used++);
}

double DeviceClock::elapsed_ms(int from, int to) {
  GT_CHECK(from >= 0 && to >= 0 && static_cast<size_t>(std::max(from, to)) < m_used, "device timestamps {} and {}",
           from, to);
  const auto end = static_cast<cudaEvent_t>(m_events[static_cast<size_t>(to)]);
  GT_CHECK_CUDA(cudaEventSynchronize(end));
  float ms = 0;
  GT_CHECK_CUDA(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(m_events[static_cast<size_t>(from)]), end));
  return ms;
}

void range_push(const char* name) { nvtxRangePushA(name); }
void range_pop() { nvtxRangePop(); }

SideStream::SideStream(Device device) : m_device(device) {
  GT_CHECK(device.is_cuda(), "a side stream needs a CUDA device, not {}", device.str());
  GT_CHECK_CUDA(cudaSetDevice(device.index));
  cudaStream_t s = nullptr;
  // Non-blocking: the synchronous copies on the legacy default stream (Tensor::copy_from to the host) must not wait
  // for a long all-reduce here; the compute stream meets this one only through join_compute.
  GT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  m_stream = s;
  cudaEvent_t a = nullptr, b = nullptr;
  GT_CHECK_CUDA(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
  GT_CHECK_CUDA(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
  m_compute_done = a;
  m_side_done = b;
}

SideStream::~SideStream() {
  if (cudaSetDevice(m_device.index) != cudaSuccess) return;
  // Destroying a stream with queued work is allowed (it finishes first); the events go with it.
  cudaStreamDestroy(static_cast<cudaStream_t>(m_stream));
  cudaEventDestroy(static_cast<cudaEvent_t>(m_compute_done));
  cudaEventDestroy(static_cast<cudaEvent_t>(m_side_done));
}

void SideStream::wait_for_compute() {
  // An event may be recorded again at once: cudaStreamWaitEvent has taken the state of its last record.
  const auto e = static_cast<cudaEvent_t>(m_compute_done);
  GT_CHECK_CUDA(cudaEventRecord(e, cuda::stream(m_device.index)));
  GT_CHECK_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(m_stream), e, 0));
}

void SideStream::join_compute() {
  const auto e = static_cast<cudaEvent_t>(m_side_done);
  GT_CHECK_CUDA(cudaEventRecord(e, static_cast<cudaStream_t>(m_stream)));
  GT_CHECK_CUDA(cudaStreamWaitEvent(cuda::stream(m_device.index), e, 0));
}

void SideStream::wait(const StreamEvent& event) {
  if (!event.m_event) return;
  GT_CHECK(event.m_device == m_device, "an event of {} waited for on a stream of {}", event.m_device.str(),
           m_device.str());
  GT_CHECK_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(m_stream), static_cast<cudaEvent_t>(event.m_event), 0));
}

void SideStream::compute_wait(const StreamEvent& event) {
  if (!event.m_event) return;
  GT_CHECK(event.m_device == m_device, "an event of {} waited for on a stream of {}", event.m_device.str(),
           m_device.str());
  GT_CHECK_CUDA(cudaStreamWaitEvent(cuda::stream(m_device.index), static_cast<cudaEvent_t>(event.m_event), 0));
}

void SideStream::record(StreamEvent& event) {
  if (event.m_event && !(event.m_device == m_device)) {
    cudaEventDestroy(static_cast<cudaEvent_t>(event.m_event));
    event.m_event = nullptr;
  }
  event.m_device = m_device;
  if (!event.m_event) {
    cudaEvent_t e = nullptr;
    GT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event.m_event = e;
  }
  GT_CHECK_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(event.m_event), static_cast<cudaStream_t>(m_stream)));
}

void SideStream::copy(Tensor& dst, const Tensor& src) {
  GT_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(), "copy {} {} into {} {}", dtype_name(src.dtype()),
           src.shape().str(), dtype_name(dst.dtype()), dst.shape().str());
  GT_CHECK(dst.device() == m_device || src.device() == m_device, "a copy between {} and {} on a stream of {}",
           src.device().str(), dst.device().str(), m_device.str());
  GT_CHECK_CUDA(cudaSetDevice(m_device.index));
  GT_CHECK_CUDA(
      cudaMemcpyAsync(dst.raw(), src.raw(), dst.bytes(), cudaMemcpyDefault, static_cast<cudaStream_t>(m_stream)));
}

StepGraph::StepGraph(Device device) : m_device(device) {
  GT_CHECK(device.is_cuda(), "train.cuda_graphs needs a CUDA device, not {}", device.str());
}

StepGraph::~StepGraph() {
  abandon_capture();
  reset();
}

void StepGraph::begin_capture() {
  GT_CHECK(!m_capturing, "a step capture is under way already");
  reset();
  const cudaStream_t s = cuda::stream(m_device.index);  // makes the device current
  // (Work queued before this, the batch's copy and the hyperparameters' write, is no part of the graph: a capture
  // records only what is queued after it begins.)
  cuda::begin_graph_pool(m_device.index);
  const cudaError_t status = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (status != cudaSuccess) {
    cuda::release_graph_pool(m_device.index);
    cudaGetLastError();
    throw Error(fmt::format("train.cuda_graphs: capturing the step on {} could not start: {}", m_device.str(),
                            cudaGetErrorString(status)));
  }
  m_capturing = true;
}

void StepGraph::end_capture(const std::string& last_op) {
  GT_CHECK(m_capturing, "no step capture is under way");
  const cudaStream_t s = cuda::stream(m_device.index);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  m_capturing = false;
  cuda::end_graph_pool(m_device.index);
  if (ended != cudaSuccess || !graph) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    cuda::release_graph_pool(m_device.index);
    throw Error(
        fmt::format("train.cuda_graphs: the step could not be captured into a CUDA graph: {} broke the "
                    "capture ({}); run with cuda_graphs: false",
                    last_op, cudaGetErrorString(ended)));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  if (made != cudaSuccess) {
    cudaGetLastError();
    cuda::release_graph_pool(m_device.index);
    throw Error(
        fmt::format("train.cuda_graphs: the captured step could not be instantiated: {}", cudaGetErrorString(made)));
  }
  m_exec = exec;
}

void StepGraph::abandon_capture() noexcept {
  if (!m_capturing) return;
  m_capturing = false;
  if (cudaSetDevice(m_device.index) != cudaSuccess) return;
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(cuda::stream(m_device.index), &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // the error that interrupted the capture has been reported by the caller's exception
  cuda::release_graph_pool(m_device.index);  // no graph came of it
}

void StepGraph::launch() {
  GT_CHECK(m_exec, "no captured step to replay");
  GT_CHECK_CUDA(cudaGraphLaunch(static_cast<cudaGraphExec_t>(m_exec), cuda::stream(m_device.index)));
}

void StepGraph::reset() {
  if (!m_exec) return;
  // Destroying an executable graph while a launch of it is queued is allowed: the launch completes first, and so
  // does it before any later work on the stream that is handed the pool's blocks.
  if (cudaSetDevice(m_device.index) == cudaSuccess) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(m_exec));
  m_exec = nullptr;
  cuda::release_graph_pool(m_device.index);
}

}  // namespace gt
