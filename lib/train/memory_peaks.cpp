// summary.json's memory peaks: read from the tensor allocators and /proc/self/status, gathered over the ranks.
#include "train/memory_peaks.h"

#include "core/storage_peak.h"
#include "core/tensor.h"
#include "ops/device_memory.h"
#include "parallel/comm.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>

#include <sys/resource.h>

namespace gt {

namespace {

// A "Name:   1234 kB" line of /proc/self/status, in bytes; 0 where there is none (not Linux).
int64_t status_kib_field(const std::string& name) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, name.size() + 1, name + ":") == 0) return std::stoll(line.substr(name.size() + 1)) * 1024;
  return 0;
}

constexpr size_t kFields = 5;

}  // namespace

void StepPeakWindow::open(bool shared_counter) {
  if (shared_counter) return;
  m_before = static_cast<int64_t>(host_storage_peak_bytes());
  reset_host_storage_peak();
  m_open = true;
}

void StepPeakWindow::close() {
  if (!m_open) return;
  m_steps = static_cast<int64_t>(host_storage_peak_bytes());
  raise_host_storage_peak(static_cast<size_t>(m_before));  // the process's peak again, as before open()
  m_open = false;
}

int64_t StepPeakWindow::process_peak() const {
  return std::max(m_before, static_cast<int64_t>(host_storage_peak_bytes()));
}

ProcessPeaks read_process_peaks(int rank, Device device, const StepPeakWindow& window) {
  ProcessPeaks p;
  p.rank = rank;
  p.peak_host_tensor_bytes = window.process_peak();
  p.peak_step_tensor_bytes = window.steps_peak();
  p.peak_tensor_bytes =
      device.is_cuda() ? static_cast<int64_t>(device_memory_stats(device).peak) : p.peak_host_tensor_bytes;
  p.peak_rss_bytes = status_kib_field("VmHWM");
  if (p.peak_rss_bytes == 0) {  // no /proc: getrusage's high-water mark (kilobytes on Linux)
    rusage u{};
    if (getrusage(RUSAGE_SELF, &u) == 0) p.peak_rss_bytes = static_cast<int64_t>(u.ru_maxrss) * 1024;
  }
  p.peak_vm_bytes = status_kib_field("VmPeak");
  return p;
}

MemoryPeaks gather_memory_peaks(Communicator& comm, Device device, bool threaded, const StepPeakWindow& window) {
  MemoryPeaks out;
  const ProcessPeaks mine = read_process_peaks(comm.rank(), device, window);
  if (threaded || comm.size() == 1) {
    out.per_process = {mine};
    out.shared_counters = threaded && comm.size() > 1;
    out.per_process[0].rank = 0;
    return out;
  }
  // Byte counts stay exact in doubles (below 2^53); each rank fills its own slots of a summed vector.
  const auto world = static_cast<size_t>(comm.size()), me = static_cast<size_t>(comm.rank());
  std::vector<double> all(world * kFields, 0.0);
  const int64_t fields[kFields] = {mine.peak_tensor_bytes, mine.peak_host_tensor_bytes, mine.peak_step_tensor_bytes,
                                   mine.peak_rss_bytes, mine.peak_vm_bytes};
  for (size_t k = 0; k < kFields; ++k) all[me * kFields + k] = static_cast<double>(fields[k]);
  comm.allreduce_sum(all.data(), all.size(), "the ranks' memory peaks");
  for (size_t r = 0; r < world; ++r) {
    const double* f = all.data() + r * kFields;
    out.per_process.push_back({.rank = static_cast<int>(r),
                               .peak_tensor_bytes = static_cast<int64_t>(f[0]),
                               .peak_host_tensor_bytes = static_cast<int64_t>(f[1]),
                               .peak_step_tensor_bytes = static_cast<int64_t>(f[2]),
                               .peak_rss_bytes = static_cast<int64_t>(f[3]),
                               .peak_vm_bytes = static_cast<int64_t>(f[4])});
  }
  return out;
}

JsonObject memory_peaks_json(const MemoryPeaks& peaks) {
  std::vector<JsonObject> items;
  for (const ProcessPeaks& p : peaks.per_process)
    items.push_back(JsonObject()
                        .add("rank", p.rank)
                        .add("peak_tensor_bytes", p.peak_tensor_bytes)
                        .add("peak_host_tensor_bytes", p.peak_host_tensor_bytes)
                        .add("peak_step_tensor_bytes", p.peak_step_tensor_bytes >= 0
                                                           ? std::optional<double>(p.peak_step_tensor_bytes)
                                                           : std::nullopt)
                        .add("peak_rss_bytes", p.peak_rss_bytes)
                        .add("peak_vm_bytes", p.peak_vm_bytes));
  return JsonObject().add("per_process", items).add_bool("processes_share_counters", peaks.shared_counters);
}

}  // namespace gt
