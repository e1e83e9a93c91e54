// train.precision bf16/fp16 with the activations held in 16 bits between layers (Model::set_activation_dtype, the
// GPU's layout): the ops through ops/wide.h, a GPT's step against the f32-activation step, the buffers' bytes, and the
// refusals.
#include "core/half.h"
#include "core/tensor.h"
#include "data/tokens.h"
#include "graph/model.h"
#include "helpers.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/layernorm.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/precision.h"
#include "ops/wide.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;
namespace fs = std::filesystem;

namespace {

Tensor normal_f32(const Shape& s, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(s, DType::f32);
  Rng rng(seed, 0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * static_cast<float>(rng.normal());
  return t;
}

// `t` (f32) rounded into `dtype` and widened back: what a 16-bit tensor of it holds.
Tensor through(const Tensor& t, DType dtype) {
  Tensor half = Tensor::empty(t.shape(), dtype), back = Tensor::empty(t.shape(), DType::f32);
  ops::convert(t, half);
  ops::convert(half, back);
  return back;
}

Tensor as_f32(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::f32);
  ops::convert(t, out);
  return out;
}

bool same_floats(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return false;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::bit_cast<uint32_t>(a.data<float>()[i]) != std::bit_cast<uint32_t>(b.data<float>()[i])) return false;
  return true;
}

struct LayerStep {
  size_t allocated = 0;                   // what allocate allocated
  int64_t scratch = 0;                    // the layers' shared scratch (f32 elements)
  Tensor out;                             // the model's output, widened to f32
  DType out_dtype = DType::f32;           // the output's own dtype
  std::vector<std::vector<float>> grads;  // every parameter's gradient
  int64_t output_bytes = 0;               // what buffer_plan's outputs and gradients take
};

// One training forward and backward of a GPT of `blocks` blocks (token ids of 12 positions, a vocabulary of 32)
// with its activations in `act`, the products in `products`.
LayerStep gpt_step(DType act, Precision products, int64_t batch, bool fusion = true, Recompute mode = Recompute::none,
                   const std::string& layers = gpt_layers(32, 16, 12, 2, 2, 64)) {
  const ConfigNode cfg = ConfigNode::load_string(layers, "m.yaml");
  Model m = Model::build(parse_model_spec(cfg), Shape{12}, DType::f32, Device::cpu(), 5);
  m.set_fusion(fusion);
  REQUIRE(m.set_recompute(mode).empty());
  m.set_activation_dtype(act);
  LayerStep s;
  for (const Model::NodeBuffers& b : m.buffer_plan(batch))
    s.output_bytes += (b.output + b.gradient + b.scratch) * static_cast<int64_t>(dtype_size(b.dtype));
  s.scratch = m.layer_scratch_numel(batch);
  const size_t before = host_storage_bytes();
  m.allocate(batch);
  s.allocated = host_storage_bytes() - before;
  Tensor x = Tensor::empty(Shape{batch, 12}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>((i * 7 + 3) % 32);
  const ProductPrecisionScope scope(products);
  LayerContext ctx;
  ctx.step = 1;
  const Tensor& y = m.forward(x, ctx);
  s.out = as_f32(y);
  s.out_dtype = y.dtype();
  const Tensor dy = normal_f32(y.shape(), 9, 0.1f);
  m.backward(dy, ctx);
  for (Param* q : m.params()) s.grads.emplace_back(q->grad.data<float>(), q->grad.data<float>() + q->grad.numel());
  return s;
}

double worst_grad_difference(const LayerStep& a, const LayerStep& b) {
  return worst_relative_difference(a.grads, b.grads);
}

}  // namespace

TEST_CASE("16-bit activations: convert rounds f32 to nearest even and widens exactly, both formats", "[cpu]") {
  const Tensor x = normal_f32(Shape{5, 7}, 1, 3.0f);
  for (const DType dt : {DType::bf16, DType::f16}) {
    Tensor h = Tensor::empty(x.shape(), dt);
    ops::convert(x, h);
    CHECK(h.bytes() == static_cast<size_t>(x.numel()) * 2);
    const Tensor back = as_f32(h);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = x.data<float>()[i];
      const float want = dt == DType::bf16 ? bf16_to_float(float_to_bf16(v)) : fp16_to_float(float_to_fp16(v));
      CHECK(std::bit_cast<uint32_t>(back.data<float>()[i]) == std::bit_cast<uint32_t>(want));
    }
  }
  Tensor i32 = Tensor::empty(Shape{35}, DType::i32), b16 = Tensor::empty(Shape{35}, DType::bf16);
  CHECK_THROWS_WITH(ops::convert(i32, b16), Catch::Contains("not a conversion between f32 and 16 bits"));
}

