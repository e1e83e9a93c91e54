// train.recompute: blocks and all — the same gradients, running statistics, losses and weights as none, with less
// memory.
#include "core/tensor.h"
#include "data/tokens.h"
#include "graph/model.h"
#include "helpers.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <map>
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

// A residual conv net with batch norm and no repeat: block (what all cuts into segments): 16 nodes, so segments of
// ⌈√16⌉ = 4 — [stem bn0 r0 c1] [bn1 relu drop res1] [c2 bn2 r2 add] [down pool flatten linear]. r0 is read across
// segments (the residual), c1, res1 and the add at the boundaries, the linear is the output: those keep their
// outputs; the other ten share three buffers of 4 × 5 × 5 (the flatten is a view).
const char* const kResLayers = R"(layers:
  - {type: conv2d, name: stem, out_channels: 4, kernel_size: 3, padding: 1}
  - {type: batchnorm2d, name: bn0}
  - {type: relu, name: r0}
  - {type: conv2d, name: c1, out_channels: 4, kernel_size: 3, padding: 1}
  - {type: batchnorm2d, name: bn1}
  - relu
  - {type: dropout, name: drop, p: 0.2}
  - {type: add, name: res1, inputs: [r0, drop]}
  - {type: conv2d, name: c2, out_channels: 4, kernel_size: 3, padding: 1}
  - {type: batchnorm2d, name: bn2}
  - {type: relu, name: r2}
  - {type: add, inputs: [res1, r2]}
  - {type: conv2d, name: down, out_channels: 6, kernel_size: 3, stride: 2, padding: 1}
  - global_avgpool
  - flatten
  - {type: linear, out_features: 3}
)";

// An MLP with dropout: 6 nodes, segments of ⌈√6⌉ = 3 — [linear relu linear] [relu drop linear].
const char* const kMlpLayers = R"(layers:
  - {type: linear, out_features: 16}
  - relu
  - {type: linear, out_features: 12}
  - relu
  - {type: dropout, p: 0.25}
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
  int64_t planned = 0;              // buffer_plan's elements and the layers' shared scratch
  std::vector<std::string> states;  // every gradient, parameter and buffer after the steps, as bytes
  std::vector<int> ready;           // grad-ready hook calls per node
};

