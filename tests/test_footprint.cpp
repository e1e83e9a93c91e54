// `gputrain check`'s dry run: per-layer FLOPs and memory worked out by hand, compared with what building,
// allocating and running a model really allocates, the fit verdict, and the command's text and JSON.
#include "core/tensor.h"
#include "cuda_helpers.h"
#include "data/dataset.h"
#include "graph/model.h"
#include "helpers.h"
#include "layer_cases.h"
#include "ops/devices.h"
#include "ops/precision.h"
#include "optim/optimizer.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"
#include "parallel/zero.h"
#include "train/experiment.h"
#include "train/footprint.h"
#include "train/setup.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <optional>
#include <sstream>
#include <thread>

using namespace gt;
using namespace gt::test;

namespace {

struct Planned {
  Experiment exp;
  LoadedData data;
  Footprint f;
};

// What `gputrain check` computes, for a config given as text.
// `fuse`: Model::set_fusion (the CPU's fused chains store fewer outputs).
Planned plan(const std::string& yaml, const std::vector<std::string>& sets = {}, bool fuse = true) {
  ConfigNode root = ConfigNode::load_string(yaml, "t.yaml");
  for (const auto& s : sets) root = apply_override(root, s);
  Planned p{parse_experiment(root), {}, {}};
  p.data = load_data(p.exp);
  Model model = Model::build(p.exp.model, p.data.train.input_shape(), DType::f32, Device::cpu(), p.exp.seed,
                             /*init_params=*/false);
  model.set_fusion(fuse);
  apply_freeze(p.exp, model);
  apply_recompute(p.exp, model);
  p.f = training_footprint(p.exp, model, p.data.train);
  return p;
}

// A small GPT (configs/gpt_bytes.yaml's layers at toy sizes: a vocabulary of 32, 16 channels, 12 positions, a
// `repeat: 3` block of 2 heads and a 64-wide MLP, a tied head) on windows of 12 tokens, sized as `gputrain check`
// sizes a token config whose shards are not there, under dist.zero 3 at its default unit (block).
Planned plan_gpt(const std::vector<std::string>& sets = {}) {
  std::string layers;  // indented under model:
  std::istringstream in(gpt_layers(32, 16, 12, 3, 2, 64));
  for (std::string line; std::getline(in, line);) layers += "  " + line + "\n";
  ConfigNode root = ConfigNode::load_string(
      "name: gpt\nseed: 1\ndevice: cpu\ndata: {format: tokens, train: {path: none/train_*.bin}, block_size: 12, "
      "batch_size: 4}\nmodel:\n" +
          layers + "optimizer: {type: adamw, lr: 0.001}\ndist: {zero: 3}\n",
      "gpt.yaml");
  for (const auto& s : sets) root = apply_override(root, s);
  Planned p{parse_experiment_without_data_files(root), {}, {}};
  p.data.train.inputs = Tensor::empty(Shape{0, 12}, DType::f32);
  p.data.train.targets = Tensor::empty(Shape{0, 12}, DType::i32);
  p.data.train.num_classes = 32;
  Model model = Model::build(p.exp.model, Shape{12}, DType::f32, Device::cpu(), p.exp.seed, /*init_params=*/false);
  apply_freeze(p.exp, model);
  apply_recompute(p.exp, model);
  p.f = training_footprint(p.exp, model, p.data.train);
  return p;
}

const std::string kMlp = "name: mlp\nseed: 1\ndevice: cpu\n" +
                         synthetic_mlp({.samples = 64, .features = 784, .classes = 10, .batch = 32, .hidden = 128}) +
                         R"(optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
)";

void check_totals_are_row_sums(const Footprint& f) {
  int64_t params = 0, fwd = 0, bwd = 0;
  size_t param_bytes = 0, buffer_bytes = 0, act_bytes = 0;
  for (const LayerFootprint& r : f.layers) {
    params += r.params;
    fwd += r.forward_flops;
    bwd += r.backward_flops;
    param_bytes += r.param_bytes;
    buffer_bytes += r.buffer_bytes;
    act_bytes += r.activation_bytes;
  }
  CHECK(f.params == params);
  CHECK(f.forward_flops == fwd);
  CHECK(f.backward_flops == bwd);
  CHECK(f.param_bytes == param_bytes);
  CHECK(f.buffer_bytes == buffer_bytes);
  CHECK(f.activation_bytes == act_bytes);
  CHECK(f.grad_bytes == f.param_bytes);
  CHECK(f.total_bytes == f.param_bytes + f.grad_bytes + f.optimizer_bytes + f.buffer_bytes + f.activation_bytes +
                             f.batch_bytes + f.half_weight_bytes);
}

// A run of 6 images of 3x8x8 through a 4-channel convolution, then `layers`, then flatten and a linear head of 4,
// with train.recompute `mode`.
std::string recomputed_config(const std::string& layers, const std::string& mode) {
  return R"(name: recomputed
device: cpu
data: {format: synthetic, samples: 16, input_shape: [3, 8, 8], targets: {classes: 4}, batch_size: 6}
model:
  layers:
    - {type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}
)" + layers +
         R"(    - flatten
    - {type: linear, out_features: 4}
optimizer: {type: sgd, lr: 0.1}
train: {recompute: )" +
         mode + "}\n";
}

// `yaml`, a recomputed_config of 4-channel convolutions whose train.recompute is `mode`, keeps 3 of its
// 6x4x8x8 activations fewer than with recompute none; a model built from it allocates what its footprint says, and
// the report names the mode (`mode_name`, as written in the file).
void check_recomputed(const std::string& yaml, Recompute mode, const std::string& mode_name) {
  const Planned p = plan(yaml);
  const Footprint none = plan(yaml, {"train.recompute=none"}, /*fuse=*/false).f;  // recompute runs unfused too
  const Footprint& f = p.f;
  CHECK(f.recompute == mode);
  CHECK(none.activation_bytes - f.activation_bytes == static_cast<size_t>(3 * 6 * 4 * 8 * 8) * 4);
  Tensor x = Tensor::zeros(p.data.train.input_shape().batched(f.batch), DType::f32);
  const size_t start = host_storage_bytes();
  Model model = Model::build(p.exp.model, p.data.train.input_shape(), DType::f32, Device::cpu(), 1);
  REQUIRE(model.set_recompute(mode).empty());
  model.allocate(f.batch);
  model.forward(x, {true, false});
  CHECK(host_storage_bytes() - start == f.param_bytes + f.grad_bytes + f.buffer_bytes + f.activation_bytes);
  CHECK_THAT(footprint_report(f, judge_fit(f.total_bytes, Device::cpu(), f.total_bytes), ""),
             Catch::Contains("train.recompute: " + mode_name));
  check_totals_are_row_sums(f);
}

}  // namespace

TEST_CASE("check sizes an MLP as worked out by hand", "[cpu]") {
  const Footprint f = plan(kMlp, {}, /*fuse=*/false).f;  // layer by layer (the fused sizes: the next test)
  const int64_t B = 32;
  REQUIRE(f.layers.size() == 3);
  REQUIRE(f.batch == B);
  const LayerFootprint& l0 = f.layers[0];
  CHECK(l0.params == 784 * 128 + 128);  // 100480
  CHECK(l0.params == 100480);
  CHECK(l0.forward_flops == 2 * B * 784 * 128);
  CHECK(l0.backward_flops == 2 * l0.forward_flops);  // input and weight gradients
  CHECK(l0.param_bytes == 100480 * 4);
  CHECK(l0.activation_bytes == 2 * B * 128 * 4);  // output and its gradient (the relu after it learns nothing,
                                                  // but the linear before the gradient does)
  const LayerFootprint& relu = f.layers[1];
  CHECK(relu.params == 0);
  CHECK(relu.forward_flops == B * 128);
  CHECK(relu.backward_flops == B * 128);  // 1 × forward: no parameters
  CHECK(relu.activation_bytes == 2 * B * 128 * 4);
  const LayerFootprint& l2 = f.layers[2];
  CHECK(l2.params == 128 * 10 + 10);
  CHECK(l2.forward_flops == 2 * B * 128 * 10);
  CHECK(l2.activation_bytes == B * 10 * 4);  // the output only: its gradient is the loss's dout
  CHECK(l2.output.str() == "[32, 10]");
  // The step's tensors: x (f32) and class labels (i32); the loss's gradient overwrites the dense head's logits.
  CHECK(f.loss_in_place);
  CHECK(f.batch_bytes == static_cast<size_t>(B * 784 * 4 + B * 4));
  // SGD with momentum keeps one buffer per parameter.
  CHECK(f.optimizer_state_per_param == 1);
  CHECK(f.optimizer_bytes == f.param_bytes);
  CHECK(f.buffer_bytes == 0);
  check_totals_are_row_sums(f);
  CHECK(f.total_bytes ==
        static_cast<size_t>(3 * (100480 + 1290) * 4 + (2 * B * 128 * 4) * 2 + B * 10 * 4 + B * 784 * 4 + B * 4));
}

TEST_CASE("check sizes an MLP whose first dense layer runs its relu as an epilogue", "[cpu]") {
  const Footprint apart = plan(kMlp, {}, /*fuse=*/false).f, fused = plan(kMlp).f;
  const int64_t B = 32;
  // The dense layer's own output and its gradient are never stored; the gradient of x·Wᵀ + b that its backward
  // makes is the layers' shared scratch, counted in its row. The relu keeps its output and gradient.
  CHECK(fused.layers[0].activation_bytes == static_cast<size_t>(B * 128 * 4));
  CHECK(fused.layers[1].activation_bytes == static_cast<size_t>(2 * B * 128 * 4));
  CHECK(fused.total_bytes + B * 128 * 4 == apart.total_bytes);
  check_totals_are_row_sums(fused);
}

