// End-to-end training on a GPU: a run converges, and the CPU and CUDA runs of one config track each other.
// Without a usable device each case prints why and exits with ctest's skip code (cuda_helpers.h).
#include "cuda_helpers.h"
#include "helpers.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

// A 4-class synthetic problem with dropout, batch norm and Adam: every kind of op a step runs.
const std::string kCudaE2eConfig =
    "name: cuda_e2e\nseed: 5\n" +
    synthetic_data({.samples = 4096, .test_samples = 1024, .features = 20, .classes = 4, .batch = 64}) +
    R"(model:
  layers:
    - {type: linear, out_features: 64}
    - {type: batchnorm1d}
    - relu
    - {type: dropout, p: 0.1}
    - {type: linear, out_features: 4}
loss: cross_entropy
optimizer: {type: adam, lr: 0.003}
train: {epochs: 3, log_every: 16}
)";

std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  const std::regex re("\"type\": \"train\".*\"loss\": ([^,}]*)");
  for (const auto& l : lines_of(metrics)) {
    std::smatch m;
    if (std::regex_search(l, m, re)) out.push_back(std::stod(m[1]));
  }
  return out;
}

}  // namespace

TEST_CASE("a synthetic classification run converges on CUDA and reports device memory", "[cuda]") {
  require_gpu();
  TempDir dir;
  write_text(dir / "c.yaml", kCudaE2eConfig);
  const CommandResult r = run_gputrain("train " + dir / "c.yaml" + " --device cuda --out " + dir / "run");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("device cuda:0") != std::string::npos);
  const std::string summary = read_text(dir / "run/summary.json");
  CHECK(json_string(summary, "device") == "cuda:0");
  REQUIRE(json_number(summary, "test_accuracy").has_value());
  CHECK(*json_number(summary, "test_accuracy") > 0.85);
  const std::string metrics = read_text(dir / "run/metrics.jsonl");
  CHECK(metrics.find("\"device_peak_mib\"") != std::string::npos);
  const auto l = losses(metrics);
  REQUIRE(l.size() > 4);
  CHECK(l.back() < 0.5 * l.front());
}

TEST_CASE("the CPU and CUDA runs of one config track each other", "[cuda]") {
  require_gpu();
  TempDir dir;
  write_text(dir / "c.yaml", kCudaE2eConfig);
  const CommandResult cpu = run_gputrain("train " + dir / "c.yaml" + " --device cpu --out " + dir / "cpu");
  const CommandResult gpu = run_gputrain("train " + dir / "c.yaml" + " --device cuda --out " + dir / "gpu");
  INFO(cpu.output << gpu.output);
  REQUIRE(cpu.exit_code == 0);
  REQUIRE(gpu.exit_code == 0);
  const auto a = losses(read_text(dir / "cpu/metrics.jsonl")), b = losses(read_text(dir / "gpu/metrics.jsonl"));
  REQUIRE(a.size() == b.size());
  // Same data order, initial weights and dropout masks (Philox on both); only f32 rounding differs (reduction
  // orders in GEMMs, cuDNN's batch norm, atomics). Over 192 Adam steps that drifts slowly: every logged window's
  // mean loss within 2% (relative) + 0.01, which a wrong kernel misses by far.
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("log window " << i << ": cpu " << a[i] << " cuda " << b[i]);
    CHECK(std::abs(a[i] - b[i]) <= 0.01 + 0.02 * std::abs(a[i]));
  }
  const auto acc_cpu = json_number(read_text(dir / "cpu/summary.json"), "test_accuracy");
  const auto acc_gpu = json_number(read_text(dir / "gpu/summary.json"), "test_accuracy");
  REQUIRE(acc_cpu.has_value());
  REQUIRE(acc_gpu.has_value());
  CHECK(std::abs(*acc_cpu - *acc_gpu) <= 0.02);
}

std::vector<int> skipped_steps(const std::string& metrics) {
  std::vector<int> out;
  const std::regex re("\"type\": \"skip\", \"step\": ([0-9]+)");
  for (const auto& l : lines_of(metrics)) {
    std::smatch m;
    if (std::regex_search(l, m, re)) out.push_back(std::stoi(m[1]));
  }
  return out;
}

