// The GPU/host sampler: NVML through dlopen (never linked, so the binary runs where there is no driver) and /proc.
#include "log/gpu_monitor.h"

#include "log/logging.h"

#include <dlfcn.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace gt {

// The few NVML types we use, declared here so that no CUDA header is needed; layouts follow nvml.h.
namespace {
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kNvmlTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kNvmlClockSm = 1;         // NVML_CLOCK_SM
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr double kMiB = 1024.0 * 1024.0;
}  // namespace

struct GpuMonitor::Nvml {
  void* lib = nullptr;
  bool initialised = false;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*handle_by_pci)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, NvmlUtilization*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, NvmlMemory*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*power_limit)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*reasons)(nvmlDevice_t, unsigned long long*) = nullptr;

  std::string error(nvmlReturn_t r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return s ? fmt::format("{} (NVML error {})", s, r) : fmt::format("NVML error {}", r);
  }
};

namespace {

template <typename F>
bool resolve(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

struct Named {
  uint64_t bit;
  const char* name;
};
// nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (same values in both spellings).
constexpr Named kReasons[] = {
    {0x1, "gpu_idle"},    {0x2, "app_clocks"},      {0x4, "sw_power_cap"},
    {0x8, "hw_slowdown"}, {0x10, "sync_boost"},     {0x20, "sw_thermal"},
    {0x40, "hw_thermal"}, {0x80, "hw_power_brake"}, {0x100, "display_clocks"},
};

std::string fmt_opt(const std::optional<double>& v, const char* suffix) {
  return v ? fmt::format("{:.0f}{}", *v, suffix) : fmt::format("?{}", suffix);
}

}  // namespace

std::vector<GpuTarget> gpu_targets(const CudaInfo& info, const std::vector<int>& ordinals) {
  std::vector<GpuTarget> out;
  for (const int o : ordinals) {
    GpuTarget t{o, ""};
    for (const auto& d : info.devices)
      if (d.index == o) t.pci_bus_id = d.pci_bus_id;
    out.push_back(t);
  }
  return out;
}

std::string throttle_names(uint64_t mask) {
  std::string out;
  uint64_t known = 0;
  for (const auto& r : kReasons) {
    known |= r.bit;
    if (!(mask & r.bit)) continue;
    if (!out.empty()) out += ',';
    out += r.name;
  }
  // Newer drivers add reasons; keep them visible rather than dropping them.
  if (mask & ~known) {
    if (!out.empty()) out += ',';
    out += fmt::format("other_0x{:x}", mask & ~known);
  }
  return out.empty() ? "none" : out;
}

void append_fields(JsonObject& out, const GpuSample& g) {
  const std::string p = fmt::format("gpu{}_", g.ordinal);
  out.add(p + "util", g.util_pct);
  out.add(p + "mem_used_mib", g.mem_used_mib);
  out.add(p + "mem_total_mib", g.mem_total_mib);
  out.add(p + "temp_c", g.temp_c);
  out.add(p + "power_w", g.power_w);
  out.add(p + "power_limit_w", g.power_limit_w);
  out.add(p + "sm_clock_mhz", g.sm_clock_mhz);
  if (g.throttle)
    out.add(p + "throttle", throttle_names(*g.throttle));
  else
    out.add_null(p + "throttle");
}

void append_fields(JsonObject& out, const MonitorSample& s) {
  for (const auto& g : s.gpus) append_fields(out, g);
  out.add("host_rss_mib", s.host.rss_mib);
  out.add("host_cpu_pct", s.host.cpu_pct);
  out.add("host_threads", s.host.threads);
}

JsonObject to_json(const GpuSample& g) {
  JsonObject o;
  append_fields(o, g);
  return o;
}

JsonObject to_json(const MonitorSample& s) {
  JsonObject o;
  append_fields(o, s);
  return o;
}

std::string summary_text(const GpuSample& g) {
  std::string mem = "?/? GiB";
  if (g.mem_used_mib && g.mem_total_mib)
    mem = fmt::format("{:.1f}/{:.1f} GiB", *g.mem_used_mib / 1024, *g.mem_total_mib / 1024);
  std::string s = fmt::format("gpu{} {} {} {} {}", g.ordinal, fmt_opt(g.util_pct, "%"), mem, fmt_opt(g.temp_c, "C"),
                              fmt_opt(g.power_w, "W"));
  if (g.throttle && (*g.throttle & kThrottleWarnMask))
    s += " throttled:" + throttle_names(*g.throttle & kThrottleWarnMask);
  return s;
}

std::string summary_text(const MonitorSample& s) {
  std::string out;
  for (const auto& g : s.gpus) out += summary_text(g) + " | ";
  out += fmt::format("host rss {:.1f} GiB cpu {}", s.host.rss_mib / 1024, fmt_opt(s.host.cpu_pct, "%"));
  return out;
}

HostSample read_host_sample(HostCpuClock& prev) {
  HostSample h;
  static const long page = sysconf(_SC_PAGESIZE);
  static const long ticks = sysconf(_SC_CLK_TCK);
  static const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  {
    std::ifstream statm("/proc/self/statm");
    long size = 0, resident = 0;
    if (statm >> size >> resident) h.rss_mib = static_cast<double>(resident) * static_cast<double>(page) / kMiB;
  }
  {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("Threads:", 0) == 0) h.threads = std::atoi(line.c_str() + 8);
  }
  // /proc/self/stat: the command name (field 2) may hold spaces and parentheses, so count fields after the last
  // ')': state is field 3, utime and stime are fields 14 and 15.
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos || ticks <= 0) return h;
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && (rest >> field); ++i) {
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  const double cpu_s = (utime + stime) / static_cast<double>(ticks);
  const auto now = std::chrono::steady_clock::now();
  if (prev.cpu_s >= 0) {
    const double wall = std::chrono::duration<double>(now - prev.wall).count();
    // Clock ticks are 10 ms: shorter windows would mostly measure rounding.
    if (wall >= 0.02) h.cpu_pct = 100.0 * (cpu_s - prev.cpu_s) / wall / static_cast<double>(cores > 0 ? cores : 1);
  }
  prev.cpu_s = cpu_s;
  prev.wall = now;
  return h;
}

