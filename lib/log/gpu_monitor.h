// GPU (NVML, loaded at run time) and host (/proc) metrics sampled by a background thread.
#pragma once

#include "core/json.h"
#include "core/noncopyable.h"
#include "ops/devices.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gt {

/// A GPU the process uses. `ordinal` is the CUDA ordinal and names the fields (`gpu{ordinal}_util`);
/// `pci_bus_id` (as cudaDeviceGetPCIBusId gives it, e.g. "0000:3b:00.0") finds the same device in NVML,
/// whose indices ignore CUDA_VISIBLE_DEVICES. Without one the ordinal is used as the NVML index.
struct GpuTarget {
  int ordinal = 0;
  std::string pci_bus_id;
};

/// The targets for the CUDA `ordinals` a process uses, each with its PCI bus id from `info` (query_cuda()) when
/// listed there, so that NVML finds the same device under CUDA_VISIBLE_DEVICES.
std::vector<GpuTarget> gpu_targets(const CudaInfo& info, const std::vector<int>& ordinals);

/// One reading of one GPU. A value NVML cannot give (not supported, no permission) stays empty.
struct GpuSample {
  int ordinal = 0;
  std::optional<double> util_pct;  // busy share of the last NVML sample period, 0..100
  std::optional<double> mem_used_mib;
  std::optional<double> mem_total_mib;
  std::optional<double> temp_c;
  std::optional<double> power_w;
  std::optional<double> power_limit_w;  // the enforced limit
  std::optional<double> sm_clock_mhz;
  std::optional<uint64_t> throttle;  // NVML clock event (throttle) reasons bitmask
};

/// The process, from /proc/self. `cpu_pct` is utime+stime over the last interval divided by wall time and the
/// number of online cores (100 = every core busy); empty before the first interval has passed.
struct HostSample {
  double rss_mib = 0;
  std::optional<double> cpu_pct;
  int threads = 0;
};

/// Everything one tick of the sampler read. `seq` counts samples from 1; 0 means "none yet".
struct MonitorSample {
  uint64_t seq = 0;
  double t_s = 0;  // seconds since the monitor started
  std::vector<GpuSample> gpus;
  HostSample host;
};

/// NVML throttle reason bits as names joined by ',' ("sw_power_cap,hw_thermal"), or "none".
std::string throttle_names(uint64_t mask);
/// The reasons that slow a training run down and deserve a warning: thermal slowdown (hw, sw), hw slowdown,
/// sw power cap and hw power brake. Idle, application clocks and sync boost are not problems.
constexpr uint64_t kThrottleWarnMask = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

/// Adds the sample's fields to `out`, GPUs first in their order, then the host: gpu{i}_util, gpu{i}_mem_used_mib,
/// gpu{i}_mem_total_mib, gpu{i}_temp_c, gpu{i}_power_w, gpu{i}_power_limit_w, gpu{i}_sm_clock_mhz, gpu{i}_throttle,
/// host_rss_mib, host_cpu_pct, host_threads. Values NVML did not give are null, so every line has the same keys.
void append_fields(JsonObject& out, const MonitorSample& s);
/// One GPU's fields, as in append_fields.
void append_fields(JsonObject& out, const GpuSample& g);
JsonObject to_json(const GpuSample& g);
JsonObject to_json(const MonitorSample& s);
/// Short text for a log line: "gpu0 87% 10.2/80.0 GiB 71C 312W".
std::string summary_text(const GpuSample& g);
/// All GPUs then the host: "gpu0 87% 10.2/80.0 GiB 71C 312W | host rss 1.3 GiB cpu 45%".
std::string summary_text(const MonitorSample& s);

/// Reads the host metrics now. `prev` carries the CPU-time baseline between calls (the first call fills it and
/// leaves cpu_pct empty).
struct HostCpuClock {
  double cpu_s = -1;
  std::chrono::steady_clock::time_point wall;
};
HostSample read_host_sample(HostCpuClock& prev);

/// Samples the GPUs and the host every `interval_s` on its own thread; the training loop only ever copies the
/// newest sample. NVML is opened with dlopen (libnvidia-ml.so.1, or $GT_NVML_LIBRARY) on that thread: when it is
/// missing or nvmlInit fails, one info line says so and only host metrics are sampled — never an error.
/// Warnings, at most once per GPU per monitor: clock throttling for a reason in kThrottleWarnMask, and memory use
/// above 95 % of the total.
class GpuMonitor : NonCopyable {
 public:
  GpuMonitor(std::vector<GpuTarget> gpus, double interval_s);
  ~GpuMonitor();  // stops

  /// Starts the sampling thread; the first sample is taken at once. Another call, or one after stop(), does nothing.
  void start();
  /// Wakes the thread and joins it; returns within one NVML read. Safe to call more than once.
  void stop();
  /// A copy of the newest sample (seq 0 before the first).
  MonitorSample latest() const;
  /// Waits until a sample newer than `after_seq` exists or `timeout` passes; returns the newest either way.
  MonitorSample wait_newer(uint64_t after_seq, std::chrono::milliseconds timeout) const;
  /// True once NVML is loaded and initialised with at least one GPU resolved.
  bool gpu_metrics_on() const;
  double interval_s() const { return m_interval_s; }

 private:
  struct Nvml;  // the dlopen'ed library and its resolved functions (gpu_monitor.cpp)
  void run();
  void open_nvml();
  void close_nvml();
  MonitorSample take_sample();
  void warn_once(const MonitorSample& s);

  std::vector<GpuTarget> m_targets;
  double m_interval_s;
  std::unique_ptr<Nvml> m_nvml;         // touched by the sampling thread only, until it is joined
  std::vector<void*> m_handles;         // nvmlDevice_t per target; null when it could not be resolved
  std::vector<char> m_warned_throttle;  // per target
  std::vector<char> m_warned_memory;
  HostCpuClock m_cpu_clock;
  std::chrono::steady_clock::time_point m_t0;
  uint64_t m_seq = 0;

  mutable std::mutex m_mutex;            // guards everything below
  mutable std::condition_variable m_cv;  // stop requests wake the sampler; new samples wake wait_newer
  bool m_stop = false;
  bool m_gpu_on = false;
  MonitorSample m_latest;
  std::thread m_thread;
};

}  // namespace gt
