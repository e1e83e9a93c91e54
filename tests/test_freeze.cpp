// train.freeze: frozen parameters keep their values, have no gradient and no optimizer state, and the layers before
// which nothing learns run no backward pass; the parameters that learn get the gradients they get unfrozen.
#include "config/config.h"
#include "graph/model.h"
#include "helpers.h"
#include "io/safetensors.h"
#include "parallel/grad_sync.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

// Every kind of layer with parameters that a CNN or a GPT uses, so that each one's frozen backward runs with an input
// gradient still wanted (the first layer learns) and without.
const char* const kFreezeLayers = R"(layers:
  - {type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}
  - {type: batchnorm2d}
  - relu
  - {type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}
  - flatten
  - {type: linear, out_features: 12}
  - {type: layernorm}
  - tanh
  - {type: linear, out_features: 3}
)";

std::string freeze_bytes(const Tensor& t) { return std::string(static_cast<const char*>(t.raw()), t.bytes()); }

struct FreezePass {
  std::map<std::string, std::string> grads;  // the gradients of the parameters that learn, by name
  std::vector<bool> needs_grad;
  std::vector<int> ready;  // grad-ready hook calls per node
};

// One forward and backward pass of kFreezeLayers over a fixed batch, with `frozen` frozen.
FreezePass freeze_pass(const std::vector<std::string>& frozen, std::vector<int64_t>* hits = nullptr) {
  Model m = Model::build(parse_model_spec(ConfigNode::load_string(kFreezeLayers, "m.yaml")), Shape{2, 5, 5}, DType::f32,
                         Device::cpu(), 4);
  const std::vector<int64_t> h = m.set_frozen(frozen);
  if (hits) *hits = h;
  m.allocate(6);
  FreezePass out;
  out.ready.assign(m.nodes().size(), 0);
  m.set_grad_ready_hook([&](size_t i) { ++out.ready[i]; });
  Tensor x = Tensor::empty(Shape{6, 2, 5, 5}, DType::f32);
  for (int64_t k = 0; k < x.numel(); ++k) x.data<float>()[k] = static_cast<float>((k * 37) % 11 - 5) * 0.1f;
  LayerContext ctx;
  const Tensor& y = m.forward(x, ctx);
  Tensor dy = Tensor::empty(y.shape(), DType::f32);
  for (int64_t k = 0; k < dy.numel(); ++k) dy.data<float>()[k] = static_cast<float>((k % 7) - 3) * 0.01f;
  m.backward(dy, ctx);
  for (const auto& [name, p] : m.named_params()) out.grads[name] = freeze_bytes(p->grad);
  for (const GraphNode& n : m.nodes()) out.needs_grad.push_back(n.needs_grad);
  return out;
}

}  // namespace

TEST_CASE("frozen parameters have no gradient, and the others get the gradients they get unfrozen, bit for bit",
          "[freeze]") {
  const FreezePass all = freeze_pass({});
  REQUIRE(all.grads.size() == 12);
  // Frozen in the middle (the second convolution, the batch norm's scale, a dense layer): the input gradient still
  // flows through them to the first convolution.
  std::vector<int64_t> hits;
  const FreezePass mid = freeze_pass({"layers.3.*", "layers.1.weight", "layers.5.weight", "layers.6.bias"}, &hits);
  CHECK(hits == std::vector<int64_t>{2, 1, 1, 1});
  CHECK(mid.grads.size() == 7);
  for (const char* gone : {"layers.3.weight", "layers.3.bias", "layers.1.weight", "layers.5.weight", "layers.6.bias"})
    CHECK(mid.grads.count(gone) == 0);
  for (const auto& [name, g] : mid.grads) {
    INFO(name);
    CHECK(g == all.grads.at(name));
  }
  CHECK(mid.needs_grad == all.needs_grad);
  CHECK(mid.ready[3] == 0);  // no parameter of it learns: nothing to average
  CHECK(mid.ready[0] == 1);
  // The body frozen: nothing before the head learns, so no backward runs there and no gradient buffer exists.
  const FreezePass head = freeze_pass({"layers.[0-6].*"});
  CHECK(head.grads.size() == 2);
  for (const auto& [name, g] : head.grads) CHECK(g == all.grads.at(name));
  CHECK(head.needs_grad == std::vector<bool>{false, false, false, false, false, false, false, false, true});
  // A pattern that matches nothing says so.
  freeze_pass({"layers.9.*"}, &hits);
  CHECK(hits == std::vector<int64_t>{0});
}