TEST_CASE("16-bit activations: an op on 16-bit tensors computes in f32 and rounds its result once", "[cpu]") {
  for (const DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const Tensor a = normal_f32(Shape{6, 32}, 2, 1.0f), b = normal_f32(Shape{6, 32}, 3, 1.0f);
    const Tensor gamma = normal_f32(Shape{32}, 4, 1.0f), beta = normal_f32(Shape{32}, 5, 0.1f);
    Tensor a16 = Tensor::empty(a.shape(), dt), b16 = Tensor::empty(b.shape(), dt);
    ops::convert(a, a16);
    ops::convert(b, b16);
    // add, in place as the model's gradient sums are: y = a + y in 16 bits is the f32 sum of the rounded operands,
    // rounded.
    ops::add(a16, b16, b16);
    Tensor sum = Tensor::empty(a.shape(), DType::f32);
    ops::add(through(a, dt), through(b, dt), sum);
    CHECK(same_floats(as_f32(b16), through(sum, dt)));
    // A layer norm with a 16-bit input and output, and f32 parameters and statistics.
    Tensor y16 = Tensor::empty(a.shape(), dt), y = Tensor::empty(a.shape(), DType::f32);
    Tensor mean = Tensor::empty(Shape{6}, DType::f32), inv = Tensor::empty(Shape{6}, DType::f32);
    Tensor mean2 = Tensor::empty(Shape{6}, DType::f32), inv2 = Tensor::empty(Shape{6}, DType::f32);
    ops::layernorm_forward(a16, gamma, beta, 1e-5, mean, inv, y16);
    ops::layernorm_forward(through(a, dt), gamma, beta, 1e-5, mean2, inv2, y);
    CHECK(same_floats(as_f32(y16), through(y, dt)));
    CHECK(same_floats(mean, mean2));
    // A dense layer: 16-bit x and y, an f32 weight, under the products' own precision.
    const Tensor w = normal_f32(Shape{8, 32}, 6, 0.2f), bias = normal_f32(Shape{8}, 7, 0.1f);
    Tensor o16 = Tensor::empty(Shape{6, 8}, dt), o = Tensor::empty(Shape{6, 8}, DType::f32);
    ops::linear_forward(a16, w, bias, o16);
    ops::linear_forward(through(a, dt), w, bias, o);
    CHECK(same_floats(as_f32(o16), through(o, dt)));
    // An accumulating product reads the old 16-bit values: c = aᵀ·b + c.
    Tensor c16 = Tensor::empty(Shape{32, 32}, dt), c = Tensor::empty(Shape{32, 32}, DType::f32);
    ops::convert(normal_f32(Shape{32, 32}, 8, 1.0f), c16);
    c.copy_from(as_f32(c16));
    ops::matmul(a16, true, b16, false, c16, 1.0);
    ops::matmul(through(a, dt), true, as_f32(b16), false, c, 1.0);
    CHECK(same_floats(as_f32(c16), through(c, dt)));
    // Causal attention on 16-bit q, k, v and output, the statistics and dout f32 (a dense layer's f32 product), as
    // the attention layer calls it with 16-bit activations.
    const Precision p = dt == DType::bf16 ? Precision::bf16 : Precision::fp16;
    const ProductPrecisionScope scope(p);
    const Tensor qkv = normal_f32(Shape{2, 5, 24}, 9, 1.0f), dout = normal_f32(Shape{2, 5, 8}, 10, 0.5f);
    Tensor qkv16 = Tensor::empty(qkv.shape(), dt), att16 = Tensor::empty(Shape{2, 5, 8}, dt);
    ops::convert(qkv, qkv16);
    Tensor att = Tensor::empty(Shape{2, 5, 8}, DType::f32), lse = Tensor::empty(Shape{2, 2, 5}, DType::f32),
           lse2 = Tensor::empty(Shape{2, 2, 5}, DType::f32);
    ops::attention_forward(qkv16, 2, {}, att16, lse);
    ops::attention_forward(through(qkv, dt), 2, {}, att, lse2);
    CHECK(same_floats(as_f32(att16), through(att, dt)));
    CHECK(same_floats(lse, lse2));
    Tensor dqkv16 = Tensor::empty(qkv.shape(), dt), dqkv = Tensor::empty(qkv.shape(), DType::f32);
    Tensor delta = Tensor::empty(lse.shape(), DType::f32);
    ops::attention_backward(qkv16, att16, lse, dout, 2, {}, delta, dqkv16);
    ops::attention_backward(through(qkv, dt), as_f32(att16), lse, dout, 2, {}, delta, dqkv);
    CHECK(same_floats(as_f32(dqkv16), through(dqkv, dt)));
    // Cross-entropy on 16-bit logits, writing the gradient over them: the f32 loss of the rounded logits, and its
    // gradient rounded.
    Tensor logits16 = Tensor::empty(Shape{6, 40}, dt);
    ops::convert(normal_f32(Shape{6, 40}, 11, 3.0f), logits16);
    Tensor labels = Tensor::empty(Shape{6}, DType::i32);
    for (int32_t i = 0; i < 6; ++i) labels.data<int32_t>()[i] = i * 7;
    Tensor logits = as_f32(logits16), stats16 = Tensor::zeros(Shape{2}, DType::f64),
           stats = Tensor::zeros(Shape{2}, DType::f64);
    ops::cross_entropy(logits16, labels, 0.0, 1.0 / 6, logits16, stats16, {});
    ops::cross_entropy(logits, labels, 0.0, 1.0 / 6, logits, stats, {});
    CHECK(same_floats(as_f32(logits16), through(logits, dt)));
    CHECK(stats16.data<double>()[0] == stats.data<double>()[0]);
  }
}

