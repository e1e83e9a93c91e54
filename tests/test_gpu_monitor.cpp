// The GPU/host monitor against a scripted NVML (tests/tools/fake_nvml.c): readings, warnings, a missing library.
#include "helpers.h"
#include "log/gpu_monitor.h"
#include "ops/devices.h"

#include <dlfcn.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <initializer_list>
#include <map>
#include <sstream>
#include <thread>

using gt::GpuMonitor;
using gt::GpuTarget;
using gt::MonitorSample;
using gt::test::ExpectWarnings;
using gt::test::json_number;
using gt::test::json_string;
using gt::test::lines_of;
using gt::test::read_text;
using gt::test::run_gputrain;
using gt::test::TempDir;
using gt::test::write_text;
using namespace std::chrono_literals;

namespace {

// Sets environment variables for one test and restores them after; every FAKE_NVML_* variable starts unset.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::initializer_list<std::pair<std::string, std::string>> vars) {
    for (const char* name :
         {"FAKE_NVML_FAIL_INIT", "FAKE_NVML_GPUS", "FAKE_NVML_PCI", "FAKE_NVML_UTIL", "FAKE_NVML_MEM_USED_MIB",
          "FAKE_NVML_MEM_TOTAL_MIB", "FAKE_NVML_TEMP", "FAKE_NVML_POWER_W", "FAKE_NVML_POWER_LIMIT_W",
          "FAKE_NVML_SM_CLOCK", "FAKE_NVML_THROTTLE", "FAKE_NVML_UNSUPPORTED", "FAKE_NVML_SLOW_MS"})
      unsetenv(name);
    set("GT_NVML_LIBRARY", GT_FAKE_NVML_LIB);
    for (const auto& [k, v] : vars) set(k, v);
  }
  ~ScopedEnv() {
    for (const auto& [k, old] : m_saved) {
      if (old)
        setenv(k.c_str(), old->c_str(), 1);
      else
        unsetenv(k.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const std::string& k, const std::string& v) {
    if (!m_saved.count(k)) {
      const char* old = std::getenv(k.c_str());
      m_saved[k] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    setenv(k.c_str(), v.c_str(), 1);
  }
  std::map<std::string, std::optional<std::string>> m_saved;
};

// Every log line written while it lives, at info and above, whichever thread wrote it.
class LogCapture {
 public:
  LogCapture() : m_sink(std::make_shared<spdlog::sinks::ostream_sink_mt>(m_text)) {
    m_sink->set_pattern("%l: %v");
    m_level = spdlog::default_logger()->level();
    spdlog::default_logger()->set_level(spdlog::level::info);
    spdlog::default_logger()->sinks().push_back(m_sink);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    std::erase(sinks, std::static_pointer_cast<spdlog::sinks::sink>(m_sink));
    spdlog::default_logger()->set_level(m_level);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string text() {
    m_sink->flush();
    return m_text.str();
  }
  // How many lines contain `needle`.
  int count(const std::string& needle) {
    int n = 0;
    for (const auto& line : gt::test::lines_of(text()))
      if (line.find(needle) != std::string::npos) ++n;
    return n;
  }

 private:
  std::ostringstream m_text;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> m_sink;
  spdlog::level::level_enum m_level;
};

// Keeps the fake library loaded for the test, so its call counters survive the monitor's dlclose.
struct FakeNvml {
  FakeNvml() : lib(dlopen(GT_FAKE_NVML_LIB, RTLD_NOW | RTLD_LOCAL)) {
    REQUIRE(lib);
    count_fn = reinterpret_cast<int (*)(const char*)>(dlsym(lib, "fake_nvml_count"));
    REQUIRE(count_fn);
  }
  ~FakeNvml() { dlclose(lib); }
  FakeNvml(const FakeNvml&) = delete;
  FakeNvml& operator=(const FakeNvml&) = delete;
  int count(const char* what) const { return count_fn(what); }
  void* lib;
  int (*count_fn)(const char*);
};

// Runs a monitor until it has taken `samples` samples, stops it and returns the last one.
MonitorSample run_for(GpuMonitor& m, uint64_t samples) {
  m.start();
  MonitorSample s;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (s.seq < samples && std::chrono::steady_clock::now() < deadline) s = m.wait_newer(s.seq, 1s);
  m.stop();
  REQUIRE(s.seq >= samples);
  return s;
}

}  // namespace

TEST_CASE("the GPU monitor reports what NVML reads, per GPU, as JSON fields and a log text", "[cpu]") {
  ScopedEnv env({{"FAKE_NVML_GPUS", "2"},
                 {"FAKE_NVML_UTIL", "87,12"},
                 {"FAKE_NVML_MEM_USED_MIB", "10444.8,2048"},
                 {"FAKE_NVML_MEM_TOTAL_MIB", "81920"},
                 {"FAKE_NVML_TEMP", "71,50"},
                 {"FAKE_NVML_POWER_W", "312.5,90"},
                 {"FAKE_NVML_POWER_LIMIT_W", "700"},
                 {"FAKE_NVML_SM_CLOCK", "1980,1410"},
                 {"FAKE_NVML_THROTTLE", "none,idle+power_cap"}});
  FakeNvml fake;
  const int inits = fake.count("init"), shutdowns = fake.count("shutdown");
  ExpectWarnings throttled{"gpu1 is throttling its clocks (sw_power_cap)"};  // idle+power_cap: the power cap warns
  GpuMonitor m({{0, ""}, {1, ""}}, 0.05);
  const MonitorSample s = run_for(m, 2);

  REQUIRE(s.gpus.size() == 2);
  CHECK(s.gpus[0].util_pct == 87);
  CHECK(s.gpus[1].util_pct == 12);
  CHECK(s.gpus[0].mem_used_mib.value() == Approx(10444.8).epsilon(1e-6));
  CHECK(s.gpus[0].mem_total_mib == 81920);
  CHECK(s.gpus[0].temp_c == 71);
  CHECK(s.gpus[0].power_w == 312.5);  // NVML's milliwatts in watts
  CHECK(s.gpus[1].power_limit_w == 700);
  CHECK(s.gpus[1].sm_clock_mhz == 1410);
  CHECK(s.gpus[0].throttle == 0u);
  CHECK(s.gpus[1].throttle == 0x5u);

  const std::string json = gt::to_json(s).str();
  CHECK(json_number(json, "gpu0_util") == 87);
  CHECK(json_number(json, "gpu1_mem_used_mib") == 2048);
  CHECK(json_number(json, "gpu1_mem_total_mib") == 81920);
  CHECK(json_number(json, "gpu0_temp_c") == 71);
  CHECK(json_number(json, "gpu0_power_w") == 312.5);
  CHECK(json_number(json, "gpu0_power_limit_w") == 700);
  CHECK(json_number(json, "gpu0_sm_clock_mhz") == 1980);
  CHECK(json_string(json, "gpu0_throttle") == "none");
  CHECK(json_string(json, "gpu1_throttle") == "gpu_idle,sw_power_cap");
  CHECK(json_number(json, "host_rss_mib").value_or(0) > 0);
  CHECK(json.find("\"host_threads\"") != std::string::npos);

  CHECK(gt::summary_text(s.gpus[0]) == "gpu0 87% 10.2/80.0 GiB 71C 312W");
  CHECK(gt::summary_text(s.gpus[1]).starts_with("gpu1 12% 2.0/80.0 GiB 50C 90W throttled:sw_power_cap"));
  CHECK(gt::summary_text(s).find(" | host rss ") != std::string::npos);
  // NVML is initialised once and shut down when the monitor stops.
  CHECK(fake.count("init") == inits + 1);
  CHECK(fake.count("shutdown") == shutdowns + 1);
}

TEST_CASE("the GPU monitor finds a CUDA ordinal's device by PCI bus id, else by index", "[cpu]") {
  ScopedEnv env({{"FAKE_NVML_GPUS", "2"}, {"FAKE_NVML_PCI", "0000:01:00.0,0000:02:00.0"}, {"FAKE_NVML_UTIL", "11,22"}});
  LogCapture log;
  // CUDA_VISIBLE_DEVICES=1 makes NVML's device 1 CUDA's device 0; the bus id says so.
  GpuMonitor m({{0, "0000:02:00.0"}, {1, "0000:09:00.0"}}, 0.05);
  const MonitorSample s = run_for(m, 1);
  REQUIRE(s.gpus.size() == 2);
  CHECK(s.gpus[0].ordinal == 0);
  CHECK(s.gpus[0].util_pct == 22);
  // An unknown bus id falls back to the index, and says so.
  CHECK(s.gpus[1].util_pct == 22);
  CHECK(log.count("gpu1 (PCI 0000:09:00.0) not found by bus id") == 1);
  CHECK(m.gpu_metrics_on() == false);  // stopped

  // The targets come from the device report, whose bus ids are cudaDeviceGetPCIBusId's.
  gt::CudaInfo info;
  info.devices.push_back({});
  info.devices.back().index = 0;
  info.devices.back().pci_bus_id = "0000:02:00.0";
  const auto targets = gt::gpu_targets(info, {0, 3});
  REQUIRE(targets.size() == 2);
  CHECK(targets[0].ordinal == 0);
  CHECK(targets[0].pci_bus_id == "0000:02:00.0");
  CHECK(targets[1].ordinal == 3);
  CHECK(targets[1].pci_bus_id.empty());
  GpuMonitor from_report(gt::gpu_targets(info, {0}), 0.05);
  const MonitorSample r = run_for(from_report, 1);
  REQUIRE(r.gpus.size() == 1);
  CHECK(r.gpus[0].util_pct == 22);
}

TEST_CASE("a throttling GPU is warned about once per GPU, an idle one not at all", "[cpu]") {
  SECTION("thermal and power reasons warn once per GPU however many samples show them") {
    ScopedEnv env({{"FAKE_NVML_GPUS", "3"}, {"FAKE_NVML_THROTTLE", "thermal,power_cap+idle,none"}});
    LogCapture log;
    ExpectWarnings warned{"is throttling its clocks"};
    GpuMonitor m({{0, ""}, {1, ""}, {2, ""}}, 0.01);
    run_for(m, 6);
    CHECK(log.count("is throttling") == 2);
    CHECK(log.count("warning: gpu0 is throttling its clocks (sw_thermal,hw_thermal)") == 1);
    CHECK(log.count("warning: gpu1 is throttling its clocks (sw_power_cap)") == 1);
    CHECK(log.count("gpu2") == 0);
  }
  SECTION("idle clocks, application clocks and sync boost are not warned about") {
    ScopedEnv env({{"FAKE_NVML_THROTTLE", "0x13"}});
    LogCapture log;
    GpuMonitor m({{0, ""}}, 0.01);
    const MonitorSample s = run_for(m, 3);
    CHECK(json_string(gt::to_json(s).str(), "gpu0_throttle") == "gpu_idle,app_clocks,sync_boost");
    CHECK(log.count("warning") == 0);
  }
  SECTION("a second monitor (a second run) warns again") {
    ScopedEnv env({{"FAKE_NVML_THROTTLE", "power_brake"}});
    LogCapture log;
    ExpectWarnings warned{"gpu0 is throttling its clocks (hw_power_brake)"};
    for (int run = 0; run < 2; ++run) {
      GpuMonitor m({{0, ""}}, 0.01);
      run_for(m, 3);
    }
    CHECK(log.count("gpu0 is throttling its clocks (hw_power_brake)") == 2);
  }
}

TEST_CASE("memory above 95 % of a GPU is warned about once", "[cpu]") {
  ScopedEnv env(
      {{"FAKE_NVML_GPUS", "2"}, {"FAKE_NVML_MEM_USED_MIB", "79000,77000"}, {"FAKE_NVML_MEM_TOTAL_MIB", "81920"}});
  LogCapture log;
  ExpectWarnings warned{"gpu0 memory is 77.1/80.0 GiB (over 95 %)"};
  GpuMonitor m({{0, ""}, {1, ""}}, 0.01);
  run_for(m, 5);
  // 79000/81920 = 96.4 % warns; 77000/81920 = 94.0 % does not.
  CHECK(log.count("memory is") == 1);
  CHECK(log.count("warning: gpu0 memory is 77.1/80.0 GiB (over 95 %)") == 1);
}

TEST_CASE("without libnvidia-ml the monitor says so once and samples the host only", "[cpu]") {
  ScopedEnv env({{"GT_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"}});
  LogCapture log;
  GpuMonitor m({{0, ""}}, 0.01);
  const MonitorSample s = run_for(m, 3);
  CHECK(log.count("GPU metrics off: /nonexistent/libnvidia-ml.so.1 not found (") == 1);
  CHECK(log.count("warning") == 0);
  CHECK(log.count("error") == 0);
  CHECK_FALSE(m.gpu_metrics_on());
  CHECK(s.gpus.empty());
  const std::string json = gt::to_json(s).str();
  CHECK(json.find("gpu0") == std::string::npos);
  CHECK(json_number(json, "host_rss_mib").value_or(0) > 0);
}

TEST_CASE("the default library name is what the missing-library line names", "[cpu]") {
  ScopedEnv env({});
  unsetenv("GT_NVML_LIBRARY");
  // This machine may have a driver; only where it has none is the line checked.
  void* real = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (real) {
    dlclose(real);
    SUCCEED("libnvidia-ml.so.1 is installed here");
    return;
  }
  LogCapture log;
  GpuMonitor m({{0, ""}}, 0.01);
  run_for(m, 1);
  CHECK(log.count("info: GPU metrics off: libnvidia-ml.so.1 not found (") == 1);
}

TEST_CASE("nvmlInit failing turns GPU metrics off with an info line and no shutdown", "[cpu]") {
  ScopedEnv env({{"FAKE_NVML_FAIL_INIT", "1"}});
  FakeNvml fake;
  const int shutdowns = fake.count("shutdown"), utils = fake.count("util");
  LogCapture log;
  GpuMonitor m({{0, ""}}, 0.01);
  const MonitorSample s = run_for(m, 3);
  CHECK(log.count("info: GPU metrics off: nvmlInit_v2 failed: Driver Not Loaded (NVML error 9)") == 1);
  CHECK(s.gpus.empty());
  CHECK(s.host.threads >= 1);
  CHECK(fake.count("shutdown") == shutdowns);  // nothing to shut down after a failed init
  CHECK(fake.count("util") == utils);
}

TEST_CASE("a reading NVML does not support is null, so every line keeps the same keys", "[cpu]") {
  ScopedEnv env({{"FAKE_NVML_UNSUPPORTED", "power"}, {"FAKE_NVML_UTIL", "40"}});
  GpuMonitor m({{0, ""}}, 0.01);
  const MonitorSample s = run_for(m, 1);
  REQUIRE(s.gpus.size() == 1);
  CHECK_FALSE(s.gpus[0].power_w.has_value());
  const std::string json = gt::to_json(s).str();
  CHECK(json.find("\"gpu0_power_w\": null") != std::string::npos);
  CHECK(json.find("\"gpu0_power_limit_w\": null") != std::string::npos);
  CHECK(json_number(json, "gpu0_util") == 40);
  CHECK(gt::summary_text(s.gpus[0]) == "gpu0 40% 0.0/80.0 GiB 40C ?W");
}

TEST_CASE("throttle reasons decode to names", "[cpu]") {
  CHECK(gt::throttle_names(0) == "none");
  CHECK(gt::throttle_names(0x24) == "sw_power_cap,sw_thermal");
  CHECK(gt::throttle_names(0x88) == "hw_slowdown,hw_power_brake");
  CHECK(gt::throttle_names(0x100 | 0x1000) == "display_clocks,other_0x1000");
}

TEST_CASE("host metrics: resident memory, CPU use over the interval and threads", "[cpu]") {
  gt::HostCpuClock clock;
  const gt::HostSample first = gt::read_host_sample(clock);
  CHECK_FALSE(first.cpu_pct.has_value());  // no interval yet
  CHECK(first.rss_mib > 1);
  CHECK(first.threads >= 1);
  // Burn 150 ms of this process's CPU time: the next reading must see it.
  const std::clock_t c0 = std::clock();
  volatile double x = 0;
  while (std::clock() - c0 < CLOCKS_PER_SEC * 15 / 100) x = x + 1;
  const gt::HostSample second = gt::read_host_sample(clock);
  REQUIRE(second.cpu_pct.has_value());
  CHECK(*second.cpu_pct > 0);
  CHECK(*second.cpu_pct <= 100.0 + 1e-9);

  // The sampler's own thread shows in the count while it runs.
  ScopedEnv env({{"GT_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"}});
  GpuMonitor m({}, 0.01);
  const MonitorSample s = run_for(m, 2);
  CHECK(s.host.threads >= first.threads + 1);
  CHECK(s.host.rss_mib > 1);
}

TEST_CASE("stop() returns promptly however long the interval, and the destructor stops", "[cpu]") {
  ScopedEnv env({});
  GpuMonitor m({{0, ""}}, 30.0);
  m.start();
  REQUIRE(m.wait_newer(0, 5s).seq == 1);
  const auto t0 = std::chrono::steady_clock::now();
  m.stop();
  CHECK(std::chrono::steady_clock::now() - t0 < 500ms);
  m.stop();  // twice is fine

  auto scoped = std::make_unique<GpuMonitor>(std::vector<GpuTarget>{{0, ""}}, 30.0);
  scoped->start();
  REQUIRE(scoped->wait_newer(0, 5s).seq == 1);
  const auto t1 = std::chrono::steady_clock::now();
  scoped.reset();  // the destructor joins the thread
  CHECK(std::chrono::steady_clock::now() - t1 < 500ms);
}

TEST_CASE("a slow NVML never holds up the caller: latest() returns at once while a sample is being read", "[cpu]") {
  ScopedEnv env({{"FAKE_NVML_SLOW_MS", "300"}});
  GpuMonitor m({{0, ""}}, 0.01);
  m.start();
  REQUIRE(m.wait_newer(0, 5s).seq >= 1);  // from here on the sampler is almost always inside a 300 ms read
  auto slowest = std::chrono::steady_clock::duration::zero();
  for (int i = 0; i < 50; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(m.latest().gpus.size() == 1);
    slowest = std::max(slowest, std::chrono::steady_clock::now() - t0);
    std::this_thread::sleep_for(5ms);
  }
  CHECK(slowest < 50ms);
  // stop() waits for the read in progress, and no longer.
  const auto t1 = std::chrono::steady_clock::now();
  m.stop();
  CHECK(std::chrono::steady_clock::now() - t1 < 1500ms);
}

TEST_CASE("a run's log lines and train rows carry the sampler's host metrics, and logging.gpu_metrics turns them off",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", R"(name: monitored
seed: 3
device: cpu
data:
  format: synthetic
  samples: 4000
  input_shape: [20]
  targets: {classes: 4}
  batch_size: 32
model:
  layers: [{type: linear, out_features: 64}, relu, {type: linear, out_features: 4}]
loss: cross_entropy
optimizer: {type: sgd, lr: 0.05}
train: {epochs: 3, log_every: 25}
logging: {interval_s: 0.02}
)");
  const auto on = run_gputrain("train " + dir / "c.yaml" + " --threads 1 --out " + dir / "on");
  INFO(on.output);
  REQUIRE(on.exit_code == 0);
  const auto rows = lines_of(read_text(dir / "on/metrics.jsonl"));
  std::string last_train;
  for (const auto& r : rows)
    if (r.find("\"type\": \"train\"") != std::string::npos) last_train = r;
  REQUIRE(!last_train.empty());
  CHECK(json_number(last_train, "host_rss_mib").value_or(0) > 1);
  CHECK(json_number(last_train, "host_threads").value_or(0) >= 1);
  CHECK_THAT(on.output, Catch::Contains("| host rss"));
  const auto off =
      run_gputrain("train " + dir / "c.yaml" + " --threads 1 --set logging.gpu_metrics=false --out " + dir / "off");
  REQUIRE(off.exit_code == 0);
  CHECK(read_text(dir / "off/metrics.jsonl").find("host_rss_mib") == std::string::npos);
  CHECK(off.output.find("| host rss") == std::string::npos);
}

TEST_CASE("the MFU's peak comes from the GPU's name and the run's precision, and an unknown GPU has none", "[cpu]") {
  CHECK(gt::known_peak("NVIDIA H100 80GB HBM3")->fp32 == 67);
  CHECK(gt::known_peak("NVIDIA H100 PCIe")->fp32 == 51);
  CHECK(gt::known_peak("NVIDIA H200")->bf16 == 989);
  CHECK(gt::known_peak("NVIDIA A100-SXM4-80GB")->fp32 == 19.5);
  CHECK(gt::known_peak("NVIDIA A10G")->bf16 == 70);  // not the A10's row
  CHECK(gt::known_peak("NVIDIA L40S")->fp32 == 91.6);
  CHECK(gt::known_peak("NVIDIA L4")->fp32 == 30.3);
  // The MFU divides by the peak of the run's precision: a bf16 GPT on an H200 is not measured against fp32's 67.
  CHECK(gt::known_peak("NVIDIA H200")->at(gt::Precision::fp32) == 67);
  CHECK(gt::known_peak("NVIDIA H200")->at(gt::Precision::tf32) == 494.7);
  CHECK(gt::known_peak("NVIDIA H200")->at(gt::Precision::bf16) == 989);
  CHECK(gt::known_peak("NVIDIA H200")->at(gt::Precision::fp16) == 989);
  CHECK(gt::known_peak("NVIDIA A100-SXM4-40GB")->at(gt::Precision::tf32) == 156);
  CHECK(gt::known_peak("Tesla V100-SXM2-16GB")->at(gt::Precision::bf16) == 0);  // no bf16 tensor cores: no MFU
  CHECK_FALSE(gt::known_peak("NVIDIA Frobnicator 9000").has_value());
  CHECK_FALSE(gt::known_peak("").has_value());
}
