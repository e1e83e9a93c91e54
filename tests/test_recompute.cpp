// train.recompute: blocks — the same gradients, running statistics, losses and weights as none, with less memory.
#include "core/tensor.h"
#include "data/tokens.h"
#include "graph/model.h"
#include "helpers.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;
namespace fs = std::filesystem;

namespace {

// A tiny GPT with dropout inside its three blocks (masks keyed by the layer and the step).
const char* const kGptLayers = R"(layers:
  - {type: embedding, name: wte, num_embeddings: 256, embedding_dim: 8}
  - {type: positional_embedding, name: wpe, max_len: 6}
  - repeat: 3
    name: h
    layers:
      - {type: layernorm, name: ln_1}
      - {type: causal_self_attention, name: attn, heads: 2}
      - {type: dropout, name: drop, p: 0.3}
      - {type: add, name: res_1, inputs: [input, drop]}
      - {type: layernorm, name: ln_2}
      - {type: linear, name: fc, out_features: 16}
      - {type: gelu, approximate: tanh}
      - {type: linear, name: proj, out_features: 8}
      - {type: add, inputs: [res_1, proj]}
  - {type: layernorm, name: ln_f}
  - {type: linear, name: lm_head, out_features: 256, tied_to: wte, bias: false}
)";

// A conv net whose two residual blocks hold batch norm (running statistics) and a flatten view at the end.
const char* const kConvLayers = R"(layers:
  - {type: conv2d, name: stem, out_channels: 4, kernel_size: 3, padding: 1}
  - repeat: 2
    name: res
    layers:
      - {type: conv2d, name: c1, out_channels: 4, kernel_size: 3, padding: 1}
      - {type: batchnorm2d, name: bn}
      - relu
      - {type: dropout, name: drop, p: 0.2}
      - {type: add, inputs: [input, drop]}
  - global_avgpool
  - {type: linear, out_features: 3}
)";

// `layers` (a `layers:` map) as the value of `model:` in a config.
std::string model_section(const char* layers) {
  std::string out = "model:\n";
  for (const std::string& line : lines_of(layers)) out += "  " + line + "\n";
  return out;
}

std::string bytes_of(const Tensor& t) { return std::string(static_cast<const char*>(t.raw()), t.bytes()); }

struct Trained {
  size_t activation_bytes = 0;      // what allocate allocated
  int64_t planned = 0;              // buffer_plan's elements
  std::vector<std::string> states;  // every gradient, parameter and buffer after the steps, as bytes
  std::vector<int> ready;           // grad-ready hook calls per node
};

// Builds `layers`, allocates batches of `batch`, and runs two forward/backward passes (training, steps 3 and 4)
// over `x` with a fixed output gradient, taking an SGD step in between so that the second pass sees new weights.
Trained run(const char* layers, const Shape& input, const Tensor& x, Recompute mode) {
  const ConfigNode cfg = ConfigNode::load_string(layers, "m.yaml");
  Model m = Model::build(cfg, input, DType::f32, Device::cpu(), 11);
  REQUIRE(m.set_recompute(mode).empty());
  Trained t;
  for (const Model::NodeBuffers& b : m.buffer_plan(x.dim(0))) t.planned += b.output + b.gradient + b.scratch;
  const size_t before = host_storage_bytes();
  m.allocate(x.dim(0));
  t.activation_bytes = host_storage_bytes() - before;
  t.ready.assign(m.nodes().size(), 0);
  m.set_grad_ready_hook([&](size_t i) { ++t.ready[i]; });
  for (uint64_t step : {3, 4}) {
    LayerContext ctx;
    ctx.step = step;
    const Tensor& y = m.forward(x, ctx);
    Tensor dy = Tensor::empty(y.shape(), DType::f32);
    for (int64_t k = 0; k < dy.numel(); ++k) dy.data<float>()[k] = static_cast<float>((k % 7) - 3) * 0.01f;
    t.states.push_back(bytes_of(y));
    m.backward(dy, ctx);
    for (Param* p : m.params()) {
      t.states.push_back(bytes_of(p->grad));
      for (int64_t k = 0; k < p->value.numel(); ++k) p->value.data<float>()[k] -= 0.1f * p->grad.data<float>()[k];
    }
  }
  for (auto& [name, tensor] : m.state_tensors()) t.states.push_back(bytes_of(*tensor));
  return t;
}