TEST_CASE("16-bit activations: a GPT's step is the f32-activation step within bf16's and fp16's rounding", "[cpu]") {
  const int64_t batch = 3;
  struct Case {
    DType act;
    Precision products;
    double tolerance;  // relative, per parameter tensor: 16 roundings of the format (2^-9 bf16, 2^-12 fp16)
  };
  for (const bool fusion : {false, true})
    for (const Case& c : {Case{DType::bf16, Precision::bf16, 16 * std::ldexp(1.0, -9)},
                          Case{DType::f16, Precision::fp16, 16 * std::ldexp(1.0, -12)}}) {
      INFO(dtype_name(c.act) << (fusion ? ", fused chains" : ", layer by layer"));
      const LayerStep wide = gpt_step(DType::f32, c.products, batch, fusion);
      const LayerStep half = gpt_step(c.act, c.products, batch, fusion);
      // The output is 16-bit too (the loss reads it so), and close.
      CHECK(half.out_dtype == c.act);
      double out_diff = 0, out_scale = 0;
      for (int64_t i = 0; i < half.out.numel(); ++i) {
        out_diff =
            std::max(out_diff, std::fabs(static_cast<double>(half.out.data<float>()[i]) - wide.out.data<float>()[i]));
        out_scale = std::max(out_scale, std::fabs(static_cast<double>(wide.out.data<float>()[i])));
      }
      const double grads = worst_grad_difference(half, wide);
      INFO("output " << out_diff / out_scale << ", gradients " << grads << " (relative)");
      CHECK(out_diff / out_scale < c.tolerance);
      CHECK(grads < c.tolerance);
      // Not the f32-activation step: something was rounded between layers.
      CHECK(out_diff > 0);
      CHECK(grads > 0);
      // Two runs give the same bits.
      const LayerStep again = gpt_step(c.act, c.products, batch, fusion);
      CHECK(same_floats(again.out, half.out));
      CHECK(worst_grad_difference(again, half) == 0);
    }
}

TEST_CASE("16-bit activations: the buffers allocate allocates are buffer_plan's, at 2 bytes an element", "[cpu]") {
  const int64_t batch = 3;
  for (const bool fusion : {false, true}) {
    INFO((fusion ? "fused chains" : "layer by layer"));
    const LayerStep wide = gpt_step(DType::f32, Precision::bf16, batch, fusion);
    const LayerStep half = gpt_step(DType::bf16, Precision::bf16, batch, fusion);
    // allocate allocates the planned buffers in their dtypes and the layers' f32 scratch, nothing else.
    CHECK(half.allocated == static_cast<size_t>(half.output_bytes + half.scratch * 4));
    CHECK(wide.allocated == static_cast<size_t>(wide.output_bytes + wide.scratch * 4));
    // Every output and gradient halves, the model's output (the logits) included.
    CHECK(half.output_bytes == wide.output_bytes / 2);
  }
}