TEST_CASE("the optimizer state is what the configured optimizer keeps", "[cpu]") {
  const auto state = [](const std::string& optimizer) { return plan(kMlp, {"optimizer=" + optimizer}).f; };
  const Footprint sgd = state("{type: sgd, lr: 0.1}");
  CHECK(sgd.optimizer_state_per_param == 0);
  CHECK(sgd.optimizer_bytes == 0);
  const Footprint momentum = state("{type: sgd, lr: 0.1, momentum: 0.9}");
  CHECK(momentum.optimizer_bytes == momentum.param_bytes);
  const Footprint adam = state("{type: adam, lr: 0.001}");
  CHECK(adam.optimizer_state_per_param == 2);
  CHECK(adam.optimizer_bytes == 2 * adam.param_bytes);
  CHECK(adam.total_bytes == momentum.total_bytes + adam.param_bytes);
  const Footprint amsgrad = state("{type: adamw, lr: 0.001, amsgrad: true}");
  CHECK(amsgrad.optimizer_bytes == 3 * amsgrad.param_bytes);
  CHECK(amsgrad.optimizer == "adamw");
}

TEST_CASE("check sizes a CNN as worked out by hand", "[cpu]") {
  // relu first: nothing learns before it, so it keeps no gradient and has no backward; flatten is a view.
  const Footprint f = plan(R"(name: cnn
device: cpu
data:
  format: synthetic
  samples: 16
  input_shape: [1, 28, 28]
  targets: {classes: 10}
  batch_size: 8
model:
  layers:
    - relu
    - {type: conv2d, out_channels: 8, kernel_size: 3, padding: 1}
    - {type: maxpool2d, kernel_size: 2}
    - flatten
    - {type: linear, out_features: 10}
loss: cross_entropy
optimizer: {type: adam, lr: 0.001}
)")
                          .f;
  const int64_t B = 8;
  REQUIRE(f.layers.size() == 5);
  CHECK(f.layers[0].backward_flops == 0);
  CHECK(f.layers[0].activation_bytes == B * 784 * 4);
  const LayerFootprint& conv = f.layers[1];
  CHECK(conv.params == 8 * 1 * 3 * 3 + 8);
  CHECK(conv.forward_flops == B * 2 * 8 * 28 * 28 * 1 * 3 * 3);
  CHECK(conv.backward_flops == 2 * conv.forward_flops);
  CHECK(conv.activation_bytes == 2 * B * 8 * 28 * 28 * 4);
  const LayerFootprint& pool = f.layers[2];
  CHECK(pool.forward_flops == B * 8 * 14 * 14 * 2 * 2);  // one comparison per window element
  CHECK(pool.backward_flops == pool.forward_flops);
  CHECK(pool.activation_bytes == 2 * B * 8 * 14 * 14 * 4);
  const LayerFootprint& flat = f.layers[3];
  CHECK(flat.activation_bytes == 0);
  CHECK(flat.forward_flops == 0);
  CHECK(flat.backward_flops == 0);
  const LayerFootprint& fc = f.layers[4];
  CHECK(fc.params == 8 * 14 * 14 * 10 + 10);
  CHECK(fc.activation_bytes == B * 10 * 4);
  CHECK(f.optimizer_bytes == 2 * f.param_bytes);
  check_totals_are_row_sums(f);
}

TEST_CASE("every layer's shape-only sizes are what it allocates", "[cpu]") {
  // Measured: the host bytes a layer's init_params and first forward allocate, against param_numel (value and
  // gradient), buffer_numel and workspace (kept in f32). (Scratch, which a layer run alone without a model's
  // allocates for itself, comes with the first backward or evaluation, not a training forward.)
  const int64_t batch = 5;
  for (const auto& [type, c] : layer_cases()) {
    INFO(c.yaml);
    const ConfigNode cfg = ConfigNode::load_string(c.yaml, "case.yaml");
    std::unique_ptr<Layer> layer = find_layer(type)->make(cfg);
    std::vector<Shape> in_shapes{c.input};
    in_shapes.insert(in_shapes.end(), c.extra.begin(), c.extra.end());
    const Shape out_shape = layer->infer_shape(in_shapes, cfg);
    std::vector<Tensor> xs;
    std::vector<const Tensor*> xp;
    for (const Shape& s : in_shapes) xs.push_back(Tensor::zeros(s.batched(batch), DType::f64));
    for (const Tensor& x : xs) xp.push_back(&x);
    Tensor y = Tensor::zeros(out_shape.batched(batch), DType::f64);
    const size_t before = host_storage_bytes();
    Rng rng(1, 2);
    layer->init_params(rng, DType::f64, Device::cpu());
    layer->init_lora(rng, DType::f64, Device::cpu());
    layer->forward(xp, y, {true, false});
    CHECK(layer->workspace(batch, false).wide == layer->workspace_numel(batch));
    CHECK(layer->workspace(batch, false).half == 0);
    const int64_t expected = 2 * layer->param_numel() + layer->buffer_numel() + layer->workspace_numel(batch);
    CHECK(host_storage_bytes() - before == static_cast<size_t>(expected) * 8);
  }
}

TEST_CASE("a built model allocates what its footprint says", "[cpu]") {
  // Branches (a gradient written by two consumers needs scratch), a view, batch norm's buffers and layer norm's
  // workspace; sized from shapes, then built, allocated and run for real.
  const char* yaml = R"(name: measured
device: cpu
data:
  format: synthetic
  samples: 32
  input_shape: [3, 8, 8]
  targets: {classes: 4}
  batch_size: 6
model:
  layers:
    - {type: conv2d, name: stem, out_channels: 4, kernel_size: 3, padding: 1}
    - {type: batchnorm2d, name: bn}
    - {type: conv2d, name: branch, out_channels: 4, kernel_size: 1, inputs: bn}
    - {type: add, name: sum, inputs: [bn, branch]}
    - {type: relu, name: act}
    - {type: flatten, name: flat}
    - {type: layernorm, name: ln}
    - {type: dropout, p: 0.1}
    - {type: linear, out_features: 4}
loss: cross_entropy
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
)";
  for (const std::string optimizer : {"{type: sgd, lr: 0.1, momentum: 0.9}", "{type: adam, lr: 0.001}"})
    for (const std::string precision : {"fp32", "bf16", "fp16"}) {
      INFO(optimizer << ", " << precision);
      const Planned p = plan(yaml, {"optimizer=" + optimizer, "train.precision=" + precision});
      const Footprint& f = p.f;
      Tensor x = Tensor::zeros(p.data.train.input_shape().batched(f.batch), DType::f32);
      // Batch norm's saved statistics come with its parameters, layer norm's with the first forward: the sum is
      // what counts.
      const size_t start = host_storage_bytes();
      Model model = Model::build(p.exp.model, p.data.train.input_shape(), DType::f32, Device::cpu(), 1);
      CHECK(model.param_count() == f.params);
      apply_recompute(p.exp, model);  // and under bf16/fp16 the 16-bit activations, as a run sets them
      CHECK(model.activation_storage() == half_format(p.exp.train.precision));
      model.allocate(f.batch);
      model.forward(x, {true, false});
      CHECK(host_storage_bytes() - start == f.param_bytes + f.grad_bytes + f.buffer_bytes + f.activation_bytes);
      const int64_t scratch = 6 * 4 * 8 * 8;  // bn's gradient is written by branch and sum
      const int64_t ln = 2 * 6;               // layer norm's mean and inverse std, one per sample
      const int64_t image = 6 * 4 * 8 * 8, row = 6 * 256;
      // By hand: stem, bn, branch, sum and act keep an output and its gradient, flatten nothing (a view), layer
      // norm and dropout an output and a gradient of 256 per sample, the last linear its output alone.
      const int64_t gradients = 5 * image + scratch + 2 * row;
      const int64_t workspace = 4 * 4 /* bn: mean, 1/σ, and the affine map a fused chain reads */ + ln;
      const int64_t outputs = 5 * image + 2 * row;
      if (precision == "fp32") {
        CHECK(json_string(footprint_json(f, judge_fit(0, Device::cpu(), 0)).str(), "activation_dtype") == "f32");
        CHECK(f.activation_bytes == static_cast<size_t>(4 * (gradients + workspace + outputs + 6 * 4)));
      } else {
        // Every output but the last kept in 2 bytes, and the forward's working buffers: bn, branch and sum are live
        // together (stem's is free once bn has read it), so three of 4·8·8 per sample; act, layer norm and dropout
        // (256 per sample too) reuse them. (Without act, the copies would save just what the working buffers cost,
        // and every output would stay f32.)
        CHECK(f.activation_bytes == static_cast<size_t>(4 * (gradients + workspace + 3 * image + 6 * 4) + 2 * outputs));
        const MemoryFit fit = judge_fit(f.total_bytes, Device::cpu(), f.total_bytes);
        CHECK_THAT(footprint_report(f, fit, ""), Catch::Contains("the outputs kept for backward in " + precision));
        CHECK(json_string(footprint_json(f, fit).str(), "activation_dtype") == precision);
      }
      const size_t allocated = host_storage_bytes();
      const auto opt = make_optimizer(p.exp.optimizer, model.params());
      CHECK(host_storage_bytes() - allocated == f.optimizer_bytes);
      CHECK(f.optimizer_bytes > 0);
      check_totals_are_row_sums(f);
    }
}