Tensor gpt_input(int64_t batch) {
  Tensor x = Tensor::empty(Shape{batch, 6}, DType::f32);
  for (int64_t k = 0; k < x.numel(); ++k) x.data<float>()[k] = static_cast<float>((k * 7 + 3) % 20);
  return x;
}

Tensor image_input(int64_t batch) {
  Tensor x = Tensor::empty(Shape{batch, 2, 5, 5}, DType::f32);
  for (int64_t k = 0; k < x.numel(); ++k) x.data<float>()[k] = static_cast<float>((k * 37) % 11) * 0.1f - 0.5f;
  return x;
}

}  // namespace

TEST_CASE("recompute: blocks gives a GPT with dropout the gradients of none bit for bit, in less memory", "[cpu]") {
  const Tensor x = gpt_input(3);
  const Trained none = run(kGptLayers, Shape{6}, x, Recompute::none);
  const Trained blocks = run(kGptLayers, Shape{6}, x, Recompute::blocks);
  REQUIRE(none.states.size() == blocks.states.size());
  for (size_t k = 0; k < none.states.size(); ++k) {
    INFO("state " << k);
    CHECK(none.states[k] == blocks.states[k]);
  }
  CHECK(blocks.ready == none.ready);  // the data-parallel hook: once per node with parameters, each pass
  CHECK(std::count(none.ready.begin(), none.ready.end(), 2) > 10);
  // Per block pass, 8 of its 9 outputs are used only inside it (its last add feeds the next); they share one set of
  // 8 buffers instead of 3.
  const int64_t per_sample = 6 * (6 * 8 + 2 * 16);  // ln_1 attn drop res_1 ln_2 proj (8) and fc, gelu (16)
  CHECK(none.planned - blocks.planned == 2 * 3 * per_sample);
  CHECK(none.activation_bytes - blocks.activation_bytes == static_cast<size_t>(2 * 3 * per_sample) * 4);
  CHECK(blocks.activation_bytes == static_cast<size_t>(blocks.planned) * 4);
}

TEST_CASE("recompute: blocks leaves batch norm's running statistics as none does", "[cpu]") {
  const Tensor x = image_input(4);
  const Trained none = run(kConvLayers, Shape{2, 5, 5}, x, Recompute::none);
  const Trained blocks = run(kConvLayers, Shape{2, 5, 5}, x, Recompute::blocks);
  REQUIRE(none.states.size() == blocks.states.size());
  for (size_t k = 0; k < none.states.size(); ++k) {
    INFO("state " << k);
    CHECK(none.states[k] == blocks.states[k]);  // the last ones are the running means and variances
  }
  CHECK(blocks.ready == none.ready);
  // c1, bn, relu and dropout (4 channels of 5 × 5) share buffers across the two blocks; the sink batch norm keeps
  // for the recomputing call is made in the backward pass, not by allocate.
  CHECK(none.activation_bytes - blocks.activation_bytes == static_cast<size_t>(4 * 4 * 4 * 25) * 4);
}

TEST_CASE("recompute: blocks needs a repeat: block whose outputs stay inside", "[cpu]") {
  const ConfigNode plain = ConfigNode::load_string("layers: [{type: linear, out_features: 3}, relu]", "m.yaml");
  Model m = Model::build(plain, Shape{4}, DType::f32, Device::cpu(), 1, false);
  CHECK_THAT(m.set_recompute(Recompute::blocks), Catch::Contains("no repeat: block"));
  CHECK(m.set_recompute(Recompute::none).empty());
  // A block of one layer: its output is the block's output, read outside — nothing to drop.
  const ConfigNode one = ConfigNode::load_string(
      "layers: [{type: linear, out_features: 3}, {repeat: 2, name: h, layers: [relu]}, {type: linear, "
      "out_features: 2}]",
      "m.yaml");
  Model m1 = Model::build(one, Shape{4}, DType::f32, Device::cpu(), 1, false);
  CHECK_THAT(m1.set_recompute(Recompute::blocks), Catch::Contains("nothing would be recomputed"));
}

