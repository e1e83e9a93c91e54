// The loader's batches on their way to the step's device: straight into its tensors on the CPU, through two pinned
// host slots on a GPU.
#pragma once

#include "core/tensor.h"
#include "data/dataset.h"
#include "ops/stream.h"

#include <cstdint>

namespace gt {

class Profiler;

/// Batches reach a GPU through two pinned host slots: the loader fills one while the copy queued from the other may
/// still be running, and the step's kernels queue behind the copy on the device's stream, so loading the next batch
/// overlaps the device's work on this one. On the CPU the loader writes straight into the step's tensors.
class BatchStager {
 public:
  /// For batches of up to `batch` samples of `data` going to `device` (on a GPU, the two slots are allocated here).
  BatchStager(const Dataset& data, int64_t batch, Device device);

  /// The loader's next batch in x and y (on the device); returns its size, 0 at the end of the epoch. The profiler
  /// (when given) times the loading ("data load") and the host-to-device copy ("data h2d").
  int64_t next(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler = nullptr);

  /// Host seconds the trainer spent in next() (gathering, scaling, augmenting, queueing the copy) since the last
  /// take: the time it waited for data, as there are no loader threads. One clock pair per call, no device sync.
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
  Device m_device;
  Slot m_slots[2];
  int m_turn = 0;
  double m_wait_seconds = 0;
};

}  // namespace gt
