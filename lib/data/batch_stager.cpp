// Batch staging: the loader fills a pinned slot while the device may still be copying from the other one, or loader
// threads fill a ring of slots ahead of the trainer.
#include "data/batch_stager.h"

#include "core/backend.h"
#include "ops/device_memory.h"
#include "core/error.h"
#include "ops/gather.h"
#include "profile/profiler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <string>

namespace gt {
namespace {
const std::string kData = "data", kTrainer = "trainer";
}  // namespace

BatchStager::BatchStager(const Dataset& data, int64_t batch, Device device, StagingConfig config)
    : m_data(data), m_batch(batch), m_device(device), m_config(config) {
  make_resident();
  if (device.is_cpu() || device_resident()) return;
  const Shape xs = data.input_shape().batched(batch), ys = data.target_shape().batched(batch);
  if (config.pinned) {
    m_copy_stream = std::make_unique<SideStream>(device);
    for (Slot& s : m_slots) {
      s.dx = Tensor::empty(xs, DType::f32, device);
      s.dy = Tensor::empty(ys, data.target_dtype(), device);
    }
  }
  if (config.workers > 0) return;  // the loader threads' ring holds the host side
  for (Slot& s : m_slots) {
    s.x = config.pinned ? Tensor::empty_pinned(xs, DType::f32) : Tensor::empty(xs, DType::f32);
    s.y = config.pinned ? Tensor::empty_pinned(ys, data.target_dtype()) : Tensor::empty(ys, data.target_dtype());
  }
}

std::string BatchStager::resident_obstacle(const Dataset& data, bool augmented) {
  if (augmented) return "data.augment draws crops and flips per sample on the host";
  if (data.tokens) return "token windows are cut from the shards on the host";
  if (!data.inputs.defined())
    return "the NPY inputs are converted per batch from the mapped file (uint8, or scaled by data.scale)";
  if (data.size() > INT32_MAX) return "it has more samples than the device gather indexes (2^31)";
  return "";
}

void BatchStager::make_resident() {
  if (m_config.resident == Residency::off) return;
  const std::string obstacle = resident_obstacle(m_data, m_config.augmented);
  if (!obstacle.empty()) {
    if (m_config.resident == Residency::on)
      throw ConfigError(
          fmt::format("data.device_resident: true, but {} ({}); use auto or false", obstacle, m_data.source));
    return;  // automatic: staging
  }
  if (m_device.is_cpu()) {
    // On the CPU the data set is resident already: the step's thread gathers straight into the step's tensors.
    if (m_config.resident == Residency::on && m_config.workers > 0) {
      spdlog::info(
          "data.device_resident: true on the CPU: the step's thread gathers each batch (data.workers: {} "
          "unused for training batches)",
          m_config.workers);
      m_config.workers = 0;
    }
    return;
  }
  const size_t bytes =
      m_data.inputs.bytes() + m_data.targets.bytes() + static_cast<size_t>(m_data.size()) * sizeof(int32_t);
  const size_t free_bytes = device_free_bytes(m_device);
  const double share = static_cast<double>(bytes) / static_cast<double>(std::max<size_t>(free_bytes, 1));
  if (m_config.resident == Residency::automatic && share > m_config.resident_fraction) {
    spdlog::info(
        "data.device_resident: auto: the training set ({:.1f} MB) is {:.0f} % of the free memory of {}, over "
        "{:.0f} %: staging batches instead",
        static_cast<double>(bytes) / 1e6, 100 * share, m_device.str(), 100 * m_config.resident_fraction);
    return;
  }
  {
    AllocLabel label("the device-resident training set (data.device_resident)");
    m_resident.inputs = Tensor::empty(m_data.inputs.shape(), m_data.inputs.dtype(), m_device);
    m_resident.targets = Tensor::empty(m_data.targets.shape(), m_data.targets.dtype(), m_device);
    m_resident.order = Tensor::empty(Shape{m_data.size()}, DType::i32, m_device);
  }
  m_resident.inputs.copy_from(m_data.inputs);
  m_resident.targets.copy_from(m_data.targets);
  m_config.workers = 0;  // nothing left for loader threads to do
  spdlog::info(
      "data.device_resident: the training set ({:.1f} MB, {:.0f} % of the free memory) is held on {}; "
      "batches are gathered there",
      static_cast<double>(bytes) / 1e6, 100 * share, m_device.str());
}

int64_t BatchStager::next_resident(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler) {
  const auto t0 = Profiler::Clock::now();
  // A new epoch (or a resume) brings a new order: uploaded once (N × 4 bytes), behind the gathers that read the last.
  if (loader.order() != m_resident.order_source) {
    const std::vector<int64_t>& order = *loader.order();
    Tensor host = Tensor::empty(Shape{static_cast<int64_t>(order.size())}, DType::i32);
    int32_t* h = host.data<int32_t>();
    for (size_t i = 0; i < order.size(); ++i) h[i] = static_cast<int32_t>(order[i]);
    m_resident.order.copy_from(host);
    m_resident.order_source = loader.order();
  }
  const auto [first, n] = loader.span(loader.position());
  if (n > 0) {
    Tensor xb = x.narrow0(n), yb = y.narrow0(n);
    ops::gather_rows(m_resident.inputs, m_resident.order, first, xb);
    ops::gather_rows(m_resident.targets, m_resident.order, first, yb);
    loader.advance(n);
  }
  const auto t1 = Profiler::Clock::now();
  m_wait_seconds += std::chrono::duration<double>(t1 - t0).count();
  if (profiler && profiler->enabled())
    profiler->record(kData, kTrainer, "gather", t0, t1, 0,
                     profiler->timed_on_device() ? Profiler::kHost : Profiler::kMain);
  return n;
}

BatchStager::~BatchStager() {
  try {
    // A slot's move into the step's tensors follows its copy on the compute stream: once it is done, so is the copy.
    for (Slot& s : m_slots) {
      s.copied.wait();
      s.moved.wait();
    }
    m_slot_copied.wait();
  } catch (const std::exception& e) {
    spdlog::warn("waiting for the last batch copies: {}", e.what());
  }
}

void BatchStager::copy_through_stream(const Tensor& hx, const Tensor& hy, int64_t n, Tensor& x, Tensor& y,
                                      StreamEvent& copied) {
  Slot& d = m_slots[m_device_turn];
  m_device_turn ^= 1;
  Tensor dx = d.dx.narrow0(n), dy = d.dy.narrow0(n);
  m_copy_stream->wait(d.moved);  // the compute stream has taken the batch this device slot held two batches ago
  m_copy_stream->copy(dx, hx.narrow0(n));
  m_copy_stream->copy(dy, hy.narrow0(n));
  m_copy_stream->record(copied);  // the host side may be refilled once this has run
  m_copy_stream->join_compute();  // the step's kernels, queued after this, see the batch
  x.narrow0(n).copy_from_async(dx);
  y.narrow0(n).copy_from_async(dy);
  d.moved.record(m_device);
}

int64_t BatchStager::next(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler) {
  if (device_resident()) return next_resident(loader, x, y, profiler);
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
      copy_through_stream(s.x, s.y, n, x, y, s.copied);
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
      copy_through_stream(slot->x, slot->y, n, x, y, m_slot_copied);
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
