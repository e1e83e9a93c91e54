// The peaks of a run's memory, per process (summary.json's "memory"): what the tensors held at most, the resident
// set's high-water mark and the address space's, read at the end of the run and gathered to rank 0.
#pragma once

#include "core/device.h"
#include "core/json.h"

#include <cstdint>
#include <vector>

namespace gt {

class Communicator;

/// One process's peaks, in bytes. peak_tensor_bytes: the tensors of the device the rank trains on at most (the CUDA
/// caching allocator's peak in use on a GPU, host_storage_peak_bytes() on the CPU); peak_host_tensor_bytes: the host
/// tensors at most (the same number on the CPU); peak_step_tensor_bytes: the host tensors at most while the steps ran
/// (StepPeakWindow; -1 where it was not measured: ranks that share the counter); peak_rss_bytes: the resident set's
/// high-water mark (VmHWM); peak_vm_bytes: the address space's (VmPeak), what `ulimit -v` limits.
struct ProcessPeaks {
  int rank = 0;
  int64_t peak_tensor_bytes = 0, peak_host_tensor_bytes = 0, peak_step_tensor_bytes = -1, peak_rss_bytes = 0,
          peak_vm_bytes = 0;
};

/// The host tensors' peak over the training steps alone, beside the whole process's: the set-up holds what the steps
/// do not (dist.zero 3's whole weights and gradients before they are sharded), so the two say different things.
/// open() after the set-up resets the counter's peak, keeping the one before; close() after the last step puts it
/// back (the counter's peak is the process's again). Ranks
/// that share the counter (worker threads) measure nothing: another rank's reset would cut this one's window.
class StepPeakWindow {
 public:
  void open(bool shared_counter);
  void close();
  /// The process's host tensor peak (the one before open() counted too).
  int64_t process_peak() const;
  /// The peak between open() and close(); -1 when nothing was measured.
  int64_t steps_peak() const { return m_steps; }

 private:
  bool m_open = false;
  int64_t m_before = 0, m_steps = -1;
};

/// Every process's peaks in rank order. With worker threads the counters are the process's, shared by its ranks:
/// one entry (rank 0's) and shared_counters.
struct MemoryPeaks {
  std::vector<ProcessPeaks> per_process;
  bool shared_counters = false;
};

/// This process's peaks now, as rank `rank` training on `device`, its steps measured by `window`.
ProcessPeaks read_process_peaks(int rank, Device device, const StepPeakWindow& window);

/// Every rank's peaks at rank 0 (a collective over `comm`: every rank calls it at the same point; the other ranks
/// get their own alone). `threaded`: the ranks are threads of one process (no collective, one entry).
MemoryPeaks gather_memory_peaks(Communicator& comm, Device device, bool threaded, const StepPeakWindow& window);

/// summary.json's "memory": {"per_process": [{"rank", "peak_tensor_bytes", "peak_host_tensor_bytes",
/// "peak_step_tensor_bytes" (null: not measured), "peak_rss_bytes", "peak_vm_bytes"}, …], "processes_share_counters"}.
JsonObject memory_peaks_json(const MemoryPeaks& peaks);

}  // namespace gt