// Builds `layers`, allocates batches of `batch`, and runs two forward/backward passes (training, steps 3 and 4)
// over `x` with a fixed output gradient, taking an SGD step in between so that the second pass sees new weights.
// Without fused chains unless `fuse` (Model::set_fusion; recompute runs without them anyway), so that the memory
// recompute saves is compared with that of the same layers.
Trained run(const char* layers, const Shape& input, const Tensor& x, Recompute mode, SpanTimer* profiler = nullptr,
            bool fuse = false) {
  const ConfigNode cfg = ConfigNode::load_string(layers, "m.yaml");
  Model m = Model::build(parse_model_spec(cfg), input, DType::f32, Device::cpu(), 11);
  m.set_fusion(fuse);
  REQUIRE(m.set_recompute(mode).empty());
  m.set_profiler(profiler);
  Trained t;
  for (const Model::NodeBuffers& b : m.buffer_plan(x.dim(0))) t.planned += b.output + b.gradient + b.scratch;
  t.planned += m.layer_scratch_numel(x.dim(0));
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

// The layers whose forward ran again in the backward pass, and how often.
class RecomputedLayers : public SpanTimer {
 public:
  std::map<std::string, int> calls;
  bool enabled() const override { return true; }
  SpanStart begin_span(const std::string&) override { return {}; }
  void end_span(const SpanStart&, const std::string& name, const std::string&, const char* category, int64_t) override {
    if (std::string(category) == "recompute") ++calls[name];
  }
};

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

namespace {

// Every gradient, output, weight and buffer of `a` equals `b`'s, bit for bit, and the grad-ready hook fired as often.
void check_same(const Trained& a, const Trained& b) {
  REQUIRE(a.states.size() == b.states.size());
  for (size_t k = 0; k < a.states.size(); ++k) {
    INFO("state " << k);
    CHECK(a.states[k] == b.states[k]);
  }
  CHECK(a.ready == b.ready);
}

}  // namespace

TEST_CASE("recompute: all gives a residual conv net with batch norm and no block the numbers of none", "[cpu]") {
  const Tensor x = image_input(4);
  const Trained none = run(kResLayers, Shape{2, 5, 5}, x, Recompute::none);
  const Trained all = run(kResLayers, Shape{2, 5, 5}, x, Recompute::all);
  check_same(all, none);  // the last states are the running means and variances: updated once per forward
  // The fused chains (batch norm and relu) give the same numbers too.
  const Trained fused = run(kResLayers, Shape{2, 5, 5}, x, Recompute::none, nullptr, true);
  check_same(fused, none);
  CHECK(fused.activation_bytes < none.activation_bytes);
  CHECK(fused.activation_bytes == static_cast<size_t>(fused.planned) * 4);  // allocate holds to buffer_plan
  CHECK(std::count(none.ready.begin(), none.ready.end(), 2) == 8);          // 4 convolutions, 3 batch norms, the linear
  // Ten outputs (eight of 4 × 5 × 5, down's 6 × 3 × 3 and the pool's 6) in three shared buffers of 4 × 5 × 5.
  const int64_t per_sample = 8 * 100 + 54 + 6 - 3 * 100;
  CHECK(none.planned - all.planned == 4 * per_sample);
  CHECK(none.activation_bytes - all.activation_bytes == static_cast<size_t>(4 * per_sample) * 4);
  CHECK(all.activation_bytes == static_cast<size_t>(all.planned) * 4);
}

TEST_CASE("recompute: all gives an MLP with dropout and a GPT the numbers of none, in less memory than blocks",
          "[cpu]") {
  const Tensor v = [] {
    Tensor t = Tensor::empty(Shape{5, 7}, DType::f32);
    for (int64_t k = 0; k < t.numel(); ++k) t.data<float>()[k] = static_cast<float>((k * 13) % 9) * 0.2f - 0.7f;
    return t;
  }();
  const Trained mlp_none = run(kMlpLayers, Shape{7}, v, Recompute::none);
  const Trained mlp_all = run(kMlpLayers, Shape{7}, v, Recompute::all);
  check_same(mlp_all, mlp_none);
  // The first linear and relu (16) and the second relu and dropout (12) share two buffers of 16.
  CHECK(mlp_none.planned - mlp_all.planned == 5 * (2 * 16 + 2 * 12 - 2 * 16));

  // The GPT: its passes are segments as under blocks, and wte (before them) is now recomputed too, in the buffer of
  // position 0 (6 × 8, as ln_1's); ln_f and lm_head join the last pass, which is not run again.
  const Tensor x = gpt_input(3);
  RecomputedLayers blocks_spans, all_spans;
  const Trained none = run(kGptLayers, Shape{6}, x, Recompute::none);
  const Trained blocks = run(kGptLayers, Shape{6}, x, Recompute::blocks, &blocks_spans);
  const Trained all = run(kGptLayers, Shape{6}, x, Recompute::all, &all_spans);
  check_same(all, none);
  CHECK(blocks.planned - all.planned == 3 * 48);
  // What runs again: under blocks the first two passes' 8 dropped layers, once per backward pass (2 steps); under
  // all wte too, and still not the last pass.
  CHECK(blocks_spans.calls.size() == 2 * 8);
  CHECK(blocks_spans.calls["h.1.attn"] == 2);
  std::map<std::string, int> expected = blocks_spans.calls;
  expected["wte"] = 2;
  CHECK(all_spans.calls == expected);
  // A conv net whose residual blocks are repeat: passes: the stem and head are segments too.
  const Tensor img = image_input(4);
  check_same(run(kConvLayers, Shape{2, 5, 5}, img, Recompute::all),
             run(kConvLayers, Shape{2, 5, 5}, img, Recompute::none));
}

TEST_CASE("recompute: all is refused only where nothing would be recomputed", "[cpu]") {
  // Two or three layers make one segment with an output used only inside it, and the last segment is never run
  // again.
  for (const char* layers : {"layers: [{type: linear, out_features: 3}, relu]",
                             "layers: [{type: linear, out_features: 3}, relu, {type: linear, out_features: 2}]"}) {
    INFO(layers);
    Model m = Model::build(parse_model_spec(ConfigNode::load_string(layers, "m.yaml")), Shape{4}, DType::f32,
                           Device::cpu(), 1, false);
    CHECK_THAT(m.set_recompute(Recompute::all), Catch::Contains("nothing would be recomputed"));
    CHECK(m.recompute() == Recompute::none);
  }
  Model four = Model::build(
      parse_model_spec(ConfigNode::load_string(
          "layers: [{type: linear, out_features: 3}, relu, {type: linear, out_features: 2}, relu]", "m.yaml")),
      Shape{4}, DType::f32, Device::cpu(), 1, false);
  CHECK(four.set_recompute(Recompute::all).empty());
  CHECK(four.recompute() == Recompute::all);
}

TEST_CASE("recompute: blocks needs a repeat: block whose outputs stay inside", "[cpu]") {
  const ConfigNode plain = ConfigNode::load_string("layers: [{type: linear, out_features: 3}, relu]", "m.yaml");
  Model m = Model::build(parse_model_spec(plain), Shape{4}, DType::f32, Device::cpu(), 1, false);
  CHECK_THAT(m.set_recompute(Recompute::blocks), Catch::Contains("no repeat: block"));
  CHECK(m.set_recompute(Recompute::none).empty());
  // A block of one layer: its output is the block's output, read outside — nothing to drop.
  const ConfigNode one = ConfigNode::load_string(
      "layers: [{type: linear, out_features: 3}, {repeat: 2, name: h, layers: [relu]}, {type: linear, "
      "out_features: 2}]",
      "m.yaml");
  Model m1 = Model::build(parse_model_spec(one), Shape{4}, DType::f32, Device::cpu(), 1, false);
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
    "train.recompute: blocks and all train a GPT with dropout and residual conv nets (also on 2 ranks) to the same "
    "losses and weights",
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
  // The residual net with no block, under all only, on two ranks: the hooks that start the all-reduce fire once per
  // node while the backward pass recomputes segments.
  std::string res_dp = conv_dp;
  res_dp.replace(res_dp.find("model:"), std::string::npos,
                 model_section(kResLayers) + "optimizer: {type: sgd, lr: 0.05, momentum: 0.9}\n" +
                     "train: {epochs: 2, log_every: 1}\ndist: {sync_batchnorm: true}\n");
  write_text(dir / "res_dp.yaml", res_dp);
  for (const char* model : {"gpt", "conv", "conv_dp", "res_dp"}) {
    const bool blocks_too = std::string(model) != "res_dp";
    for (const char* mode : {"none", "blocks", "all"}) {
      if (!blocks_too && std::string(mode) == "blocks") continue;
      const auto r =
          run_gputrain(fmt::format("train {}/{}.yaml --quiet --threads 2 --set train.recompute={} --out {}/{}_{}",
                                   dir.path(), model, mode, dir.path(), model, mode));
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
    }
    INFO(model);
    const std::string none = dir / (std::string(model) + "_none");
    CHECK(lines_of(read_text(none + "/metrics.jsonl")).size() >= 6);  // 2 ranks: 4 steps and 2 evaluations
    for (const char* mode : {"blocks", "all"}) {
      if (!blocks_too && std::string(mode) == "blocks") continue;
      INFO(mode);
      const std::string run = dir / (std::string(model) + "_" + mode);
      CHECK(metrics_losses(run) == metrics_losses(none));
      CHECK(read_text(run + "/model.safetensors") == read_text(none + "/model.safetensors"));
      CHECK_THAT(read_text(run + "/config.resolved.yaml"), Catch::Contains(std::string("recompute: ") + mode));
    }
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
  // all takes any model with a segment to recompute; one linear layer has none.
  const auto bad = run_gputrain("check " + (dir / "plain.yaml") + " --set train.recompute=all");
  INFO(bad.output);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("train.recompute: is all") && Catch::Contains("nothing would be recomputed"));
}