TEST_CASE("a frozen model and a LoRA model allocate the gradients and optimizer state their footprints say", "[cpu]") {
  const char* yaml = R"(name: tuned
device: cpu
data: {format: synthetic, samples: 32, input_shape: [3, 8, 8], targets: {classes: 4}, batch_size: 6}
model:
  layers:
    - {type: conv2d, name: stem, out_channels: 4, kernel_size: 3, padding: 1}
    - {type: batchnorm2d, name: bn}
    - relu
    - flatten
    - {type: linear, name: fc, out_features: 32}
    - {type: layernorm, name: ln}
    - {type: linear, name: head, out_features: 4}
loss: cross_entropy
optimizer: {type: adam, lr: 0.001}
)";
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"+train.freeze=[stem.*, bn.weight]"},
      {"+train.lora={targets: [fc.weight, head.weight], rank: 2}"},
      {"+train.lora={targets: [fc.weight], rank: 3, dropout: 0.1, also_train: [head.*]}"},
  };
  size_t full_grads = 0;
  for (const auto& sets : variants) {
    INFO((sets.empty() ? std::string("plain") : sets[0]));
    const Planned p = plan(yaml, sets);
    const Footprint& f = p.f;
    Tensor x = Tensor::zeros(p.data.train.input_shape().batched(f.batch), DType::f32);
    const size_t start = host_storage_bytes();
    Model model = Model::build(p.exp.model, p.data.train.input_shape(), DType::f32, Device::cpu(), 1);
    apply_freeze(p.exp, model);
    apply_recompute(p.exp, model);
    CHECK(model.trainable_count() == f.trainable);
    model.allocate(f.batch);
    model.forward(x, {true, false});
    CHECK(host_storage_bytes() - start == f.param_bytes + f.grad_bytes + f.buffer_bytes + f.activation_bytes);
    const size_t allocated = host_storage_bytes();
    const auto opt = make_optimizer(p.exp.optimizer, model.params());
    CHECK(host_storage_bytes() - allocated == f.optimizer_bytes);
    CHECK(f.grad_bytes == static_cast<size_t>(f.trainable) * 4);
    if (sets.empty()) full_grads = f.grad_bytes;
    if (!sets.empty()) CHECK(f.grad_bytes < full_grads);
  }
}

TEST_CASE("a model with attention allocates what its footprint says, its q, k, v and output in 16 bits under bf16/fp16",
          "[cpu]") {
  // Three pre-norm attention blocks over sequences [12, 16]: each attention layer keeps its log-sum-exp and its q, k,
  // v and output (4 · 16 per position), in f32 or in 16 bits; one scratch, the size of one layer's, serves all three.
  const char* yaml = R"(name: attention
device: cpu
data: {format: synthetic, samples: 16, input_shape: [12, 16], targets: {classes: 4}, batch_size: 6}
model:
  layers:
    - {type: linear, out_features: 16}
    - repeat: 3
      name: h
      layers:
        - {type: layernorm, name: ln}
        - {type: causal_self_attention, name: attn, heads: 2}
        - {type: add, inputs: [input, attn]}
    - flatten
    - {type: linear, out_features: 4}
optimizer: {type: sgd, lr: 0.1}
)";
  const int64_t saved = 3 * 6 * 12 * 4 * 16;  // the three layers' q, k, v and outputs
  const int64_t scratch = 6 * 12 * (8 * 16 + 2);
  size_t fp32_bytes = 0;
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    INFO(precision);
    const Planned p = plan(yaml, {"train.precision=" + precision});
    const Footprint& f = p.f;
    Tensor x = Tensor::zeros(p.data.train.input_shape().batched(f.batch), DType::f32);
    const size_t start = host_storage_bytes();
    Model model = Model::build(p.exp.model, p.data.train.input_shape(), DType::f32, Device::cpu(), 1);
    apply_recompute(p.exp, model);
    model.allocate(f.batch);
    CHECK(model.layer_scratch_numel(f.batch) == scratch);
    model.forward(x, {true, false});
    CHECK(host_storage_bytes() - start == f.param_bytes + f.grad_bytes + f.buffer_bytes + f.activation_bytes);
    check_totals_are_row_sums(f);
    if (precision == "fp32") {
      fp32_bytes = f.activation_bytes;
    } else {
      REQUIRE(f.activation_storage);
      // The attention layers' copies save 2 of their 4 bytes, besides what the outputs' copies save. (fp32 runs each
      // residual add on its attention's product, a fused chain: the attention outputs and their gradients, which 16-bit
      // storage keeps, are not stored there.)
      const int64_t fused = 3 * 6 * 12 * 16 * 2 * 4;
      CHECK(fp32_bytes + static_cast<size_t>(fused) - f.activation_bytes >= static_cast<size_t>(saved) * 2);
    }
  }
}

TEST_CASE("with train.recompute: blocks a built model allocates what its footprint says, and less", "[cpu]") {
  // Two residual blocks: conv, batch norm and relu of each share one set of buffers; the blocks' adds, read by the
  // next block and the head, keep their own.
  const std::string yaml = recomputed_config(R"(    - repeat: 2
      name: res
      layers:
        - {type: conv2d, name: c, out_channels: 4, kernel_size: 3, padding: 1}
        - {type: batchnorm2d, name: bn}
        - {type: relu, name: r}
        - {type: add, inputs: [input, r]}
)",
                                             "blocks");
  check_recomputed(yaml, Recompute::blocks, "blocks");
}

TEST_CASE("with train.recompute: all a model with no block allocates what its footprint says, and less", "[cpu]") {
  // 9 nodes in segments of 3: [conv bn r] [c bn r2] [add flatten linear]. r and r2 are read by the add in the last
  // segment and keep their outputs; the other convolutions, batch norms and the add share two buffers.
  const std::string yaml = recomputed_config(R"(    - batchnorm2d
    - {type: relu, name: r}
    - {type: conv2d, name: c, out_channels: 4, kernel_size: 3, padding: 1}
    - batchnorm2d
    - {type: relu, name: r2}
    - {type: add, inputs: [r, r2]}
)",
                                             "all");
  check_recomputed(yaml, Recompute::all, "all");
  // blocks is refused here (no repeat: block), at the key.
  CHECK_THROWS_WITH(plan(yaml, {"train.recompute=blocks"}),
                    Catch::Contains("train.recompute") && Catch::Contains("no repeat: block"));
}

TEST_CASE("under bf16/fp16 check counts the weights' rounded copies as a training step makes them", "[cpu]") {
  // The copies are the conversion path's on OpenBLAS (bf16 on a CPU without avx512_bf16, or GPUTRAIN_CPU_BF16=convert)
  // and fp16's; bf16 on the native path, or on our f32 kernels (which round as they pack), keeps none, checked at the
  // end.
  std::optional<ForcedBf16Path> conversion(std::in_place, cpu::CpuBf16Path::conversion);
  std::optional<ForcedSgemmPath> openblas(std::in_place, cpu::CpuSgemmPath::openblas);
  // Every layer whose products read a weight: convolutions (3×3 and 1×1, whose im2col is skipped), attention's qkv
  // and proj, dense layers; layer norm reads its scale elementwise and is not counted. By hand, 4 bytes an element.
  struct Case {
    const char* yaml;
    size_t by_hand, entries;
  };
  const Case cases[] = {{R"(name: conv
device: cpu
data: {format: synthetic, samples: 16, input_shape: [2, 8, 8], targets: {classes: 4}, batch_size: 4}
model:
  layers:
    - {type: conv2d, out_channels: 8, kernel_size: 3, padding: 1}
    - {type: conv2d, out_channels: 8, kernel_size: 1}
    - flatten
    - {type: linear, out_features: 4}
optimizer: {type: sgd, lr: 0.1}
)",
                         (8 * 2 * 9 + 8 * 8 + 4 * 512) * 4, 3},
                        {R"(name: attention
device: cpu
data: {format: synthetic, samples: 16, input_shape: [8, 16], targets: {classes: 4}, batch_size: 4}
model:
  layers:
    - {type: layernorm}
    - {type: causal_self_attention, heads: 2}
    - flatten
    - {type: linear, out_features: 4}
optimizer: {type: sgd, lr: 0.1}
)",
                         (4 * 16 * 16 + 4 * 128) * 4, 3}};
  for (const Case& c : cases) {
    INFO(c.yaml);
    const Footprint fp32 = plan(c.yaml).f;
    CHECK(fp32.half_weight_bytes == 0);
    CHECK(fp32.precision == Precision::fp32);
    CHECK(plan(c.yaml, {"train.precision=tf32"}).f.half_weight_bytes == 0);
    CHECK_THAT(footprint_report(fp32, judge_fit(fp32.total_bytes, Device::cpu(), fp32.total_bytes), ""),
               !Catch::Contains("half weights") && Catch::Contains("train.precision fp32"));
    for (const char* precision : {"bf16", "fp16"}) {
      INFO(precision);
      const Planned p = plan(c.yaml, {std::string("train.precision=") + precision});
      const Footprint& f = p.f;
      CHECK(!f.bf16_in_pack);
      CHECK(f.half_weight_bytes == c.by_hand);
      CHECK(f.total_bytes == fp32.total_bytes + c.by_hand);
      // Two outputs before the last: their 16-bit copies would save less than the forward's working buffers cost,
      // so they stay f32 (Model::half_plan), and so do the bytes and the words.
      CHECK(f.activation_bytes == fp32.activation_bytes);
      check_totals_are_row_sums(f);
      const MemoryFit fit = judge_fit(f.total_bytes, Device::cpu(), f.total_bytes);
      CHECK_THAT(footprint_report(f, fit, ""), Catch::Contains("half weights") &&
                                                   Catch::Contains("activations included") &&
                                                   Catch::Contains(std::string("rounded to ") + precision));
      const std::string json = footprint_json(f, fit).str();
      CHECK(json_number(json, "half_weight_bytes") == static_cast<double>(c.by_hand));
      CHECK(json_string(json, "precision") == precision);
      CHECK(json_string(json, "activation_dtype") == "f32");
      // What a step holds: the copies a forward and backward make in the step's scope (the empty scope before it
      // frees the copies earlier tests left on this thread: none was read in it).
      Model model = Model::build(p.exp.model, p.data.train.input_shape(), DType::f32, Device::cpu(), 1);
      model.allocate(f.batch);
      const Tensor x = Tensor::zeros(p.data.train.input_shape().batched(f.batch), DType::f32);
      const Tensor dout = Tensor::zeros(model.output_shape().batched(f.batch), DType::f32);
      { const ProductPrecisionScope before(p.exp.train.precision); }
      const ProductPrecisionScope step(p.exp.train.precision);
      model.forward(x, {true, false});
      model.backward(dout, {true, false});
      CHECK(half_weight_cache_stats().entries == c.entries);
      CHECK(half_weight_cache_stats().bytes == f.half_weight_bytes);
    }
  }
  conversion.reset();
  openblas.reset();
  // bf16 whose kernels round the weights as they pack them: no copies, in the plan or in a step — natively, and on
  // the conversion path over our f32 kernels.
  struct InPack {
    cpu::CpuBf16Path bf16;
    bool runs;
    const char* skipped;
  };
  const bool own_sgemm =
      cpu::cpu_sgemm_supported(cpu::CpuSgemmPath::avx512) || cpu::cpu_sgemm_supported(cpu::CpuSgemmPath::avx2);
  for (const InPack& in : {InPack{cpu::CpuBf16Path::native, cpu::cpu_has_native_bf16(), "this CPU has no avx512_bf16"},
                           InPack{cpu::CpuBf16Path::conversion, own_sgemm, "this CPU runs no gputrain f32 kernel"}}) {
    if (!in.runs) {
      WARN("skipped: bf16 weights rounded in the kernels' packing on the "
           << (in.bf16 == cpu::CpuBf16Path::native ? "native" : "conversion") << " path (" << in.skipped << ")");
      continue;
    }
    const ForcedBf16Path forced(in.bf16);
    std::optional<ForcedSgemmPath> own;  // the conversion path rounds in packing only on our f32 kernels
    if (in.bf16 == cpu::CpuBf16Path::conversion)
      own.emplace(cpu::cpu_sgemm_supported(cpu::CpuSgemmPath::avx512) ? cpu::CpuSgemmPath::avx512
                                                                      : cpu::CpuSgemmPath::avx2);
    for (const Case& c : cases) {
      INFO(c.yaml);
      const Planned p = plan(c.yaml, {"train.precision=bf16"});
      CHECK(p.f.bf16_in_pack);
      CHECK(p.f.half_weight_bytes == 0);
      CHECK(p.f.total_bytes == plan(c.yaml).f.total_bytes);
      const MemoryFit fit = judge_fit(p.f.total_bytes, Device::cpu(), p.f.total_bytes);
      CHECK_THAT(footprint_report(p.f, fit, ""),
                 Catch::Contains("half weights") && Catch::Contains("rounded to bf16 as the kernels pack them"));
      Model model = Model::build(p.exp.model, p.data.train.input_shape(), DType::f32, Device::cpu(), 1);
      model.allocate(p.f.batch);
      const Tensor x = Tensor::zeros(p.data.train.input_shape().batched(p.f.batch), DType::f32);
      const Tensor dout = Tensor::zeros(model.output_shape().batched(p.f.batch), DType::f32);
      { const ProductPrecisionScope before(Precision::bf16); }
      const ProductPrecisionScope step(Precision::bf16);
      model.forward(x, {true, false});
      model.backward(dout, {true, false});
      CHECK(half_weight_cache_stats().entries == 0);
    }
  }
}

