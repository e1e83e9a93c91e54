// The loader's batches on their way to the step's device: straight into its tensors on the CPU, through two pinned
// host slots on a GPU, or from the slots of loader threads (data.workers).
#pragma once

#include "core/tensor.h"
#include "data/dataset.h"
#include "data/prefetcher.h"
#include "ops/stream.h"

#include <cstdint>
#include <memory>

namespace gt {

class Profiler;

/// How batches are prepared and staged (data.workers, data.prefetch, data.pin_memory).
struct StagingConfig {
  int workers = 0;     ///< loader threads; 0: the trainer's thread loads each batch when it needs it
  int prefetch = 2;    ///< with workers: batches ready ahead (the ring's slots)
  bool pinned = true;  ///< on a GPU: page-locked host slots and asynchronous copies; else plain memory, copies wait
};

/// Batches reach a GPU through two pinned host slots: the loader fills one while the copy queued from the other may
/// still be running, and the step's kernels queue behind the copy on the device's stream, so loading the next batch
/// overlaps the device's work on this one. On the CPU the loader writes straight into the step's tensors. With loader
/// threads (a Prefetcher) the batch comes from a slot of their ring: copied into x and y on the CPU (a memcpy of the
/// batch, so the step's tensors stay the ones its layers were set up with), copied asynchronously from the pinned
/// slot on a GPU (the slot goes back to the threads when the copy is done).
class BatchStager {
 public:
  /// For batches of up to `batch` samples of `data` going to `device` (on a GPU without loader threads, the two
  /// slots are allocated here; the threads start at the first next()).
  BatchStager(const Dataset& data, int64_t batch, Device device, StagingConfig config = {});

  /// The loader's next batch in x and y (on the device); returns its size, 0 at the end of the epoch. The profiler
  /// (when given) times the loading ("data load") and the host-to-device copy ("data h2d").
  int64_t next(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler = nullptr);

  /// Host seconds the trainer spent in next() since the last take: without loader threads, gathering, scaling,
  /// augmenting and queueing the copy; with them, waiting for the next ready slot and queueing (or, unpinned or on
  /// the CPU, making) the copy. One clock pair per call, no device sync.
  double take_wait_seconds() {
    const double s = m_wait_seconds;
    m_wait_seconds = 0;
    return s;
  }

 private:
  struct Slot {
    Tensor x, y;
    StreamEvent copied;  ///< the copy queued from this slot
  };
  int64_t next_threaded(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler);

  const Dataset& m_data;
  int64_t m_batch;
  Device m_device;
  StagingConfig m_config;
  Slot m_slots[2];
  std::unique_ptr<Prefetcher> m_prefetcher;
  StreamEvent m_slot_copied;  ///< with loader threads: the copy from the slot the trainer holds
  int m_turn = 0;
  double m_wait_seconds = 0;
};

}  // namespace gt
