// Batch staging: the loader fills a pinned slot while the device may still be copying from the other one.
#include "data/batch_stager.h"

#include "profile/profiler.h"

#include <chrono>
#include <string>

namespace gt {

BatchStager::BatchStager(const Dataset& data, int64_t batch, Device device) : m_device(device) {
  if (device.is_cpu()) return;
  for (Slot& s : m_slots) {
    s.x = Tensor::empty_pinned(data.input_shape().batched(batch), DType::f32);
    s.y = Tensor::empty_pinned(data.target_shape().batched(batch), data.target_dtype());
  }
}

int64_t BatchStager::next(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler) {
  static const std::string kData = "data", kTrainer = "trainer";
  // The same clock pair times the data wait and the profiler's "data load" span.
  const auto t0 = Profiler::Clock::now();
  if (m_device.is_cpu()) {
    const int64_t n = loader.next(x, y);
    const auto t1 = Profiler::Clock::now();
    m_wait_seconds += std::chrono::duration<double>(t1 - t0).count();
    if (profiler && profiler->enabled()) profiler->record(kData, kTrainer, "load", t0, t1);
    return n;
  }
  Slot& s = m_slots[m_turn];
  m_turn ^= 1;
  int64_t n = 0;
  {
    // Host work, overlapping the device's: timed on the host, in a lane of its own when the others are device time.
    s.copied.wait();  // the copy queued from this slot two batches ago has been done
    n = loader.next(s.x, s.y);
    if (profiler && profiler->enabled())
      profiler->record(kData, kTrainer, "load", t0, Profiler::Clock::now(), 0,
                       profiler->timed_on_device() ? Profiler::kHost : Profiler::kMain);
  }
  if (n > 0) {
    SpanScope scope(profiler, kData, kTrainer, "h2d");
    x.narrow0(n).copy_from_async(s.x.narrow0(n));
    y.narrow0(n).copy_from_async(s.y.narrow0(n));
    s.copied.record(m_device);
  }
  m_wait_seconds += std::chrono::duration<double>(Profiler::Clock::now() - t0).count();
  return n;
}

}  // namespace gt