TEST_CASE("16-bit activations: train.recompute runs the segments again to the same bits", "[cpu]") {
  // Recompute keeps every layer apart (no chains), so it compares with the unfused step.
  const LayerStep kept = gpt_step(DType::bf16, Precision::bf16, 2, false);
  for (const Recompute mode : {Recompute::blocks, Recompute::all}) {
    const LayerStep again = gpt_step(DType::bf16, Precision::bf16, 2, false, mode);
    CHECK(same_floats(again.out, kept.out));
    CHECK(worst_grad_difference(again, kept) == 0);
    CHECK(again.output_bytes < kept.output_bytes);  // the dropped outputs share buffers
  }
}

TEST_CASE("16-bit activations: a GPT with dropout and LoRA adapters steps as with f32 activations, within rounding",
          "[cpu]") {
  // Dropout after the position table and in attention, an adapter (with its own dropout) on the MLP's first layer and
  // on attention's products: their masks are the same in either layout, and their ops take 16-bit activations.
  std::string layers = gpt_layers(32, 16, 12, 2, 2, 64);
  const auto insert_after = [&](const std::string& anchor, const std::string& text) {
    const size_t at = layers.find(anchor);
    REQUIRE(at != std::string::npos);
    layers.insert(at + anchor.size(), text);
  };
  insert_after("max_len: 12}\n", "  - {type: dropout, p: 0.1}\n");
  insert_after("heads: 2", ", dropout: 0.1, lora: {rank: 4, alpha: 8}");
  insert_after("out_features: 64", ", lora: {rank: 4, alpha: 8, dropout: 0.1}");
  const LayerStep wide = gpt_step(DType::f32, Precision::bf16, 3, true, Recompute::none, layers);
  const LayerStep half = gpt_step(DType::bf16, Precision::bf16, 3, true, Recompute::none, layers);
  const double grads = worst_grad_difference(half, wide);
  INFO("gradients " << grads << " (relative)");
  CHECK(grads < 16 * std::ldexp(1.0, -9));
  CHECK(grads > 0);
}

TEST_CASE("16-bit activations: refused for a layer that does not take them, and beside 16-bit copies", "[cpu]") {
  const ConfigNode cfg = ConfigNode::load_string(R"(layers:
  - {type: conv2d, out_channels: 2, kernel_size: 3}
  - flatten
  - {type: linear, out_features: 3}
)",
                                                 "m.yaml");
  Model conv = Model::build(parse_model_spec(cfg), Shape{1, 5, 5}, DType::f32, Device::cpu(), 1);
  CHECK(conv.half_activations_unsupported() == "layer \"layers.0\" (conv2d) does not take 16-bit activations");
  CHECK_THROWS_WITH(conv.set_activation_dtype(DType::bf16), Catch::Contains("conv2d"));
  Model gpt = Model::build(parse_model_spec(ConfigNode::load_string(gpt_layers(32, 16, 12, 1, 2, 64), "g.yaml")),
                           Shape{12}, DType::f32, Device::cpu(), 1);
  CHECK(gpt.half_activations_unsupported().empty());
  gpt.set_activation_dtype(DType::f16);
  CHECK(gpt.activation_dtype() == DType::f16);
  CHECK_THROWS_WITH(gpt.set_activation_storage(HalfFormat::bf16), Catch::Contains("holds them in f16 already"));
  Model f64 = Model::build(parse_model_spec(ConfigNode::load_string(gpt_layers(32, 16, 12, 1, 2, 64), "g.yaml")),
                           Shape{12}, DType::f64, Device::cpu(), 1);
  CHECK_THROWS_WITH(f64.set_activation_dtype(DType::bf16), Catch::Contains("need an f32 model"));
}

