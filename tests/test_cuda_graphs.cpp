// train.cuda_graphs on a GPU: a run whose steps after warm-up are one captured CUDA graph, replayed, computes exactly
// what the same run op by op computes (metrics.jsonl's losses and the final weights, bit for bit), with a learning
// rate that changes every step (read from device memory by the replayed update), SGD and AdamW, an MLP and a CNN,
// fp16 with its loss scaler; what cannot be captured is refused; the allocator keeps a graph's blocks to it.
// Without a usable device each case prints why and exits with ctest's skip code (cuda_helpers.h).
#include "cuda_helpers.h"
#include "helpers.h"
#include "ops/cuda/allocator.h"
#include "ops/stream.h"
#include "optim/optimizer.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <regex>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

// 1024 samples in batches of 64: 16 full batches an epoch, so the captured run (which drops a partial last batch)
// and the op-by-op one take the same steps. The cosine schedule with warm-up changes the learning rate every step.
const std::string kGraphsMlp =
    "name: graphs_mlp\nseed: 11\n" +
    synthetic_data({.samples = 1024, .test_samples = 256, .features = 24, .classes = 5, .batch = 64}) +
    R"(model:
  layers:
    - {type: linear, out_features: 64}
    - {type: batchnorm1d}
    - relu
    - {type: linear, out_features: 5}
loss: cross_entropy
optimizer: {type: sgd, lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.0005}
scheduler: {type: cosine, warmup_steps: 5, warmup_start_factor: 0.1}
train: {epochs: 3, log_every: 1, grad_clip: {max_norm: 1.0}}
)";

// Images through conv, batch norm, pooling and a linear head, trained by AdamW.
const char* kGraphsCnn = R"(name: graphs_cnn
seed: 12
data:
  format: synthetic
  samples: 512
  test_samples: 128
  input_shape: [1, 12, 12]
  targets: {classes: 4}
  batch_size: 32
model:
  layers:
    - {type: conv2d, out_channels: 8, kernel_size: 3, padding: 1}
    - batchnorm2d
    - relu
    - {type: maxpool2d, kernel_size: 2}
    - flatten
    - {type: linear, out_features: 4}
loss: cross_entropy
optimizer: {type: adamw, lr: 0.003, weight_decay: 0.01}
scheduler: {type: linear, start_factor: 1, end_factor: 0.1, warmup_steps: 3, warmup_start_factor: 0.2}
train: {epochs: 2, log_every: 1}
)";

// metrics.jsonl's train losses as written (the text, so that equal means bit for bit as printed).
std::vector<std::string> graph_run_losses(const std::string& metrics) {
  std::vector<std::string> out;
  const std::regex re("\"type\": \"train\".*\"loss\": ([^,}]*)");
  for (const auto& l : lines_of(metrics)) {
    std::smatch m;
    if (std::regex_search(l, m, re)) out.push_back(m[1]);
  }
  return out;
}

// Trains `yaml` op by op and with cuda_graphs (plus `extra` --set arguments) and requires the same losses at every
// step and the same final weights, byte for byte.
void require_graph_run_matches(const std::string& yaml, const std::string& extra = "") {
  TempDir dir;
  write_text(dir / "c.yaml", yaml);
  const std::string base = "train " + dir / "c.yaml" + " --device cuda " + extra;
  const CommandResult plain = run_gputrain(base + " --out " + dir / "plain");
  const CommandResult graph = run_gputrain(base + " --set +train.cuda_graphs=true --out " + dir / "graph");
  INFO(plain.output << graph.output);
  REQUIRE(plain.exit_code == 0);
  REQUIRE(graph.exit_code == 0);
  CHECK(graph.output.find("captured; the steps after it replay the graph") != std::string::npos);
  const auto a = graph_run_losses(read_text(dir / "plain/metrics.jsonl"));
  const auto b = graph_run_losses(read_text(dir / "graph/metrics.jsonl"));
  REQUIRE(a.size() > 10);  // past the 3 warm-up steps and the capture
  CHECK(a == b);
  CHECK(read_text(dir / "plain/model.safetensors") == read_text(dir / "graph/model.safetensors"));
}

// Two parameters on the GPU with fixed seeded values and gradients.
std::vector<Param> graph_test_params() {
  std::vector<Param> out;
  uint64_t seed = 40;
  for (const Shape& shape : {Shape{300, 7}, Shape{70001}}) {  // the second spans two of the kernels' chunks
    out.push_back(Param{"p", to_cuda(seeded(shape, seed)), to_cuda(seeded(shape, seed + 1, -0.5, 0.5))});
    seed += 2;
  }
  return out;
}

}  // namespace

