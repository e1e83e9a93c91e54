// Ordering work on a device's stream from the host: events the host waits for, a side stream beside the compute
// stream, device timestamps and NVTX ranges for the profiler. On the CPU the events are no-ops; in a build without
// CUDA (ops/no_cuda.cpp) a CUDA device is an error that says so.
#pragma once

#include "core/device.h"
#include "core/noncopyable.h"

#include <cstddef>
#include <string>
#include <vector>

namespace gt {

class Tensor;

/// A point in a device's stream: wait() returns once all work queued before the last record() has run. On the CPU
/// (and before any record) both are no-ops.
class StreamEvent : NonCopyable {
 public:
  StreamEvent() = default;
  ~StreamEvent();
  void record(Device device);
  void wait();

 private:
  friend class SideStream;                   // records these on its stream and waits for them there
  [[maybe_unused]] void* m_event = nullptr;  // unused in builds without CUDA
  [[maybe_unused]] Device m_device;
};

/// Timestamps on a device's stream for the profiler (CUDA events with timing): `record` queues one and returns its
/// number; `elapsed_ms(a, b)` waits for b and returns the device time from a to b; `clear` recycles them all.
/// Only for CUDA devices.
class DeviceClock : NonCopyable {
 public:
  explicit DeviceClock(Device device) : m_device(device) {}
  ~DeviceClock();
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

/// A second stream on a CUDA device beside its compute stream (ops/cuda_context.h), for work that overlaps the
/// compute stream's (the gradient all-reduce, the copy of the next batch). The two are ordered only by the waits below,
/// which the device keeps: the host never blocks. Throws gt::Error in a build without CUDA.
class SideStream : NonCopyable {
 public:
  explicit SideStream(Device device);
  ~SideStream();
  /// The cudaStream_t, for libraries that queue on it (NCCL).
  void* handle() const { return m_stream; }
  /// Work queued here from now on runs after the work queued on the compute stream so far.
  void wait_for_compute();
  /// Work queued on the compute stream from now on runs after the work queued here so far.
  void join_compute();
  /// Work queued here from now on runs after the work that preceded `event`'s last record (on whichever stream of
  /// this device); no wait when it was never recorded.
  void wait(const StreamEvent& event);
  /// Records `event` here: its wait() returns once the work queued here so far has run.
  void record(StreamEvent& event);
  /// Work queued on the compute stream from now on runs after the work that preceded `event`'s last record (here or
  /// on any stream of this device); no wait when it was never recorded. (join_compute waits for everything queued
  /// here; this for one point of it: GradSync's ring reuses a bucket buffer once its own reduce-scatter has run.)
  void compute_wait(const StreamEvent& event);
  /// Queues the copy of `src` into `dst` here (same dtype and element count, contiguous; one side on this device,
  /// the other on it too or in pinned host memory, which must stay untouched until an event recorded after it).
  void copy(Tensor& dst, const Tensor& src);

 private:
  [[maybe_unused]] Device m_device;  // unused in builds without CUDA
  void* m_stream = nullptr;
  [[maybe_unused]] void* m_compute_done = nullptr;
  [[maybe_unused]] void* m_side_done = nullptr;
};

/// One training step's device work captured into a CUDA graph and replayed (train.cuda_graphs). Capture records
/// what this thread queues on the device's compute stream between begin_capture and end_capture without running it;
/// launch runs the whole of it again, with the same kernels on the same addresses (the allocator's graph pool,
/// ops/cuda/allocator.h, keeps those addresses out of other tensors' hands). Whatever changes between steps must be
/// written into device memory before launch. Throws gt::Error in a build without CUDA.
class StepGraph : NonCopyable {
 public:
  explicit StepGraph(Device device);
  ~StepGraph();
  /// Starts capturing (thread-local mode: this thread may not synchronise with the device until end_capture).
  void begin_capture();
  /// Ends the capture and instantiates the graph. A capture that an operation broke throws gt::Error naming
  /// `last_op`, the operation queued last before it (the caller's best knowledge of where it broke).
  void end_capture(const std::string& last_op);
  /// Ends a capture that an exception interrupted (no graph), so that the stream is usable again; never throws.
  void abandon_capture() noexcept;
  /// Queues one replay on the compute stream.
  void launch();
  bool ready() const { return m_exec != nullptr; }
  /// Drops the graph (the next step captures again).
  void reset();

 private:
  [[maybe_unused]] Device m_device;           // unused in builds without CUDA
  void* m_exec = nullptr;                     // cudaGraphExec_t
  [[maybe_unused]] bool m_capturing = false;  // unused in builds without CUDA
};

}  // namespace gt