GpuMonitor::GpuMonitor(std::vector<GpuTarget> gpus, double interval_s)
    : m_targets(std::move(gpus)), m_interval_s(interval_s > 0 ? interval_s : 1.0) {}

GpuMonitor::~GpuMonitor() { stop(); }

void GpuMonitor::start() {
  std::lock_guard lock(m_mutex);
  if (m_thread.joinable() || m_stop) return;
  m_t0 = std::chrono::steady_clock::now();
  m_thread = std::thread([this] { run(); });
}

void GpuMonitor::stop() {
  {
    std::lock_guard lock(m_mutex);
    m_stop = true;
  }
  m_cv.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

MonitorSample GpuMonitor::latest() const {
  std::lock_guard lock(m_mutex);
  return m_latest;
}

MonitorSample GpuMonitor::wait_newer(uint64_t after_seq, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(m_mutex);
  m_cv.wait_for(lock, timeout, [&] { return m_latest.seq > after_seq || m_stop; });
  return m_latest;
}

bool GpuMonitor::gpu_metrics_on() const {
  std::lock_guard lock(m_mutex);
  return m_gpu_on;
}

void GpuMonitor::run() {
  // NVML is opened here rather than in start(): nvmlInit can take a second when the driver is not persistent,
  // and that second belongs on this thread, not the trainer's.
  if (!m_targets.empty()) open_nvml();
  read_host_sample(m_cpu_clock);  // the CPU-time baseline
  const auto interval = std::chrono::duration<double>(m_interval_s);
  std::unique_lock lock(m_mutex);
  while (!m_stop) {
    lock.unlock();
    MonitorSample s = take_sample();
    warn_once(s);
    lock.lock();
    m_latest = std::move(s);
    m_cv.notify_all();
    m_cv.wait_for(lock, interval, [&] { return m_stop; });
  }
  lock.unlock();
  close_nvml();
}

void GpuMonitor::open_nvml() {
  const char* env = std::getenv("GT_NVML_LIBRARY");
  const std::string name = env && *env ? env : "libnvidia-ml.so.1";
  auto nvml = std::make_unique<Nvml>();
  nvml->lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!nvml->lib) {
    const char* why = dlerror();
    spdlog::info("GPU metrics off: {} not found ({})", name, why ? why : "dlopen failed");
    return;
  }
  auto& n = *nvml;
  // The *_v2 entry points exist since driver 285; clock "event" reasons replaced "throttle" reasons in 535.
  const bool ok = resolve(n.lib, "nvmlInit_v2", n.init) && resolve(n.lib, "nvmlShutdown", n.shutdown) &&
                  resolve(n.lib, "nvmlErrorString", n.error_string) &&
                  resolve(n.lib, "nvmlDeviceGetHandleByIndex_v2", n.handle_by_index) &&
                  resolve(n.lib, "nvmlDeviceGetUtilizationRates", n.utilization) &&
                  resolve(n.lib, "nvmlDeviceGetMemoryInfo", n.memory) &&
                  resolve(n.lib, "nvmlDeviceGetTemperature", n.temperature) &&
                  resolve(n.lib, "nvmlDeviceGetPowerUsage", n.power) &&
                  resolve(n.lib, "nvmlDeviceGetEnforcedPowerLimit", n.power_limit) &&
                  resolve(n.lib, "nvmlDeviceGetClockInfo", n.clock);
  if (!ok) {
    spdlog::info("GPU metrics off: {} lacks {}", name, dlerror());
    dlclose(n.lib);
    return;
  }
  resolve(n.lib, "nvmlDeviceGetHandleByPciBusId_v2", n.handle_by_pci);
  if (!resolve(n.lib, "nvmlDeviceGetCurrentClocksEventReasons", n.reasons))
    resolve(n.lib, "nvmlDeviceGetCurrentClocksThrottleReasons", n.reasons);

  if (const nvmlReturn_t r = n.init(); r != kNvmlSuccess) {
    spdlog::info("GPU metrics off: nvmlInit_v2 failed: {}", n.error(r));
    dlclose(n.lib);
    return;
  }
  n.initialised = true;

  m_handles.assign(m_targets.size(), nullptr);
  m_warned_throttle.assign(m_targets.size(), 0);
  m_warned_memory.assign(m_targets.size(), 0);
  int resolved = 0;
  for (size_t i = 0; i < m_targets.size(); ++i) {
    const auto& t = m_targets[i];
    nvmlDevice_t h = nullptr;
    nvmlReturn_t r = -1;
    // NVML numbers devices by PCI order and ignores CUDA_VISIBLE_DEVICES, so the bus id is the reliable key.
    if (!t.pci_bus_id.empty() && n.handle_by_pci) r = n.handle_by_pci(t.pci_bus_id.c_str(), &h);
    if (r != kNvmlSuccess && !t.pci_bus_id.empty())
      spdlog::info("GPU metrics: gpu{} (PCI {}) not found by bus id ({}); using NVML index {}", t.ordinal, t.pci_bus_id,
                   n.handle_by_pci ? n.error(r) : "no nvmlDeviceGetHandleByPciBusId_v2", t.ordinal);
    if (r != kNvmlSuccess) r = n.handle_by_index(static_cast<unsigned int>(t.ordinal), &h);
    if (r != kNvmlSuccess) {
      spdlog::info("GPU metrics off for gpu{}: no NVML device: {}", t.ordinal, n.error(r));
      continue;
    }
    m_handles[i] = h;
    ++resolved;
  }
  m_nvml = std::move(nvml);
  std::lock_guard lock(m_mutex);
  m_gpu_on = resolved > 0;
}

