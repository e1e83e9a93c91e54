// The loader's batches on their way to the step's device: straight into its tensors on the CPU, through two pinned
// host slots on a GPU, or from the slots of loader threads (data.workers).
#pragma once

#include "core/tensor.h"
#include "data/dataset.h"
#include "data/prefetcher.h"
#include "ops/stream.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gt {

class Profiler;

/// data.device_resident: `automatic` holds the training set on the GPU when it takes at most this fraction of the
/// device's free memory (inputs, targets and the epoch's order together).
inline constexpr double kDeviceResidentFraction = 0.25;

/// data.device_resident.
enum class Residency { off, on, automatic };

/// How batches are prepared and staged (data.workers, data.prefetch, data.pin_memory, data.device_resident).
struct StagingConfig {
  int workers = 0;     ///< loader threads; 0: the trainer's thread loads each batch when it needs it
  int prefetch = 2;    ///< with workers: batches ready ahead (the ring's slots)
  bool pinned = true;  ///< on a GPU: page-locked host slots and asynchronous copies; else plain memory, copies wait
  Residency resident = Residency::off;  ///< the data set held on the device and gathered there
  bool augmented = false;               ///< the loader augments (per-sample host work: never device-resident)
  double resident_fraction = kDeviceResidentFraction;  ///< automatic: of the device's free memory (tests lower it)
};

/// Batches reach a GPU through two pinned host slots: the loader fills one while the copy queued from the other may
/// still be running. Pinned, the host-to-device copy runs on a copy stream of its own into one of two device slots,
/// and the compute stream, after waiting for that copy's event, moves the batch into the step's tensors (a
/// device-to-device copy): so the copy of batch k+1 overlaps the kernels of step k, and a host slot goes back to the
/// loader only once its copy event has completed. Unpinned (data.pin_memory: false), the copy waits on the compute
/// stream. On the CPU the loader writes straight into the step's tensors. With loader threads (a Prefetcher) the
/// batch comes from a slot of their ring: copied into x and y on the CPU (a memcpy of the batch, so the step's
/// tensors stay the ones its layers were set up with), through the copy stream as above on a GPU.
class BatchStager {
 public:
  /// For batches of up to `batch` samples of `data` going to `device` (on a GPU without loader threads, the two
  /// slots are allocated here; the threads start at the first next()).
  BatchStager(const Dataset& data, int64_t batch, Device device, StagingConfig config = {});
  /// Waits for the copies still queued from its slots (their memory goes with it).
  ~BatchStager();

  /// Why `data` cannot be held on a device and gathered there ("" when it can): per-sample host work.
  static std::string resident_obstacle(const Dataset& data, bool augmented);
  /// Whether batches are gathered from a copy of the data set on the device (data.device_resident on a GPU).
  bool device_resident() const { return m_resident.inputs.defined(); }

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
    Tensor x, y;         ///< pinned host memory (without loader threads)
    StreamEvent copied;  ///< the copy queued from x and y (on the copy stream when pinned)
    Tensor dx, dy;       ///< on the device, pinned: where the copy stream puts a batch
    StreamEvent moved;   ///< on the compute stream: dx and dy have been copied into the step's tensors
  };
  /// The data set on the device, and the current epoch's order there (i32).
  struct Resident {
    Tensor inputs, targets, order;
    std::shared_ptr<const std::vector<int64_t>> order_source;  ///< the loader's order that `order` holds
  };
  int64_t next_threaded(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler);
  int64_t next_resident(Loader& loader, Tensor& x, Tensor& y, Profiler* profiler);
  /// Holds the data set on the device when config.resident asks for it and it may; throws ConfigError for `on`
  /// with data that cannot be.
  void make_resident();
  /// Queues the copy of the first n samples of host batch (hx, hy) into x and y through the next device slot and
  /// records `copied` on the copy stream after the host side has been read.
  void copy_through_stream(const Tensor& hx, const Tensor& hy, int64_t n, Tensor& x, Tensor& y, StreamEvent& copied);

  const Dataset& m_data;
  int64_t m_batch;
  Device m_device;
  StagingConfig m_config;
  Slot m_slots[2];
  Resident m_resident;
  std::unique_ptr<SideStream> m_copy_stream;  ///< pinned on a GPU: the host-to-device copies
  std::unique_ptr<Prefetcher> m_prefetcher;
  StreamEvent m_slot_copied;  ///< with loader threads: the copy from the slot the trainer holds
  int m_turn = 0;             ///< the host slot the loader fills next (without loader threads)
  int m_device_turn = 0;      ///< the device slot the copy stream fills next
  double m_wait_seconds = 0;
};

}  // namespace gt