namespace {

// Trains the GPT on token shards through the command line, with train.recompute as given.
std::string gpt_config(const std::string& dir) {
  return fmt::format(R"(name: gpt
seed: 3
device: cpu
data: {{format: tokens, train: {{path: "{0}/tok/train_*.bin"}}, test: {{path: "{0}/tok/train_*.bin"}}, block_size: 6,
        batch_size: 4}}
{1}optimizer: {{type: adamw, lr: 0.01}}
train: {{epochs: 2, log_every: 1, eval_every: 5, accumulate: 2}}
)",
                     dir, model_section(kGptLayers));
}

std::string metrics_losses(const std::string& run) {
  // Every line's loss fields in order; timing fields differ between any two runs.
  std::string out;
  for (const std::string& line : lines_of(read_text(run + "/metrics.jsonl"))) {
    for (const char* key : {"\"loss\"", "\"test_loss\"", "\"grad_norm\""}) {
      const size_t at = line.find(key);
      if (at != std::string::npos) out += line.substr(at, line.find_first_of(",}", at) - at) + " ";
    }
    out += "\n";
  }
  return out;
}

}  // namespace

TEST_CASE(
    "train.recompute: blocks trains a GPT with dropout and a residual conv net (also on 2 ranks) to the same losses "
    "and weights",
    "[e2e]") {
  TempDir dir;
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 300; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 5) % 20));
  fs::create_directories(dir / "tok");
  write_token_shard(dir / "tok/train_000000.bin", tokens.data(), tokens.size());
  // The conv net on synthetic images.
  const std::string conv = std::string(R"(name: conv
seed: 3
device: cpu
data: {format: synthetic, samples: 40, test_samples: 8, input_shape: [2, 5, 5], targets: {classes: 3},
       batch_size: 8}
)") + model_section(kConvLayers) +
                           "optimizer: {type: sgd, lr: 0.05, momentum: 0.9}\ntrain: {epochs: 2, log_every: 1}\n";
  write_text(dir / "gpt.yaml", gpt_config(dir.path()));
  write_text(dir / "conv.yaml", conv);
  // The conv net on two worker-thread ranks with synchronised batch norm: the recomputing calls meet in the same
  // collectives on both ranks, and the gradient all-reduce overlaps a backward pass that recomputes.
  std::string conv_dp = conv;
  conv_dp.replace(conv_dp.find("device: cpu"), 11, "device: [cpu, cpu]");
  write_text(dir / "conv_dp.yaml", conv_dp + "dist: {sync_batchnorm: true}\n");
  for (const char* model : {"gpt", "conv", "conv_dp"}) {
    for (const char* mode : {"none", "blocks"}) {
      const auto r =
          run_gputrain(fmt::format("train {}/{}.yaml --quiet --threads 2 --set train.recompute={} --out {}/{}_{}",
                                   dir.path(), model, mode, dir.path(), model, mode));
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
    }
    INFO(model);
    const std::string none = dir / (std::string(model) + "_none"), blocks = dir / (std::string(model) + "_blocks");
    CHECK(lines_of(read_text(none + "/metrics.jsonl")).size() >= 6);  // 2 ranks: 4 steps and 2 evaluations
    CHECK(metrics_losses(blocks) == metrics_losses(none));
    CHECK(read_text(blocks + "/model.safetensors") == read_text(none + "/model.safetensors"));
    CHECK_THAT(read_text(blocks + "/config.resolved.yaml"), Catch::Contains("recompute: blocks"));
  }
  // A model without a block is refused at the key, before anything runs.
  write_text(dir / "plain.yaml", R"(name: plain
device: cpu
data: {format: synthetic, samples: 8, input_shape: [4], targets: {classes: 2}, batch_size: 4}
model: {layers: [{type: linear, out_features: 2}]}
optimizer: {type: sgd, lr: 0.1}
train: {recompute: blocks}
)");
  for (const std::string& cmd :
       {"train " + (dir / "plain.yaml") + " --out " + (dir / "plain"), "check " + (dir / "plain.yaml")}) {
    const auto bad = run_gputrain(cmd);
    INFO(bad.output);
    CHECK(bad.exit_code == 2);
    CHECK_THAT(bad.output, Catch::Contains("train.recompute") && Catch::Contains("no repeat: block") &&
                               Catch::Contains("plain.yaml:6"));
  }
}