TEST_CASE("a captured optimizer update replays with each step's own learning rate and step count", "[cuda]") {
  require_gpu();
  // The learning rate (and Adam's bias corrections, SGD's first step) change every step: the replayed kernel must
  // read them from the device buffer stage_step writes, not the values baked into the capture.
  const std::vector<double> lrs = {0.1, 0.03, 0.2, 0.07, 0.011};
  for (const OptimizerType type : {OptimizerType::sgd, OptimizerType::adamw}) {
    INFO(to_string(type));
    OptimizerConfig cfg;
    cfg.type = type;
    cfg.momentum = 0.9;
    cfg.weight_decay = 0.01;
    std::vector<Param> plain = graph_test_params(), graphed = graph_test_params();
    std::vector<Param*> plain_ptrs, graphed_ptrs;
    for (Param& p : plain) plain_ptrs.push_back(&p);
    for (Param& p : graphed) graphed_ptrs.push_back(&p);
    auto op_by_op = make_optimizer(cfg, plain_ptrs);  // hyperparameters as kernel arguments
    auto replayed = make_optimizer(cfg, graphed_ptrs);
    replayed->hyper_on_device();
    const Tensor stats = Tensor::zeros(Shape{kStepStats}, DType::f64, Device::cuda(0));  // finite: the gate is open
    for (double lr : lrs) op_by_op->step(lr, stats, 0.5);
    replayed->step(lrs[0], stats, 0.5);  // a warm-up step makes the group's device table (host work)
    StepGraph graph(Device::cuda(0));
    replayed->stage_hyper(lrs[1]);
    graph.begin_capture();
    replayed->set_capturing(true);
    replayed->step(lrs[1], stats, 0.5);
    replayed->set_capturing(false);
    graph.end_capture("the optimizer update");
    graph.launch();
    for (size_t i = 2; i < lrs.size(); ++i) {
      replayed->stage_step(lrs[i]);
      graph.launch();
    }
    CHECK(replayed->steps_taken() == op_by_op->steps_taken());
    for (size_t i = 0; i < plain.size(); ++i) {
      const Tensor a = to_host(plain[i].value), b = to_host(graphed[i].value);
      CHECK(std::memcmp(a.raw(), b.raw(), a.bytes()) == 0);  // bit for bit
    }
  }
}

TEST_CASE("a captured MLP run with SGD matches the uncaptured one bit for bit, lr changing every step", "[cuda]") {
  require_gpu();
  require_graph_run_matches(kGraphsMlp);
}

TEST_CASE("a captured CNN run with AdamW matches the uncaptured one bit for bit", "[cuda]") {
  require_gpu();
  require_graph_run_matches(kGraphsCnn);
}

TEST_CASE("a captured fp16 run with a dynamic loss scale matches the uncaptured one bit for bit", "[cuda]") {
  require_gpu();
  require_graph_run_matches(kGraphsMlp, "--precision fp16 --set optimizer.lr=0.02");
}

TEST_CASE("train.cuda_graphs drops the last partial batch of each epoch", "[cuda]") {
  require_gpu();
  TempDir dir;
  std::string yaml = kGraphsMlp;
  yaml.replace(yaml.find("samples: 1024"), 13, "samples: 1000");  // 15 full batches and 40 samples
  write_text(dir / "c.yaml", yaml);
  const CommandResult r =
      run_gputrain("train " + dir / "c.yaml" + " --device cuda --set +train.cuda_graphs=true --out " + dir / "run");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(json_number(read_text(dir / "run/summary.json"), "steps") == 45.0);  // 3 epochs × 15
}

TEST_CASE("train.cuda_graphs refuses a dropout layer on a GPU, naming it", "[cuda]") {
  require_gpu();
  TempDir dir;
  std::string yaml = kGraphsMlp;
  yaml.replace(yaml.find("    - relu\n"), 11, "    - relu\n    - {type: dropout, p: 0.1}\n");
  write_text(dir / "c.yaml", yaml);
  const CommandResult r =
      run_gputrain("train " + dir / "c.yaml" + " --device cuda --set +train.cuda_graphs=true --out " + dir / "run");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("train.cuda_graphs: layer layers.3 (dropout) draws its dropout masks"));
}

TEST_CASE("the graph pool keeps the blocks a capture may touch out of other tensors' hands", "[cuda]") {
  require_gpu();
  const size_t bytes = 3 << 20;  // a size class of its own here
  void* before = cuda::device_alloc(0, bytes);
  cuda::begin_graph_pool(0);  // `before` is live: a graph captured now may use it
  void* during = cuda::device_alloc(0, bytes);
  cuda::end_graph_pool(0);
  CHECK(cuda::graph_pool_bytes(0) >= 2 * cuda::round_size(bytes));
  cuda::device_free(0, before);
  cuda::device_free(0, during);
  // Outside a capture neither comes back, however often the size is asked for.
  void* a = cuda::device_alloc(0, bytes);
  void* b = cuda::device_alloc(0, bytes);
  CHECK(a != before);
  CHECK(a != during);
  CHECK(b != before);
  CHECK(b != during);
  // Inside the next capture they do.
  cuda::begin_graph_pool(0);
  void* c = cuda::device_alloc(0, bytes);
  cuda::end_graph_pool(0);
  CHECK((c == before || c == during));
  cuda::device_free(0, c);
  // Once the graph is gone they are ordinary blocks again (a later run in this process may have them).
  cuda::release_graph_pool(0);
  CHECK(cuda::graph_pool_bytes(0) == 0);
  void* d = cuda::device_alloc(0, bytes);
  void* e = cuda::device_alloc(0, bytes);
  CHECK((d == before || d == during));
  CHECK((e == before || e == during));
  cuda::device_free(0, a);
  cuda::device_free(0, b);
  cuda::device_free(0, d);
  cuda::device_free(0, e);
}
