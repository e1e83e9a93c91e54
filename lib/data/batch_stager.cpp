// Batch staging: the loader fills a pinned slot while the device may still be copying from the other one, or loader
// threads fill a ring of slots ahead of the trainer.
#include "data/batch_stager.h"

#include "profile/profiler.h"

#include <chrono>
#include <string>

namespace gt {
namespace {
const std::string kData = "data", kTrainer = "trainer";
}  // namespace

BatchStager::BatchStager(const Dataset& data, int64_t batch, Device device, StagingConfig config)
    : m_data(data), m_batch(batch), m_device(device), m_config(config) {
  if (device.is_cpu() || config.workers > 0) return;
  for (Slot& s : m_slots) {
    const Shape xs = data.input_shape().batched(batch), ys = data.target_shape().batched(batch);
    s.x = config.pinned ? Tensor::empty_pinned(xs, DType::f32) : Tensor::empty(xs, DType::f32);
    s.y = config.pinned ? Tensor::empty_pinned(ys, data.target_dtype()) : Tensor::empty(ys, data.target_dtype());
  }
}

int64_t BatchStager::next(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler) {
  if (m_config.workers > 0) return next_threaded(loader, x, y, profiler);
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
    if (m_config.pinned) {
      x.narrow0(n).copy_from_async(s.x.narrow0(n));
      y.narrow0(n).copy_from_async(s.y.narrow0(n));
      s.copied.record(m_device);
    } else {  // pageable memory: the copy waits for the stream, so the slot is free again when it returns
      x.narrow0(n).copy_from(s.x.narrow0(n));
      y.narrow0(n).copy_from(s.y.narrow0(n));
    }
  }
  m_wait_seconds += std::chrono::duration<double>(Profiler::Clock::now() - t0).count();
  return n;
}

int64_t BatchStager::next_threaded(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler) {
  const auto t0 = Profiler::Clock::now();
  // The slot taken last time goes back once the copy from it is done (on the CPU and unpinned at once).
  m_slot_copied.wait();
  if (!m_prefetcher) {
    m_prefetcher = std::make_unique<Prefetcher>(loader, m_data, m_batch, m_config.workers, m_config.prefetch,
                                                m_config.pinned && !m_device.is_cpu());
  } else {
    m_prefetcher->release();
  }
  Prefetcher::Slot* slot = nullptr;
  const int64_t n = m_prefetcher->take(loader, slot);
  if (profiler && profiler->enabled())
    profiler->record(kData, kTrainer, "load", t0, Profiler::Clock::now(), 0,
                     profiler->timed_on_device() ? Profiler::kHost : Profiler::kMain);
  if (n > 0) {
    loader.advance(n);
    SpanScope scope(profiler, kData, kTrainer, m_device.is_cpu() ? "copy" : "h2d");
    if (!m_device.is_cpu() && m_config.pinned) {
      x.narrow0(n).copy_from_async(slot->x.narrow0(n));
      y.narrow0(n).copy_from_async(slot->y.narrow0(n));
      m_slot_copied.record(m_device);
    } else {
      x.narrow0(n).copy_from(slot->x.narrow0(n));
      y.narrow0(n).copy_from(slot->y.narrow0(n));
      m_prefetcher->release();
    }
  }
  m_wait_seconds += std::chrono::duration<double>(Profiler::Clock::now() - t0).count();
  return n;
}

}  // namespace gt