TEST_CASE("non-finite steps are skipped on the device and reported by the host as on the CPU", "[cuda]") {
  require_gpu();
  TempDir dir;
  write_text(dir / "c.yaml", kCudaE2eConfig);
  // SGD with lr 1e30 overflows the weights within a few steps; every step after that is non-finite and skipped.
  // The GPU learns of each skip a step late (or at a log line): the rows must still name the same steps.
  const std::string sets =
      " --set optimizer.type=sgd --set optimizer.lr=1e30 --set train.nonfinite=skip "
      "--set train.max_skips=100000 --set train.epochs=1 --set train.log_every=7";
  const CommandResult cpu = run_gputrain("train " + dir / "c.yaml" + " --device cpu" + sets + " --out " + dir / "cpu");
  const CommandResult gpu = run_gputrain("train " + dir / "c.yaml" + " --device cuda" + sets + " --out " + dir / "gpu");
  INFO(cpu.output << gpu.output);
  REQUIRE(cpu.exit_code == 0);
  REQUIRE(gpu.exit_code == 0);
  const auto a = skipped_steps(read_text(dir / "cpu/metrics.jsonl"));
  const auto b = skipped_steps(read_text(dir / "gpu/metrics.jsonl"));
  REQUIRE(!a.empty());
  REQUIRE(!b.empty());
  // The step where the overflow lands may differ by one between the devices' roundings; after it, all are skipped.
  CHECK(std::abs(a.front() - b.front()) <= 1);
  CHECK(a.back() == b.back());
  for (size_t i = 1; i < b.size(); ++i) CHECK(b[i] == b[i - 1] + 1);
}

TEST_CASE("bf16 and fp16 runs of a dense model and of a CNN on CUDA track the CPU's half runs", "[cuda]") {
  require_gpu();
  TempDir dir;
  write_text(dir / "c.yaml", kCudaE2eConfig);
  for (const char* p : {"bf16", "fp16"}) {
    INFO(p);
    const std::string common = "train " + dir / "c.yaml" + " --precision " + p + " --out " + dir / p;
    const CommandResult cpu = run_gputrain(common + "-cpu --device cpu");
    const CommandResult gpu = run_gputrain(common + "-gpu --device cuda");
    INFO(cpu.output << gpu.output);
    REQUIRE(cpu.exit_code == 0);
    REQUIRE(gpu.exit_code == 0);
    CHECK(gpu.output.find(std::string("precision ") + p + ": matrix products of " + p + " operands") !=
          std::string::npos);
    const auto a = losses(read_text(dir / (std::string(p) + "-cpu/metrics.jsonl")));
    const auto b = losses(read_text(dir / (std::string(p) + "-gpu/metrics.jsonl")));
    REQUIRE(a.size() == b.size());
    REQUIRE(a.size() > 4);
    CHECK(b.back() < 0.5 * b.front());
    // Both multiply the same rounded operands with f32 sums; beyond fp32's CPU/CUDA differences (the test above)
    // the sums' order moves which way an operand rounds next step. The fp32 margin, doubled.
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("log window " << i << ": cpu " << a[i] << " cuda " << b[i]);
      CHECK(std::abs(a[i] - b[i]) <= 0.02 + 0.04 * std::abs(a[i]));
    }
  }
  // A convolution in half precision (cuDNN's 16-bit configurations, ops/cuda/conv2d.cpp), which also rounds y, dx
  // and dw to 16 bits where the CPU keeps f32: the same margin, doubled again.
  write_text(dir / "cnn.yaml", R"(name: cuda_cnn_half
seed: 5
data:
  format: synthetic
  samples: 256
  test_samples: 64
  input_shape: [1, 8, 8]
  targets: {classes: 4}
  batch_size: 32
model:
  layers:
    - {type: conv2d, out_channels: 4, kernel_size: 3}
    - relu
    - flatten
    - {type: linear, out_features: 4}
loss: cross_entropy
optimizer: {type: sgd, lr: 0.05}
train: {epochs: 3, log_every: 2, precision: bf16}
)");
  const std::string cnn = "train " + dir / "cnn.yaml" + " --out " + dir / "cnn";
  const CommandResult cnn_cpu = run_gputrain(cnn + "-cpu --device cpu");
  const CommandResult cnn_gpu = run_gputrain(cnn + "-gpu --device cuda");
  INFO(cnn_cpu.output << cnn_gpu.output);
  REQUIRE(cnn_cpu.exit_code == 0);
  REQUIRE(cnn_gpu.exit_code == 0);
  const auto a = losses(read_text(dir / "cnn-cpu/metrics.jsonl"));
  const auto b = losses(read_text(dir / "cnn-gpu/metrics.jsonl"));
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() > 4);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("cnn log window " << i << ": cpu " << a[i] << " cuda " << b[i]);
    CHECK(std::abs(a[i] - b[i]) <= 0.04 + 0.08 * std::abs(a[i]));
  }
}
