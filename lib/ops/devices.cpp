// Device resolution: which device a config's `device` names on this machine, and why, for the log.
#include "ops/devices.h"

#include "core/error.h"

#include <charconv>
#include <cstdlib>
#include <limits>

namespace gt {

namespace {

// The oldest GPUs this build has kernels for: SASS for 8.0/8.6/8.9 and 9.0 with PTX for newer ones (CMakeLists.txt).
constexpr int kMinComputeCapability = 80;

std::string describe(const CudaDeviceInfo& d) {
  return fmt::format("{}, compute capability {}.{}, {:.0f} GiB", d.name, d.cc_major, d.cc_minor,
                     static_cast<double>(d.memory_total) / (1 << 30));
}

std::string visible_note() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", v) : std::string();
}

}  // namespace

double PeakTflops::at(Precision p) const {
  switch (p) {
    case Precision::fp32: return fp32;
    case Precision::tf32: return tf32;
    case Precision::bf16:
    case Precision::fp16: return bf16;
  }
  return 0;
}

std::optional<PeakTflops> known_peak(const std::string& name) {
  struct Row {
    const char* pattern;  ///< a substring of the driver's name; the first row that matches wins
    PeakTflops peak;
  };
  // fp32, tf32, bf16 dense TFLOP/s. Sources, NVIDIA's product data sheets: H100 and H200 (the SXM rows; the H200
  // has the H100 SXM's compute), H100 PCIe and NVL, A100 (SXM and PCIe share the tensor-core rates; A800 is an A100
  // with a narrower NVLink), L40S, L40, L4, A10, RTX A6000, V100, T4, and the GeForce RTX 4090 and 3090 whitepapers
  // (Ada and Ampere GA102; tensor rates with fp32 accumulation for bf16 on the 4090, fp16 accumulation on the 3090,
  // the only rate its sheet gives). A10G: AWS's G5 page gives fp32 and half the A10's tensor rates.
  static const Row table[] = {
      {"GH200", {67, 494.7, 989}},     {"H200", {67, 494.7, 989}},     {"H100 PCIe", {51, 378, 756}},
      {"H100 NVL", {60, 417.5, 835}},  {"H100", {67, 494.7, 989}},     {"A100", {19.5, 156, 312}},
      {"A800", {19.5, 156, 312}},      {"L40S", {91.6, 183, 362}},     {"L40", {90.5, 90.5, 181}},
      {"L4", {30.3, 60, 121}},         {"A10G", {31.2, 35, 70}},       {"A10", {31.2, 62.5, 125}},
      {"A6000", {38.7, 77.4, 155}},    {"V100", {15.7, 0, 0}},         {"T4", {8.1, 0, 0}},
      {"RTX 4090", {82.6, 82.6, 165}}, {"RTX 3090", {35.6, 35.6, 71}},
  };
  for (const Row& r : table)
    if (name.find(r.pattern) != std::string::npos) return r.peak;
  return std::nullopt;
}

Device resolve_device(const std::string& requested, std::string& reason) {
  if (requested == "cpu") {
    reason = "requested";
    return Device::cpu();
  }
  GT_CHECK(requested == "auto" || requested.rfind("cuda", 0) == 0, "device \"{}\" (a list is one device per worker)",
           requested);
  const CudaInfo cuda = query_cuda();
  if (requested == "auto") {
    if (cuda.devices.empty()) {
      reason = "auto: " + cuda.problem;
      return Device::cpu();
    }
    const CudaDeviceInfo& d = cuda.devices.front();
    if (d.cc_major * 10 + d.cc_minor < kMinComputeCapability) {
      reason = fmt::format("auto: cuda:0 ({}) is older than this build's kernels (8.0)", describe(d));
      return Device::cpu();
    }
    reason =
        fmt::format("auto: {} CUDA device(s){}, using cuda:0 ({})", cuda.devices.size(), visible_note(), describe(d));
    return Device::cuda(0);
  }
  int index = 0;  // "cuda" or "cuda:N" (the config checked the form)
  if (requested.size() > 5) {
    const auto [end, ec] = std::from_chars(requested.data() + 5, requested.data() + requested.size(), index);
    if (ec != std::errc()) index = std::numeric_limits<int>::max();
  }
  if (cuda.devices.empty()) throw Error(fmt::format("device {}: no usable GPU: {}", requested, cuda.problem));
  if (index >= static_cast<int>(cuda.devices.size()))
    throw Error(
        fmt::format("device {}: only {} CUDA device(s) visible{}", requested, cuda.devices.size(), visible_note()));
  const CudaDeviceInfo& d = cuda.devices[static_cast<size_t>(index)];
  if (d.cc_major * 10 + d.cc_minor < kMinComputeCapability)
    throw Error(fmt::format("device {}: {} is too old: this build has kernels for compute capability 8.0 and newer",
                            requested, describe(d)));
  reason = fmt::format("requested{}; {}", visible_note(), describe(d));
  return Device::cuda(index);
}

}  // namespace gt