void GpuMonitor::close_nvml() {
  if (!m_nvml) return;
  if (m_nvml->initialised) m_nvml->shutdown();
  dlclose(m_nvml->lib);
  m_nvml.reset();
  m_handles.clear();
  std::lock_guard lock(m_mutex);
  m_gpu_on = false;
}

MonitorSample GpuMonitor::take_sample() {
  MonitorSample s;
  s.seq = ++m_seq;
  s.t_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - m_t0).count();
  s.host = read_host_sample(m_cpu_clock);
  if (!m_nvml) return s;
  const auto& n = *m_nvml;
  for (size_t i = 0; i < m_targets.size(); ++i) {
    if (!m_handles[i]) continue;
    nvmlDevice_t h = m_handles[i];
    GpuSample g;
    g.ordinal = m_targets[i].ordinal;
    // Each call before its value is read: in f(call(&v), v) the order of the two is unspecified.
    NvmlUtilization u{};
    if (n.utilization(h, &u) == kNvmlSuccess) g.util_pct = u.gpu;
    NvmlMemory m{};
    if (n.memory(h, &m) == kNvmlSuccess) {
      g.mem_used_mib = static_cast<double>(m.used) / kMiB;
      g.mem_total_mib = static_cast<double>(m.total) / kMiB;
    }
    unsigned int v = 0;
    if (n.temperature(h, kNvmlTemperatureGpu, &v) == kNvmlSuccess) g.temp_c = v;
    if (n.power(h, &v) == kNvmlSuccess) g.power_w = v / 1000.0;  // NVML reports milliwatts
    if (n.power_limit(h, &v) == kNvmlSuccess) g.power_limit_w = v / 1000.0;
    if (n.clock(h, kNvmlClockSm, &v) == kNvmlSuccess) g.sm_clock_mhz = v;
    unsigned long long reasons = 0;
    if (n.reasons && n.reasons(h, &reasons) == kNvmlSuccess) g.throttle = reasons;
    s.gpus.push_back(g);
  }
  return s;
}

void GpuMonitor::warn_once(const MonitorSample& s) {
  for (const auto& g : s.gpus) {
    size_t i = 0;
    while (i < m_targets.size() && m_targets[i].ordinal != g.ordinal) ++i;
    if (i == m_targets.size()) continue;
    if (g.throttle && (*g.throttle & kThrottleWarnMask) && !m_warned_throttle[i]) {
      m_warned_throttle[i] = 1;
      spdlog::warn(
          "gpu{} is throttling its clocks ({}) at {} and {}: steps will be slower; check cooling and "
          "the power limit (nvidia-smi -q -d PERFORMANCE)",
          g.ordinal, throttle_names(*g.throttle & kThrottleWarnMask), fmt_opt(g.temp_c, "C"), fmt_opt(g.power_w, "W"));
    }
    if (g.mem_used_mib && g.mem_total_mib && *g.mem_total_mib > 0 && *g.mem_used_mib > 0.95 * *g.mem_total_mib &&
        !m_warned_memory[i]) {
      m_warned_memory[i] = 1;
      spdlog::warn(
          "gpu{} memory is {:.1f}/{:.1f} GiB (over 95 %): a larger batch or model will run out; other "
          "processes on it show in nvidia-smi",
          g.ordinal, *g.mem_used_mib / 1024, *g.mem_total_mib / 1024);
    }
  }
}

}  // namespace gt