TEST_CASE("frozen parameters get no gradient bucket, and ZeRO shards only what learns", "[freeze]") {
  Model m = Model::build(parse_model_spec(ConfigNode::load_string(kFreezeLayers, "m.yaml")), Shape{2, 5, 5}, DType::f32,
                         Device::cpu(), 4);
  m.set_frozen({"layers.0.*", "layers.5.weight"});
  std::set<const Param*> frozen;
  for (const GraphNode& n : m.nodes())
    for (Param* p : n.layer->params())
      if (!p->trains()) frozen.insert(p);
  REQUIRE(frozen.size() == 3);
  const BucketPlan plan = plan_buckets(m.params_by_node(), 0.0001);  // a bucket per node that learns
  size_t in_buckets = 0;
  for (const auto& bucket : plan.buckets)
    for (const Param* p : bucket) {
      CHECK(frozen.count(p) == 0);
      ++in_buckets;
    }
  CHECK(in_buckets == m.params().size());
  CHECK(plan.node_bucket[0] == -1);  // the frozen convolution's node has nothing to average
  std::vector<int64_t> sizes;
  for (const auto& [name, numel] : m.trainable_sizes()) sizes.push_back(numel);
  CHECK(static_cast<int64_t>(sizes.size()) == static_cast<int64_t>(m.params().size()));
}

TEST_CASE("freezing either name of a tied weight freezes the one tensor", "[freeze]") {
  const char* layers = R"(layers:
  - {type: embedding, name: wte, num_embeddings: 20, embedding_dim: 8}
  - {type: layernorm, name: ln}
  - {type: linear, name: head, out_features: 20, bias: false, tied_to: wte}
)";
  for (const char* name : {"wte.weight", "head.weight"}) {
    INFO(name);
    Model m = Model::build(parse_model_spec(ConfigNode::load_string(layers, "m.yaml")), Shape{4}, DType::f32,
                           Device::cpu(), 1);
    CHECK(m.set_frozen({name}) == std::vector<int64_t>{1});
    CHECK(m.trainable_count() == 16);  // the layer norm's
    for (const auto& [n, p] : m.named_params()) CHECK(n.rfind("ln.", 0) == 0);
    m.allocate(2);
    Tensor x = Tensor::zeros(Shape{2, 4}, DType::f32);
    LayerContext ctx;
    const Tensor& y = m.forward(x, ctx);
    Tensor dy = Tensor::zeros(y.shape(), DType::f32);
    dy.data<float>()[3] = 1;
    m.backward(dy, ctx);  // the head's and the embedding's backward skip the shared weight
    for (auto& [n, t] : m.state_tensors())
      if (n == "wte.weight") CHECK(t->defined());
  }
}

namespace {

using FreezeWeights = std::map<std::string, std::string>;

FreezeWeights freeze_weights(const std::string& path) {
  FreezeWeights out;
  for (const auto& [name, t] : read_safetensors(path)) out[name] = freeze_bytes(t);
  return out;
}

// The largest |a − b| / max(|a|, 1e-3) over the f32 elements of two files of the same tensors.
double freeze_largest_difference(const std::string& a_path, const std::string& b_path) {
  const auto a = read_safetensors(a_path), b = read_safetensors(b_path);
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (int64_t k = 0; k < a[i].second.numel(); ++k) {
      const double x = a[i].second.data<float>()[k], y = b[i].second.data<float>()[k];
      worst = std::max(worst, std::abs(x - y) / std::max(std::abs(x), 1e-3));
    }
  return worst;
}

const char* const kFreezeConfig = R"(name: frozen
seed: 5
device: cpu
data:
  format: synthetic
  samples: 256
  test_samples: 64
  input_shape: [1, 6, 6]
  targets: {classes: 3}
  batch_size: 16
model:
  layers:
    - {type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}
    - {type: batchnorm2d}
    - relu
    - flatten
    - {type: linear, out_features: 16}
    - tanh
    - {type: linear, out_features: 3}
loss: cross_entropy
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
train: {epochs: 1, log_every: 4}
checkpoint: {every_steps: 8}
)";

}  // namespace

TEST_CASE("a run with train.freeze keeps the frozen tensors bit for bit and keeps optimizer state for the others only",
          "[e2e][freeze]") {
  TempDir dir;
  write_text(dir / "c.yaml", kFreezeConfig);
  REQUIRE(run_gputrain(fmt::format("train {} --quiet --threads 2 --out {}", dir / "c.yaml", dir / "src")).exit_code ==
          0);
  const FreezeWeights src = freeze_weights(dir / "src/model.safetensors");
  const std::string sets =
      fmt::format("--set +train.init_from={} --set '+train.freeze=[layers.0.*, layers.4.weight]'", dir / "src");
  const auto run = run_gputrain(fmt::format("train {} --threads 2 --out {} {}", dir / "c.yaml", dir / "ft", sets));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const FreezeWeights ft = freeze_weights(dir / "ft/model.safetensors");
  for (const auto& [name, bytes] : src) {
    INFO(name);
    const bool frozen = name.rfind("layers.0.", 0) == 0 || name == "layers.4.weight";
    const bool running_stat = name.find("running") != std::string::npos;  // batch norm's: updated in training
    if (frozen) CHECK(ft.at(name) == bytes);
    if (!frozen && !running_stat) CHECK(ft.at(name) != bytes);
  }
  // Momentum for the 5 parameters that learn (batch norm's two, layers.4's bias, the head's two), none for the rest.
  std::vector<std::string> state;
  for (const auto& [name, t] : read_safetensors(dir / "ft/checkpoints/step-16/optimizer.safetensors"))
    state.push_back(name);
  CHECK(state.size() == 5);
  // `check` counts what learns.
  const auto check = run_gputrain(fmt::format("check {} {}", dir / "c.yaml", sets));
  INFO(check.output);
  CHECK_THAT(check.output, Catch::Contains("trainable: 75 of 2419 parameters"));
  // A resume goes on with the same parameters; another train.freeze would pair the state with other tensors.
  const auto again =
      run_gputrain(fmt::format("train {} --quiet --threads 2 --resume {} --out {} {} --set train.epochs=2",
                               dir / "c.yaml", dir / "ft", dir / "ft2", sets));
  INFO(again.output);
  CHECK(again.exit_code == 0);
  const auto other =
      run_gputrain(fmt::format("train {} --quiet --threads 2 --resume {} --out {} --set +train.init_from={} --set "
                               "'+train.freeze=[layers.0.*]' --set train.epochs=2",
                               dir / "c.yaml", dir / "ft", dir / "ft3", dir / "src"));
  CHECK(other.exit_code == 1);
  CHECK_THAT(other.output, Catch::Contains("train.freeze or LoRA differ from the run that wrote it"));
}