TEST_CASE("a model built without parameters allocates nothing", "[cpu]") {
  // 10^11 parameters: what `gputrain check` sizes without building.
  const ConfigNode cfg = ConfigNode::load_string("layers: [{type: linear, out_features: 1000000}]", "t.yaml");
  const size_t before = host_storage_bytes();
  const Model m =
      Model::build(parse_model_spec(cfg), Shape{100000}, DType::f32, Device::cpu(), 1, /*init_params=*/false);
  CHECK(host_storage_bytes() == before);
  CHECK(m.param_count() == int64_t{100000} * 1000000 + 1000000);
}

TEST_CASE("the fit verdict keeps a margin on a GPU and none on the CPU", "[cpu]") {
  const size_t GiB = size_t{1} << 30, MiB = size_t{1} << 20;
  // 80 GiB less 5 % (4 GiB) and 512 MiB.
  const size_t usable = 80 * GiB - 4 * GiB - 512 * MiB;
  CHECK(cuda_memory_margin(80 * GiB) == 4 * GiB + 512 * MiB);
  const MemoryFit yes = judge_fit(usable, Device::cuda(1), 80 * GiB);
  CHECK(yes.fits == true);
  CHECK(yes.usable == usable);
  CHECK(fit_line(yes) ==
        "fits on cuda:1: yes (needs 75.50 GiB of 75.50 GiB usable: 80.00 GiB less 5 % + 512 MiB "
        "for the CUDA context and library workspaces)");
  const MemoryFit no = judge_fit(usable + 1, Device::cuda(1), 80 * GiB);
  CHECK(no.fits == false);
  CHECK_THAT(fit_line(no), Catch::StartsWith("fits on cuda:1: no (needs 75.50 GiB of 75.50 GiB usable"));
  // A device smaller than the margin offers nothing.
  CHECK(judge_fit(1, Device::cuda(0), 256 * MiB).fits == false);
  const MemoryFit cpu = judge_fit(3 * GiB, Device::cpu(), 3 * GiB);
  CHECK(cpu.fits == true);
  CHECK(fit_line(cpu) == "fits on cpu: yes (needs 3.00 GiB of 3.00 GiB available)");
  CHECK(judge_fit(3 * GiB + 1, Device::cpu(), 3 * GiB).fits == false);
  // A device this machine does not have: unknown, saying why.
  MemoryFit unknown;
  unknown.device = "cuda";
  unknown.needed = GiB;
  unknown.basis = "device cuda: no usable GPU: no driver";
  CHECK(fit_line(unknown) == "fits on cuda: unknown (needs 1.00 GiB; device cuda: no usable GPU: no driver)");
  CHECK(format_bytes(320) == "320 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(45 * MiB + MiB / 2) == "45.5 MiB");
  CHECK(format_bytes(745 * GiB) == "745 GiB");
}

namespace {

const std::string kCheckConfig =
    "name: synth\nseed: 7\ndevice: cpu\n" +
    synthetic_mlp({.samples = 8, .features = 100000, .classes = 4, .batch = 2, .hidden = 16}) +
    R"(optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
)";

// Runs `gputrain <args>` with stdout alone into a file; the exit code.
int run_to_file(const std::string& args, const std::string& out) {
  const int rc = std::system((gputrain_binary() + " " + args + " > " + out + " 2>/dev/null").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

TEST_CASE("gputrain check prints the dry run and says whether it fits", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", kCheckConfig);
  const auto small = run_gputrain("check " + (dir / "c.yaml"));
  INFO(small.output);
  REQUIRE(small.exit_code == 0);
  CHECK_THAT(small.output, Catch::Contains("8 training samples; batch 2") &&
                               Catch::Contains(fmt::format("{:<12} {:<10} {:<18} {:>12}", "layers.0", "linear",
                                                           "[2, 16]", 1600016)) &&
                               Catch::Contains("fwd MFLOP") && Catch::Contains("activations") &&
                               Catch::Contains("sgd: 1 state value per parameter") &&
                               Catch::Contains("fits on cpu: yes (needs 0.02 GiB of "));

  // 10^11 parameters: sized from shapes, never allocated (it would take 1.1 TiB), so this returns at once.
  const auto huge = run_gputrain("check " + (dir / "c.yaml") + " --set model.layers[0].out_features=1000000");
  INFO(huge.output);
  REQUIRE(huge.exit_code == 0);
  const int64_t B = 2, hidden = 1000000;
  const int64_t params = 100000 * hidden + hidden + hidden * 4 + 4;
  // Values, gradients and momentum; the relu's output and gradient, and the gradient of the product before it in
  // the layers' scratch (the linear runs the relu as its epilogue, so its own output and gradient are not stored:
  // Model::chains); the last output; x and y (the loss writes its gradient over the dense head's output).
  const int64_t needed = 3 * params * 4 + 3 * (B * hidden * 4) + B * 4 * 4 + B * 100000 * 4 + B * 4;
  CHECK_THAT(huge.output, Catch::Contains(fmt::format("fits on cpu: no (needs {:.2f} GiB of ",
                                                      static_cast<double>(needed) / (1 << 30))));

  // --json: one object on stdout that Python parses, with totals that add up and the verdict as a boolean.
  REQUIRE(run_to_file("check " + (dir / "c.yaml") + " --set model.layers[0].out_features=1000000 --json",
                      dir / "huge.json") == 0);
  const std::string json = read_text(dir / "huge.json");
  CHECK(json_number(json, "needed_bytes") == static_cast<double>(needed));
  const std::string py =
      "python3 -c \"import json,sys; j=json.load(open(sys.argv[1])); t=j['totals']; L=j['layers']; "
      "assert j['fits'] is False and j['device'] == 'cpu' and j['batch'] == 2 and j['dtype'] == 'f32'; "
      "assert [l['name'] for l in L] == ['layers.0', 'layers.1', 'layers.2']; "
      "assert all(t[k] == sum(l[k] for l in L) for k in ('params', 'forward_flops', 'backward_flops', "
      "'activation_bytes', 'param_bytes', 'buffer_bytes')); "
      "assert t['total_bytes'] == sum(t[k] for k in ('param_bytes', 'grad_bytes', 'optimizer_bytes', 'buffer_bytes', "
      "'activation_bytes', 'batch_bytes')) == j['needed_bytes']; "
      "assert j['usable_bytes'] < j['needed_bytes'] and j['train_samples'] == 8\" ";
  CHECK(std::system((py + (dir / "huge.json")).c_str()) == 0);
  REQUIRE(run_to_file("check " + (dir / "c.yaml") + " --json", dir / "small.json") == 0);
  CHECK(std::system(("python3 -c \"import json,sys; j=json.load(open(sys.argv[1])); assert j['fits'] is True\" " +
                     (dir / "small.json"))
                        .c_str()) == 0);

  // --world-size: the four ZeRO stages per rank, and the configured one with dist.offload: optimizer (on the CPU its
  // host copies, momentum, masters and gradients of every parameter at stage 0, come on top of the rest), the
  // configured one (dist.zero, 0 by default) as per_rank_bytes; one rank at stage 0 holds what the plain check says.
  REQUIRE(run_to_file("check " + (dir / "c.yaml") + " --json --world-size 4", dir / "ranks.json") == 0);
  CHECK(std::system(("python3 -c \"import json,sys; j=json.load(open(sys.argv[1])); s=j['zero_stages']; "
                     "assert j['world_size'] == 4 and [x['stage'] for x in s] == [0, 1, 2, 3, 0]; "
                     "assert s[4]['offload'] is True and s[4]['optimizer_bytes'] == 0; "
                     "assert s[4]['host_bytes'] == 4 * 3 * (68 + 1600016); "
                     "assert s[4]['per_rank_bytes'] == s[0]['per_rank_bytes'] - s[0]['optimizer_bytes'] + "
                     "s[4]['host_bytes']; "
                     "assert j['zero_stage'] == 0; "
                     "assert j['per_rank_bytes'] == s[0]['per_rank_bytes'] == j['totals']['total_bytes']; "
                     // Buckets of 68 and 1600016 gradients (the first capped at 1 MB): chunks of 17 and 400004 of
                     // momentum, and the all-gather's buffers for the larger (a chunk, and 4 of them): more than
                     // stage 1 saves with one bucket this large.
                     "assert s[1]['optimizer_bytes'] == 4 * (17 + 400004); "
                     "assert s[1]['gather_bytes'] == 4 * 5 * 400004; "
                     "assert s[1]['per_rank_bytes'] == s[0]['per_rank_bytes'] - s[0]['optimizer_bytes'] + "
                     "s[1]['optimizer_bytes'] + s[1]['gather_bytes']; "
                     "assert s[2]['optimizer_bytes'] == s[1]['optimizer_bytes']; "
                     // Stage 2: the chunks and both buckets whole at once during backward (overlap).
                     "assert s[2]['grad_bytes'] == 4 * (17 + 400004 + 68 + 1600016); "
                     // Stage 3: no repeat: block, so the units are the buckets: the weights' chunks and both units
                     // whole in a pass; the gradients' chunks and one bucket at a time (no overlap thread).
                     "assert s[3]['param_bytes'] == s[3]['whole_weight_bytes'] == 4 * (17 + 400004 + 68 + 1600016); "
                     "assert s[3]['grad_bytes'] == 4 * (17 + 400004 + 1600016); "
                     "assert s[2]['fits'] is True and j['advice'] == ''\" " +
                     (dir / "ranks.json"))
                        .c_str()) == 0);
  REQUIRE(run_to_file("check " + (dir / "c.yaml") + " --json --world-size 4 --set dist.zero=1", dir / "z1.json") == 0);
  CHECK(std::system(("python3 -c \"import json,sys; j=json.load(open(sys.argv[1])); s=j['zero_stages']; "
                     "assert j['zero_stage'] == 1 and j['per_rank_bytes'] == s[1]['per_rank_bytes']\" " +
                     (dir / "z1.json"))
                        .c_str()) == 0);
  // dist.zero 3 configured: its column is the one reported (it once read past the three stages sized).
  REQUIRE(run_to_file("check " + (dir / "c.yaml") + " --json --world-size 4 --set dist.zero=3", dir / "z3.json") == 0);
  CHECK(std::system(("python3 -c \"import json,sys; j=json.load(open(sys.argv[1])); s=j['zero_stages']; "
                     "assert j['zero_stage'] == 3 and j['per_rank_bytes'] == s[3]['per_rank_bytes']\" " +
                     (dir / "z3.json"))
                        .c_str()) == 0);
  const auto ranks = run_gputrain("check " + (dir / "c.yaml") + " --world-size 2 --set dist.zero=3");
  INFO(ranks.output);
  CHECK(ranks.exit_code == 0);
  CHECK_THAT(ranks.output, Catch::Contains("per rank at 2 ranks") && Catch::Contains("zero 2") &&
                               Catch::Contains("zero 3*") && Catch::Contains("gather buffers") &&
                               Catch::Contains("make every unit whole for a moment"));
  CHECK(run_gputrain("check " + (dir / "c.yaml") + " --world-size 0").exit_code == 2);

  // A device this machine may lack: still exit 0, with a yes/no when it is here and the reason when it is not.
  const auto gpu = run_gputrain("check " + (dir / "c.yaml") + " --set device=cuda");
  INFO(gpu.output);
  CHECK(gpu.exit_code == 0);
  CHECK_THAT(gpu.output, Catch::Contains("fits on cuda:0: yes (needs") || Catch::Contains("fits on cuda: unknown ("));

  // A bad config is still a config error, with or without --json.
  CHECK(run_gputrain("check " + (dir / "c.yaml") + " --set model.layers[0].out_features=-1").exit_code == 2);
  CHECK(run_gputrain("check " + (dir / "c.yaml") + " --json --set optimizer.lr=abc").exit_code == 2);
}

TEST_CASE("under dist.zero 2 ranks allocate the gradients check counts, and keep only their chunks after a step",
          "[cpu][dist]") {
  // Two thread ranks in this process, each with its model, sharded optimizer and GradSync over one bucket per layer
  // (650, 8256 and 100480 gradients); the process's storage counters see both, and the ranks hold the same sizes.
  const std::string layers =
      "model.layers=[{type: linear, out_features: 128}, relu, {type: linear, out_features: 64}, tanh, "
      "{type: linear, out_features: 10}]";
  constexpr int kRanks = 2;
  for (const bool overlap : {false, true})
    for (const int64_t accumulate : {1, 2}) {
      INFO("overlap " << overlap << ", accumulate " << accumulate);
      const Planned p = plan(kMlp, {"optimizer={type: adam, lr: 0.001}", "+dist={bucket_mb: 0.001}", layers,
                                    fmt::format("train.accumulate={}", accumulate)});
      const Footprint& f = p.f;
      REQUIRE(f.grad_buckets == std::vector<int64_t>{650, 8256, 100480});
      const RankShare share =
          rank_shares(f, kRanks, [](size_t b) { return judge_fit(b, Device::cpu(), size_t{1} << 40); })[2];
      size_t chunk_bytes = 0;
      for (int64_t n : f.grad_buckets) chunk_bytes += zero_chunk(static_cast<size_t>(n), kRanks) * 4;
      auto comms = make_thread_comms(kRanks, 30.0);
      size_t with_grads = 0, without = 0, peak = 0, after = 0;
      std::vector<size_t> undefined(kRanks), chunks(kRanks);
      std::vector<std::thread> threads;
      for (int r = 0; r < kRanks; ++r)
        threads.emplace_back([&, r] {
          Communicator& comm = *comms[static_cast<size_t>(r)];
          auto barrier = [&comm] {
            double d = 0;
            comm.allreduce_sum(&d, 1, "a barrier");
          };
          Model model = Model::build(p.exp.model, p.data.train.input_shape(), DType::f32, Device::cpu(), 1);
          model.allocate(f.batch);
          Tensor x = Tensor::zeros(p.data.train.input_shape().batched(f.batch), DType::f32);
          Tensor dout = Tensor::zeros(model.output_shape().batched(f.batch), DType::f32);
          ZeroOptimizer zero(p.exp.optimizer, model.params(),
                             plan_buckets(model.params_by_node(), p.exp.dist.bucket_mb), comm, 2);
          for (const Tensor& c : zero.grad_chunks()) chunks[static_cast<size_t>(r)] += static_cast<size_t>(c.bytes());
          // A plain pass first, so that whatever a layer allocates on its first call is there before counting.
          model.forward(x, {true, false});
          model.backward(dout, {true, false});
          barrier();
          if (r == 0) with_grads = host_storage_bytes();
          barrier();
          {
            GradSync sync(comm, model.params_by_node(), p.exp.dist.bucket_mb, overlap, zero.grad_chunks());
            barrier();
            if (r == 0) {
              without = host_storage_bytes();
              reset_host_storage_peak();
            }
            barrier();
            model.set_grad_begin_hook([&sync](size_t i) { sync.node_begin(i); });
            model.set_grad_ready_hook([&sync](size_t i) { sync.node_done(i); });
            for (int64_t k = 0; k < accumulate; ++k) {
              const LayerContext ctx{.training = true, .accumulate_grads = k > 0, .step = static_cast<uint64_t>(k)};
              model.forward(x, ctx);
              if (k == accumulate - 1) sync.arm();
              model.backward(dout, ctx);
            }
            sync.finish();
            barrier();
            if (r == 0) {
              peak = host_storage_peak_bytes();
              after = host_storage_bytes();
            }
            for (Param* q : model.params()) undefined[static_cast<size_t>(r)] += q->grad.defined() ? 0 : 1;
            model.set_grad_begin_hook(nullptr);
            model.set_grad_ready_hook(nullptr);
            barrier();
          }
        });
      for (auto& t : threads) t.join();
      for (int r = 0; r < kRanks; ++r) {
        CHECK(chunks[static_cast<size_t>(r)] == chunk_bytes);
        CHECK(undefined[static_cast<size_t>(r)] == 6);  // three weights and three biases
      }
      // GradSync frees the whole gradients; after the step each rank holds its chunks alone again.
      CHECK(with_grads - without == kRanks * f.grad_bytes);
      CHECK(after == without);
      // What backward held whole, per rank, beyond the chunks: check's figure exactly where it is certain (every
      // bucket with accumulation; without overlap one at a time, so the largest), and at most it with overlap.
      const size_t whole = (peak - without) / kRanks, counted = share.grad_bytes - chunk_bytes;
      CHECK((peak - without) % kRanks == 0);
      if (accumulate > 1)
        CHECK(whole == counted);
      else if (!overlap)
        CHECK(whole == 100480 * 4);
      else
        CHECK((whole >= 100480 * 4 && whole <= counted));
      CHECK(counted == (accumulate > 1 ? 650 + 8256 + 100480 : 8256 + 100480) * 4);
    }
}

TEST_CASE("check --world-size splits optimizer state over the ranks (zero 1 to 3) and gradients (zero 2 and 3)",
          "[cpu]") {
  const Footprint f = plan(kMlp, {"optimizer={type: adam, lr: 0.001}"}).f;
  const auto judge = [](size_t limit) {
    return [limit](size_t bytes) { return judge_fit(bytes, Device::cpu(), limit); };
  };
  // One rank holds everything under every stage: today's totals.
  for (const RankShare& r : rank_shares(f, 1, judge(size_t{1} << 40))) {
    CHECK(r.total_bytes == f.total_bytes);
    CHECK(r.fit.fits == true);
  }
  // Four ranks: 101770 parameters make shards of ⌈101770 / 4⌉ = 25443 elements; Adam keeps two states per element.
  REQUIRE(f.params == 101770);
  const std::vector<RankShare> four = rank_shares(f, 4, judge(size_t{1} << 40));
  REQUIRE(four.size() == 4);
  const size_t shard = 25443 * 4, whole = f.param_bytes + f.buffer_bytes + f.activation_bytes + f.batch_bytes;
  CHECK(four[0].total_bytes == f.total_bytes);
  CHECK(four[0].gather_bytes == 0);
  CHECK(four[1].optimizer_bytes == 2 * shard);
  // ZeroOptimizer's all-gather buffers: one chunk to send, every rank's chunk of the bucket to receive.
  CHECK(four[1].gather_bytes == (25443 + 4 * 25443) * 4);
  CHECK(four[1].total_bytes == whole + f.grad_bytes + 2 * shard + four[1].gather_bytes);
  // Stage 2: one bucket (101770 elements fit the first bucket's 1 MB): its chunk of 25443, and the bucket whole
  // (padded to 4 · 25443) while backward writes it. More than stage 1 then; smaller buckets make it less.
  REQUIRE(f.grad_buckets == std::vector<int64_t>{101770});
  CHECK(four[2].grad_bytes == (25443 + 4 * 25443) * 4);
  CHECK(four[2].optimizer_bytes == 2 * shard);
  CHECK(four[2].total_bytes == whole + four[2].grad_bytes + 2 * shard + four[2].gather_bytes);
  // Stage 3: the MLP has no repeat: block, so its one unit is the bucket: a chunk of the weights kept, the unit
  // whole (padded) while a pass runs, and as stage 2's gradients; all of it whole only for a moment. It gathers no
  // weights after the step, so it keeps no all-gather buffers (a checkpoint makes them for its moment).
  REQUIRE(f.shard_units == f.grad_buckets);
  CHECK(four[3].param_bytes == (25443 + 4 * 25443) * 4);
  CHECK(four[3].whole_weight_bytes == (25443 + 4 * 25443) * 4);
  CHECK(four[3].grad_bytes == four[2].grad_bytes);
  CHECK(four[3].optimizer_bytes == 2 * shard);
  CHECK(four[3].gather_bytes == 0);
  CHECK(four[3].total_bytes ==
        whole - f.param_bytes + four[3].param_bytes + four[3].grad_bytes + 2 * shard + four[3].gather_bytes);
  // With 0.1 MB buckets (25000 elements): 1290 first, then the 100480 of the first layer alone (one node, one
  // bucket). Chunks of 323 and 25120; the two buckets whole at once (1292 + 100480) during backward, and also with
  // train.accumulate, where the micro-batches before the last keep what they write.
  const Footprint small = plan(kMlp, {"optimizer={type: adam, lr: 0.001}", "+dist={bucket_mb: 0.1}"}).f;
  REQUIRE(small.grad_buckets == std::vector<int64_t>{1290, 100480});
  CHECK(rank_shares(small, 4, judge(size_t{1} << 40))[2].grad_bytes == (323 + 25120 + 1292 + 100480) * 4);
  // Three layers in 0.001 MB buckets (one each): at most two whole at once, so the two largest count.
  const Footprint three = plan(kMlp, {"optimizer={type: adam, lr: 0.001}", "+dist={bucket_mb: 0.001}",
                                      "model.layers=[{type: linear, out_features: 128}, {type: linear, out_features: "
                                      "64}, {type: linear, out_features: 10}]"})
                              .f;
  REQUIRE(three.grad_buckets == std::vector<int64_t>{650, 8256, 100480});
  CHECK(rank_shares(three, 2, judge(size_t{1} << 40))[2].grad_bytes == (325 + 4128 + 50240 + 8256 + 100480) * 4);
  const Footprint three_acc =
      plan(kMlp, {"optimizer={type: adam, lr: 0.001}", "+dist={bucket_mb: 0.001}", "train.accumulate=2",
                  "model.layers=[{type: linear, out_features: 128}, {type: linear, "
                  "out_features: 64}, {type: linear, out_features: 10}]"})
          .f;
  CHECK(rank_shares(three_acc, 2, judge(size_t{1} << 40))[2].grad_bytes ==
        (325 + 4128 + 50240 + 650 + 8256 + 100480) * 4);
  // On a GPU GradSync's ring holds the buckets: two slots taking turns, each grown to the largest bucket it held
  // (at most two of the largest); with accumulation every bucket stays whole for the run.
  const auto on_gpu = [](size_t bytes) { return judge_fit(bytes, Device::cuda(0), size_t{1} << 40); };
  CHECK(rank_shares(three, 2, on_gpu)[2].grad_bytes == (325 + 4128 + 50240 + 2 * 100480) * 4);
  CHECK(rank_shares(three_acc, 2, on_gpu)[2].grad_bytes == (325 + 4128 + 50240 + 650 + 8256 + 100480) * 4);
  // One rank splits nothing.
  CHECK(rank_shares(small, 1, judge(size_t{1} << 40))[2].grad_bytes == small.grad_bytes);

  // Nothing fits at 4 ranks: a halved micro-batch with twice the accumulation would (the activations halve), and
  // so would more ranks; the MLP has no block to recompute, and too few layers for all (both refused, so not offered).
  REQUIRE(four[3].total_bytes < four[1].total_bytes);  // one unit, but no all-gather buffers: stage 3 holds least
  const size_t limit = four[3].total_bytes - 1;
  std::vector<std::string> asked;
  const FootprintWith with = [&](Recompute mode, int64_t batch, int64_t accumulate) -> std::optional<Footprint> {
    asked.push_back(fmt::format("{} {} {}", to_string(mode), batch, accumulate));
    if (mode != Recompute::none) return std::nullopt;
    return plan(kMlp, {"optimizer={type: adam, lr: 0.001}", fmt::format("data.batch_size={}", batch),
                       fmt::format("train.accumulate={}", accumulate)})
        .f;
  };
  const std::string advice = fit_advice(f, 4, judge(limit), with);
  INFO(advice);
  CHECK_THAT(advice, Catch::StartsWith("nothing fits; what would:") &&
                         Catch::Contains("data.batch_size: 16 with train.accumulate: 2 (the same 32 samples per step), "
                                         "with zero 3") &&
                         Catch::Contains("8 ranks, with zero 3"));
  CHECK_FALSE(Catch::Contains("recompute").match(advice));
  CHECK(asked == std::vector<std::string>{"blocks 32 1", "all 32 1", "none 16 2"});
  // When a stage fits there is nothing to advise.
  CHECK(fit_advice(f, 4, judge(four[3].total_bytes), with).empty());
}

TEST_CASE("check --world-size sizes dist.zero 3 by its units: a GPT's blocks, embeddings and head, by hand", "[cpu]") {
  const auto judge = [](size_t bytes) { return judge_fit(bytes, Device::cpu(), size_t{1} << 40); };
  const Planned p = plan_gpt();
  const Footprint& f = p.f;
  // Per block: two layer norms of 16 + 16, attention's qkv 16·48 + 48 and proj 16·16 + 16, fc 16·64 + 64, proj
  // 64·16 + 16 = 3280; the embeddings 32·16 + 12·16 = 704, ln_f 32; the tied head has none of its own. From the last
  // node to the first: ln_f, the blocks h.2, h.1, h.0, the embeddings.
  REQUIRE(f.trainable == 32 + 3 * 3280 + 704);
  REQUIRE(f.shard_units == std::vector<int64_t>{32, 3280, 3280, 3280, 704});
  const std::vector<RankShare> two = rank_shares(f, 2, judge);
  REQUIRE(two.size() == 4);
  const RankShare& z3 = two[3];
  // Chunks of 16, 1640 (three times) and 352: 5288 per rank of the weights, the gradients and each AdamW buffer.
  const size_t chunks = 16 + 3 * 1640 + 352;
  // Weights: the chunks, and two blocks whole during a pass (consecutive blocks are the two largest units), and the
  // next one gathered ahead of its layers (dist.overlap, the default); without overlap two.
  CHECK(z3.param_bytes == (chunks + 3 * 3280) * 4);
  CHECK(rank_shares(plan_gpt({"dist.overlap=false"}).f, 2, judge)[3].param_bytes == (chunks + 2 * 3280) * 4);
  // Gradients: the chunks, the embeddings' bucket (the tied head writes it first, and it stays whole until the
  // embedding's own backward at the end) and one block's at a time.
  CHECK(z3.grad_bytes == (chunks + 704 + 3280) * 4);
  CHECK(z3.optimizer_bytes == chunks * 2 * 4);
  // No weights gathered after the step: no all-gather buffers (stage 2: its one bucket's chunk, and both ranks').
  CHECK(z3.gather_bytes == 0);
  CHECK(two[2].gather_bytes == 5288 * 3 * 4);
  CHECK(z3.half_weight_bytes == 0);
  CHECK(z3.whole_weight_bytes == (chunks + f.trainable) * 4);  // evaluation, checkpoints: every unit whole
  CHECK(z3.total_bytes == z3.param_bytes + z3.grad_bytes + z3.optimizer_bytes + z3.gather_bytes + f.buffer_bytes +
                              f.activation_bytes + f.batch_bytes);
  // Stage 3 holds the least of the four here: its weights are less than whole, its gradients less than stage 2's.
  for (size_t s = 0; s < 3; ++s) CHECK(z3.total_bytes < two[s].total_bytes);
  // With train.accumulate every unit's bucket is whole from the first micro-batch to the last one's backward.
  const RankShare acc = rank_shares(plan_gpt({"train.accumulate=2"}).f, 2, judge)[3];
  CHECK(acc.grad_bytes == (chunks + static_cast<size_t>(f.trainable)) * 4);
  // dist.shard_unit: bucket shards by the gradient buckets (here a 1 MB first bucket takes every parameter).
  const Footprint buckets = plan_gpt({"dist.shard_unit=bucket"}).f;
  REQUIRE(buckets.shard_units == buckets.grad_buckets);
  REQUIRE(buckets.shard_units == std::vector<int64_t>{f.trainable});
  CHECK(rank_shares(buckets, 2, judge)[3].param_bytes == (5288 + 10576) * 4);
  // A frozen weight is sharded with its unit, without gradient or state: wpe's 12·16 leave the embeddings' unit's
  // parameters that learn (512 left, chunk 256) for its frozen part (chunk 96).
  const Footprint frozen = plan_gpt({"+train.freeze=[wpe.*]"}).f;
  REQUIRE(frozen.shard_units == std::vector<int64_t>{32, 3280, 3280, 3280, 512});
  REQUIRE(frozen.shard_unit_frozen == std::vector<int64_t>{0, 0, 0, 0, 192});
  CHECK(rank_shares(frozen, 2, judge)[3].param_bytes == (16 + 3 * 1640 + 256 + 96 + 3 * 3280) * 4);
  CHECK(rank_shares(frozen, 2, judge)[3].optimizer_bytes == (16 + 3 * 1640 + 256) * 2 * 4);
  // dist.offload beside stage 3: on a GPU the device sheds AdamW's two buffers of its chunks; the host holds them,
  // a master copy and a gradient copy (4 elements per element updated); on the CPU the host is the device.
  const auto gpu = [](size_t bytes) { return judge_fit(bytes, Device::cuda(0), size_t{1} << 40); };
  const RankShare z3_gpu = rank_shares(f, 2, gpu)[3];
  const RankShare off = offload_share(f, z3_gpu, gpu);
  CHECK(off.offload);
  CHECK(off.optimizer_bytes == 0);
  CHECK(off.host_bytes == chunks * 4 * 4);
  CHECK(off.total_bytes == z3_gpu.total_bytes - z3_gpu.optimizer_bytes);
  CHECK(offload_share(f, z3, judge).total_bytes == z3.total_bytes - z3.optimizer_bytes + chunks * 4 * 4);
  // At one rank nothing is sharded: every stage is the plain check's.
  for (const RankShare& r : rank_shares(f, 1, judge)) CHECK(r.total_bytes == f.total_bytes);

  // fp16 (rounded copies on the CPU, 4 bytes an element): per block attention's 4·16·16, fc's and proj's 16·64; the
  // head's copy of the 32·16 table. Stage 3 keeps at most two units' copies: two blocks'. With wte frozen the
  // head's copy is still of a weight in a unit (the embeddings', frozen part), smaller than a block's.
  const Footprint half = plan_gpt({"train.precision=fp16"}).f;
  REQUIRE(half.half_weight_bytes == (3 * 3 * 1024 + 512) * 4);
  const std::vector<RankShare> half_two = rank_shares(half, 2, judge);
  for (size_t s = 0; s < 3; ++s) CHECK(half_two[s].half_weight_bytes == half.half_weight_bytes);
  CHECK(half_two[3].half_weight_bytes == 2 * 3 * 1024 * 4);
  // (The rest is as under fp32: stage 3 saves the same, and the copies it does not keep.)
  CHECK(half_two[0].total_bytes - half_two[3].total_bytes ==
        two[0].total_bytes - z3.total_bytes + half.half_weight_bytes - half_two[3].half_weight_bytes);
  const Footprint half_frozen = plan_gpt({"train.precision=fp16", "+train.freeze=[wte.*]"}).f;
  CHECK(rank_shares(half_frozen, 2, judge)[3].half_weight_bytes == 2 * 3 * 1024 * 4);

  // What fits is said with stage 3 where only it fits: at 2 ranks with z3's bytes nothing is to be advised; a byte
  // less and 4 ranks would, at stage 3 alone.
  const auto under = [](size_t limit) {
    return [limit](size_t bytes) { return judge_fit(bytes, Device::cpu(), limit); };
  };
  const FootprintWith with = [](Recompute mode, int64_t batch, int64_t accumulate) -> std::optional<Footprint> {
    return plan_gpt({fmt::format("train.recompute={}", to_string(mode)), fmt::format("data.batch_size={}", batch),
                     fmt::format("train.accumulate={}", accumulate)})
        .f;
  };
  CHECK(fit_advice(f, 2, under(z3.total_bytes), with).empty());
  const std::string advice = fit_advice(f, 2, under(z3.total_bytes - 1), with);
  CHECK_THAT(advice, Catch::StartsWith("nothing fits; what would:") && Catch::Contains("  4 ranks, with zero 3 ("));
  CHECK_FALSE(Catch::Contains("dist.offload").match(advice));  // on the CPU the host is the device: nothing saved
  // On a GPU with a byte less than stage 3 needs, the optimizer state on the host would make a stage fit.
  const auto gpu_under = [](size_t cap) {
    return [cap](size_t bytes) {
      MemoryFit m;
      m.device = "cuda:0";
      m.needed = bytes;
      m.usable = cap;
      m.fits = bytes <= cap;
      return m;
    };
  };
  const size_t least_gpu = rank_shares(f, 2, gpu_under(size_t{1} << 40))[3].total_bytes;
  const std::string offload_advice = fit_advice(f, 2, gpu_under(least_gpu - 1), with);
  INFO(offload_advice);
  CHECK_THAT(offload_advice,
             Catch::Contains("  dist.offload: optimizer, with zero ") && Catch::Contains("of host memory)"));

  // The report's four columns, the configured one marked, and the JSON's configured stage 3.
  std::vector<RankShare> with_offload = two;
  with_offload.push_back(offload_share(f, z3, judge));
  CHECK_THAT(rank_shares_report(with_offload, 2, 3, true),
             Catch::Contains("zero 3+off*") && Catch::Contains("host (offload)"));
  JsonObject offloaded;
  add_rank_shares_json(offloaded, with_offload, 2, 3, true);
  CHECK(json_number(offloaded.str(), "per_rank_bytes") == static_cast<double>(with_offload.back().total_bytes));
  const std::string report = rank_shares_report(two, 2, 3);
  CHECK_THAT(report, Catch::Contains("zero 0 ") && Catch::Contains("zero 3*") && Catch::Contains("gather buffers") &&
                         Catch::Contains("make every unit whole for a moment"));
  JsonObject out;
  add_rank_shares_json(out, two, 2, 3);
  CHECK(json_number(out.str(), "per_rank_bytes") == static_cast<double>(z3.total_bytes));
  CHECK(out.str().find("\"whole_weight_bytes\"") != std::string::npos);
}

TEST_CASE("under dist.zero 3 ranks allocate the weights and gradients check counts, and keep only their chunks",
          "[cpu][dist]") {
  // Two thread ranks in this process, each with the GPT of plan_gpt, ZeroOptimizer at stage 3 and GradSync over
  // zero_plan's units, wired as StepLoop wires them: the parameter-use hook gathers a unit, the gradient hooks
  // allocate and reduce-scatter the buckets on the training thread, and the units are released after finish. The
  // process's storage counters see both ranks, which hold the same sizes (rank 1's optimizer state aside).
  // Under fp16 the products read rounded copies of the weights (f32 on the CPU), which stage 3 keeps for at most
  // two units, the copies of those gathered one after the other. With dist.overlap (the default) the units' gathers
  // and the buckets' reduce-scatters run on GradSync's communication thread, the next unit's queued ahead of its
  // layers (one more unit whole then); without, on the training thread.
  constexpr int kRanks = 2;
  for (const bool overlap : {false, true})
    for (const char* precision : {"fp32", "fp16"})
      for (const int64_t accumulate : {1, 2}) {
        INFO(precision << ", accumulate " << accumulate << ", overlap " << overlap);
        const Planned p =
            plan_gpt({fmt::format("train.accumulate={}", accumulate), fmt::format("train.precision={}", precision),
                      fmt::format("dist.overlap={}", overlap)});
        const Precision products = p.exp.train.precision;
        const Footprint& f = p.f;
        const RankShare share =
            rank_shares(f, kRanks, [](size_t b) { return judge_fit(b, Device::cpu(), size_t{1} << 40); })[3];
        std::vector<size_t> unit_chunks;
        size_t chunk_bytes = 0;
        for (int64_t n : f.shard_units) {
          unit_chunks.push_back(zero_chunk(static_cast<size_t>(n), kRanks));
          chunk_bytes += unit_chunks.back() * 4;
        }
        // Beyond its chunks, what check says a rank holds in a pass: the units whole (weights), the buckets whole.
        const size_t in_pass = share.param_bytes - chunk_bytes + share.grad_bytes - chunk_bytes;
        auto comms = make_thread_comms(kRanks, 30.0);
        size_t built = 0, sharded = 0, peak = 0, after = 0, transient = 0;
        std::vector<size_t> shards(kRanks), chunks(kRanks), state(kRanks), defined(kRanks), copies(kRanks),
            params(kRanks);
        std::vector<std::vector<size_t>> planned(kRanks);
        std::vector<std::thread> threads;
        for (int r = 0; r < kRanks; ++r)
          threads.emplace_back([&, r] {
            const auto me = static_cast<size_t>(r);
            Communicator& comm = *comms[me];
            auto barrier = [&comm] {
              double d = 0;
              comm.allreduce_sum(&d, 1, "a barrier");
            };
            Model model = Model::build(p.exp.model, Shape{12}, DType::f32, Device::cpu(), 1);
            model.allocate(f.batch);
            Tensor x = Tensor::zeros(Shape{f.batch, 12}, DType::f32);
            for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i * 5 % 32);
            const Tensor dout = Tensor::zeros(model.output_shape().batched(f.batch), DType::f32);
            // A plain pass first, so that whatever a layer allocates on its first call is there before counting.
            model.forward(x, {true, false});
            model.backward(dout, {true, false});
            barrier();
            // Another on rank 0 alone: what a pass allocates and frees within itself (the layers' temporaries).
            if (r == 0) {
              const size_t before = host_storage_bytes();
              reset_host_storage_peak();
              const ProductPrecisionScope plain(products);
              model.forward(x, {true, false});
              model.backward(dout, {true, false});
              transient = host_storage_peak_bytes() - before;
              built = host_storage_bytes();
            }
            barrier();
            {
              ZeroOptimizer zero(p.exp.optimizer, model.params(), zero_plan(model, p.exp.dist), comm, 3);
              GradSync sync(comm, zero_plan(model, p.exp.dist), overlap, zero.grad_chunks(), accumulate);
              zero.set_prefetch(&sync);
              zero.shard_values();  // as StepLoop: the weights every rank holds now, sharded
              planned[me] = zero.bucket_chunks();
              params[me] = model.params().size();
              for (const Tensor& t : zero.value_shards()) shards[me] += static_cast<size_t>(t.bytes());
              for (const Tensor& t : zero.grad_chunks()) chunks[me] += static_cast<size_t>(t.bytes());
              state[me] = static_cast<size_t>(zero.shard_state_elements()) * 4;
              barrier();
              if (r == 0) {
                sharded = host_storage_bytes();
                reset_host_storage_peak();
              }
              barrier();
              // The rounded copies this rank's thread holds, before each node reads its weights (after the one before
              // has made its copies).
              model.set_param_use_hook([&zero, &copies, me](size_t i) {
                copies[me] = std::max(copies[me], half_weight_cache_stats().bytes);
                zero.use_node(i);
              });
              model.set_grad_begin_hook([&sync](size_t i) { sync.node_begin(i); });
              model.set_grad_ready_hook([&sync](size_t i) { sync.node_done(i); });
              { const ProductPrecisionScope before(products); }  // frees what the plain passes left
              const ProductPrecisionScope step(products);
              for (int64_t k = 0; k < accumulate; ++k) {
                const LayerContext ctx{.training = true, .accumulate_grads = k > 0, .step = static_cast<uint64_t>(k)};
                model.forward(x, ctx);
                if (k == accumulate - 1) sync.arm();
                model.backward(dout, ctx);
              }
              sync.finish();
              zero.release_values();
              barrier();
              if (r == 0) {
                peak = host_storage_peak_bytes();
                after = host_storage_bytes();
              }
              for (Param* q : model.params()) defined[me] += (q->value.defined() ? 1 : 0) + (q->grad.defined() ? 1 : 0);
              model.set_param_use_hook(nullptr);
              model.set_grad_begin_hook(nullptr);
              model.set_grad_ready_hook(nullptr);
              barrier();
            }
          });
        for (auto& t : threads) t.join();
        INFO("a plain pass's temporaries: " << transient << " bytes");
        for (size_t r = 0; r < kRanks; ++r) {
          CHECK(planned[r] == unit_chunks);  // check cuts the units as the run does
          CHECK(shards[r] == chunk_bytes);
          CHECK(chunks[r] == chunk_bytes);
          CHECK(defined[r] == 0);  // outside a pass no weight and no gradient is whole
        }
        // The optimizer state: rank 0 holds its whole chunk of every unit, as check counts; the last rank's may be
        // shorter.
        CHECK(state[0] == share.optimizer_bytes);
        CHECK(state[1] <= state[0]);
        // Sharding frees the whole weights and gradients, and keeps the chunks, the state and the all-gather buffers
        // (besides them only ZeroOptimizer's partial norms: an f64 total, and one per slice of a parameter in a rank's
        // chunk, at most a parameter and a unit boundary each).
        const auto whole = static_cast<int64_t>(kRanks * (f.param_bytes + f.grad_bytes));
        const auto kept = static_cast<int64_t>(kRanks * (2 * chunk_bytes + share.gather_bytes) + state[0] + state[1]);
        const int64_t rest = static_cast<int64_t>(sharded) - static_cast<int64_t>(built) + whole - kept;
        CHECK(rest >= 0);
        CHECK(rest <= static_cast<int64_t>(kRanks * 8 * (1 + params[0] + f.shard_units.size())));
        // The step frees every unit and bucket it gathered or wrote.
        CHECK(after == sharded);
        // The pass's peak beyond the chunks, over both ranks: on the training thread both hold check's figure at once
        // (inside the collective that ends a block's backward, or, with accumulation, the all-gather of the second
        // block in the forward pass, two blocks' weights and the buckets whole then), plus at most a plain pass's
        // temporaries each. With the communication thread the third unit's buffer is made when its gather's turn
        // comes there, and the ranks need not be at their fullest together: check's figure bounds it.
        if (!overlap) CHECK(peak - sharded >= kRanks * in_pass);
        CHECK(peak - sharded <= kRanks * (in_pass + transient));
        CHECK(in_pass == static_cast<size_t>(
                             ((overlap ? 3 : 2) * 3280 + (accumulate > 1 ? 32 + 3 * 3280 + 704 : 704 + 3280)) * 4));
        // The copies: two blocks' (attention's 4·16·16, fc's and proj's 16·64 each) once the second block's are made.
        for (size_t r = 0; r < kRanks; ++r) CHECK(copies[r] == share.half_weight_bytes);
        CHECK(share.half_weight_bytes == (products == Precision::fp16 ? 2 * 3 * 1024 * 4 : 0));
      }
}

TEST_CASE("check sizes a config for a GPU as a GPU run holds it, on a machine without one", "[cpu]") {
  // A GPT of 3 blocks (dim 16, T 12, batch 4): on the CPU attention runs its residual add as an epilogue (its
  // output and that output's gradient are never stored); on a GPU only dense layers head chains, so both are, and
  // under bf16 the weights' 16-bit copies are 2 bytes an element there.
  const std::string yaml = gpt_config("cpu", 32, 16, 12, 3, 2, 64, 4);
  const auto sized = [&](const std::string& precision, Device device) {
    ConfigNode root = apply_override(ConfigNode::load_string(yaml, "gpt.yaml"), "train.precision=" + precision);
    const Experiment exp = parse_experiment_without_data_files(root);
    Dataset train;
    train.inputs = Tensor::empty(Shape{0, 12}, DType::f32);
    train.targets = Tensor::empty(Shape{0, 12}, DType::i32);
    train.num_classes = 32;
    Model model = Model::build(exp.model, Shape{12}, DType::f32, Device::cpu(), exp.seed, /*init_params=*/false);
    model.plan_for(device);
    apply_recompute(exp, model);
    return training_footprint(exp, model, train);
  };
  const Footprint cpu32 = sized("fp32", Device::cpu()), gpu32 = sized("fp32", Device::cuda(0));
  CHECK_FALSE(cpu32.on_cuda);
  CHECK(gpu32.on_cuda);
  CHECK(gpu32.activation_bytes - cpu32.activation_bytes == size_t{3 * 2 * 4 * 12 * 16 * 4});
  const Footprint gpu16 = sized("bf16", Device::cuda(0));
  // Each block's qkv (16 → 48), proj (16 → 16), fc (16 → 64) and proj (64 → 16), and the head tied to the token
  // table (32 × 16), in 16 bits, and with the GPU's 16-bit activations (its default) their biases' 16-bit copies
  // (48 + 16 + 64 + 16 per block; the head has none).
  CHECK(gpu16.activation_dtype == DType::bf16);
  CHECK(gpu16.half_weight_bytes ==
        size_t{(3 * (16 * 48 + 16 * 16 + 16 * 64 + 64 * 16 + 48 + 16 + 64 + 16) + 32 * 16) * 2});
  // The same activations in f32 with 16-bit copies for backward (GPUTRAIN_HALF_ACTIVATIONS=off): the weights alone,
  // and more activation bytes (f32 outputs' working buffers and gradients).
  {
    const ScopedEnvVar off("GPUTRAIN_HALF_ACTIVATIONS", "off");
    const Footprint copies = sized("bf16", Device::cuda(0));
    CHECK(copies.activation_dtype == DType::f32);
    CHECK(copies.half_weight_bytes == size_t{(3 * (16 * 48 + 16 * 16 + 16 * 64 + 64 * 16) + 32 * 16) * 2});
    CHECK(copies.activation_bytes > gpu16.activation_bytes);
  }
  // The CPU keeps its own default (f32 activations) under bf16.
  CHECK(sized("bf16", Device::cpu()).activation_dtype == DType::f32);
  CHECK(planned_device("cuda:1") == Device::cuda(1));
  CHECK(planned_device("cuda") == Device::cuda(0));
  CHECK(planned_device("cpu") == Device::cpu());
}

TEST_CASE("gputrain check sizes device: cuda as a GPU run here without a GPU, and says the verdict is unknown",
          "[e2e]") {
  const auto totals = [](const std::string& device) {
    const CommandResult r =
        run_gputrain("check " + source_path("configs/gpt_bytes.yaml") + " --set device=" + device + " --json");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return r.output;
  };
  const std::string cpu = totals("cpu"), gpu = totals("cuda");
  // gpt_bytes' attention outputs and their gradients, which only the CPU's chains leave unstored.
  CHECK(*json_number(gpu, "needed_bytes") > *json_number(cpu, "needed_bytes"));
  if (!query_cuda().devices.empty()) return;  // on a GPU machine the verdict is the GPU's
  CHECK(gpu.find("\"fits\": null") != std::string::npos);
}