TEST_CASE("GPUTRAIN_HALF_ACTIVATIONS=on: check counts a bf16 GPT's activations in 2 bytes, and a bad value stops",
          "[e2e]") {
  const std::string args = "check " + source_path("configs/gpt_bytes.yaml") + " --set train.precision=bf16 --json";
  const CommandResult on = run_gputrain(args, "GPUTRAIN_HALF_ACTIVATIONS=on");
  const CommandResult off = run_gputrain(args, "GPUTRAIN_HALF_ACTIVATIONS=off");
  INFO(on.output << off.output);
  REQUIRE(on.exit_code == 0);
  REQUIRE(off.exit_code == 0);
  CHECK(json_string(on.output, "activation_dtype") == "bf16");
  // The outputs and their gradients in 2 bytes, against f32 outputs with 16-bit copies and f32 gradients.
  CHECK(*json_number(on.output, "activation_bytes") < 0.75 * *json_number(off.output, "activation_bytes"));
  const CommandResult bad = run_gputrain(args + " 2>&1", "GPUTRAIN_HALF_ACTIVATIONS=yes");
  CHECK(bad.exit_code == 1);
  CHECK(bad.output.find("GPUTRAIN_HALF_ACTIVATIONS=yes: expected auto, on or off") != std::string::npos);
}

TEST_CASE("Tensor::reinterpret lends a tensor's first bytes as another dtype, and refuses more than it has", "[cpu]") {
  Tensor f = Tensor::zeros(Shape{4, 3}, DType::f32);
  Tensor h = f.slice0(1, 2).reinterpret(DType::bf16, Shape{2, 6});  // the 24 bytes of rows 1 and 2, as 12 bf16
  CHECK(h.dtype() == DType::bf16);
  CHECK(h.raw() == f.slice0(1, 2).raw());
  h.data<bf16_t>()[1].bits = 0x3f80;  // 1.0 in bf16, as the upper half (bytes 2–3, little-endian) of row 1's first f32
  CHECK(f.data<float>()[3] == 1.0f);
  CHECK_THROWS_WITH(f.slice0(1, 2).reinterpret(DType::bf16, Shape{2, 7}), Catch::Contains("reinterpret f32"));
}

TEST_CASE("GPUTRAIN_HALF_ACTIVATIONS=on trains a GPT in bf16 and fp16 (loss scaling on 16-bit logits) as off does",
          "[e2e]") {
  TempDir dir;
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 5) % 32));
  fs::create_directories(dir / "tok");
  write_token_shard(dir / "tok/train_000000.bin", tokens.data(), tokens.size());
  std::string layers;
  std::istringstream in(gpt_layers(32, 32, 16, 2, 2, 128));
  for (std::string line; std::getline(in, line);) layers += "  " + line + "\n";
  write_text(
      dir / "gpt.yaml",
      fmt::format("name: gpt\nseed: 2\ndevice: cpu\ndata: {{format: tokens, train: {{path: \"{0}/tok/train_*.bin\"}}, "
                  "block_size: 16, vocab_size: 32, batch_size: 8}}\nmodel:\n{1}optimizer: {{type: adamw, lr: 0.003}}\n"
                  "train: {{max_steps: 12, log_every: 1}}\n",
                  dir.path(), layers));
  for (const char* precision : {"bf16", "fp16"}) {
    INFO(precision);
    std::vector<double> losses[2];
    for (int on = 0; on < 2; ++on) {
      const std::string out = dir / fmt::format("{}_{}", precision, on);
      const CommandResult r = run_gputrain(
          fmt::format("train {}/gpt.yaml --threads 2 --precision {} --out {} 2>&1", dir.path(), precision, out),
          fmt::format("GPUTRAIN_HALF_ACTIVATIONS={}", on ? "on" : "off"));
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      // The run says which layout it trains in.
      CHECK((r.output.find("activations: the layers' outputs and their gradients in") != std::string::npos) == on);
      for (const std::string& line : lines_of(read_text(out + "/metrics.jsonl")))
        if (json_string(line, "type") == "train") losses[on].push_back(*json_number(line, "loss"));
    }
    REQUIRE(losses[0].size() == 12);
    REQUIRE(losses[1].size() == 12);
    // 12 steps of a model that learns (the last loss well under the first), each within 1 % of the f32 layout's, and
    // not equal to it (the activations were rounded).
    CHECK(losses[1].back() < 0.9 * losses[1].front());
    double worst = 0;
    for (size_t s = 0; s < 12; ++s) worst = std::max(worst, std::fabs(losses[1][s] / losses[0][s] - 1));
    INFO("worst relative loss difference " << worst);
    CHECK(worst < 0.01);
    CHECK(worst > 0);
  }
}