TEST_CASE("train.freeze errors name the key", "[freeze]") {
  TempDir dir;
  write_text(dir / "c.yaml", kFreezeConfig);
  const auto none = run_gputrain(fmt::format("check {} --set '+train.freeze=[layers.0.*, blocks.*]'", dir / "c.yaml"));
  CHECK(none.exit_code == 2);
  CHECK_THAT(none.output, Catch::Contains("train.freeze[1]") && Catch::Contains("matches none of the model's"));
  const auto all = run_gputrain(fmt::format("check {} --set '+train.freeze=[\"*\"]'", dir / "c.yaml"));
  CHECK(all.exit_code == 2);
  CHECK_THAT(all.output, Catch::Contains("freezes every parameter"));
  // optimizer.param_groups are matched against what learns, in check as in train.
  const auto groups = run_gputrain(fmt::format(
      "check {} --set '+train.freeze=[layers.0.*]' --set '+optimizer.param_groups=[{{params: [layers.6.*], lr: 1}}]'",
      dir / "c.yaml"));
  CHECK(groups.exit_code == 0);
  CHECK_THAT(groups.output, Catch::Contains("optimizer group 1 [layers.6.*]: lr 1, weight_decay 0, 2 parameters (51 "
                                            "elements)") &&
                                Catch::Contains("optimizer group 0 [the rest]: lr 0.1, weight_decay 0, 4 parameters"));
  const auto frozen_group = run_gputrain(fmt::format(
      "check {} --set '+train.freeze=[layers.0.*]' --set '+optimizer.param_groups=[{{params: [layers.0.*], lr: 1}}]'",
      dir / "c.yaml"));
  CHECK(frozen_group.exit_code == 2);
  CHECK_THAT(frozen_group.output, Catch::Contains("optimizer.param_groups[0].params"));
  const auto bad = run_gputrain(fmt::format("check {} --set +train.freeze=layers", dir / "c.yaml"));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("train.freeze"));
}

TEST_CASE("train.freeze under data parallelism and dist.zero 1 and 2: frozen tensors get no bucket and stay put",
          "[e2e][dist][freeze]") {
  TempDir dir;
  std::string config = kFreezeConfig;
  config.replace(config.find("{type: sgd, lr: 0.1, momentum: 0.9}"), 35, "{type: adamw, lr: 0.01}");
  write_text(dir / "c.yaml", config);
  std::vector<FreezeWeights> out;
  for (int z = 0; z <= 2; ++z) {
    const auto r = run_gputrain(fmt::format(
        "train {} --device '[cpu, cpu]' --threads 2 --out {} --set '+train.freeze=[layers.0.*]' --set dist.zero={} "
        "--set dist.bucket_mb=0.001",
        dir / "c.yaml", dir / fmt::format("z{}", z), z));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    out.push_back(freeze_weights(dir / fmt::format("z{}/model.safetensors", z)));
  }
  // The same bits as the initialisation for the frozen convolution: a fresh model of the same seed.
  const auto init = run_gputrain(
      fmt::format("train {} --quiet --threads 2 --out {} --set optimizer.lr=1e-30", dir / "c.yaml", dir / "init"));
  REQUIRE(init.exit_code == 0);
  const FreezeWeights fresh = freeze_weights(dir / "init/model.safetensors");
  for (const FreezeWeights& w : out) {
    CHECK(w.at("layers.0.weight") == fresh.at("layers.0.weight"));
    CHECK(w.at("layers.0.bias") == fresh.at("layers.0.bias"));
    CHECK(w.at("layers.6.weight") != fresh.at("layers.6.weight"));
  }
  // Stage 1 updates as zero 0 does; stage 2 sums the norm in another order (see the dist.zero tests).
  CHECK(out[1] == out[0]);
  CHECK(freeze_largest_difference(dir / "z0/model.safetensors", dir / "z2/model.safetensors") < 1e-5);
}
