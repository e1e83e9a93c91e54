// train.precision bf16/fp16 on the CPU: the activations kept for backward in 16 bits (Model::set_activation_storage)
// — their bytes, the gradients they give against fp32's, recompute with them, and what `gputrain check` says.
#include "core/half.h"
#include "core/tensor.h"
#include "graph/model.h"
#include "helpers.h"
#include "ops/activation.h"
#include "ops/half_storage.h"
#include "ops/matmul.h"
#include "ops/precision.h"
#include "train/settings.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

// A residual MLP over sequences [8, 16]: layer norms, GELUs and dense layers (whose inputs, kept in half, the
// products round anyway), a 12-block stack so that the forward's few working buffers are small beside the rest.
std::string mlp_layers(int blocks, const char* head = "") {
  return fmt::format(R"(layers:
  - {{type: linear, out_features: 16}}
  - repeat: {}
    name: h
    layers:
      - {{type: layernorm, name: ln}}
      - {{type: linear, name: fc, out_features: 48}}
      - {{type: gelu, approximate: tanh}}
      - {{type: linear, name: proj, out_features: 16}}
      - {{type: add, inputs: [input, proj]}}
  - {{type: layernorm, name: ln_f}}
{}  - flatten
  - {{type: linear, out_features: 4}}
)",
                     blocks, head);
}

// A conv net: batch norm's input, ReLU's output, max pooling's input and the sigmoid's output kept in half; the
// softmax's output is the last (the loss reads it). No bias before batch norm: its gradient is 0 up to rounding, which
// no relative tolerance would hold. Three blocks, so that the copies save more than the working
// buffers cost (Model::half_plan keeps a shallower net in f32).
const char* const kHalfConvLayers = R"(layers:
  - {type: conv2d, out_channels: 6, kernel_size: 3, padding: 1}
  - repeat: 3
    name: c
    layers:
      - {type: conv2d, out_channels: 6, kernel_size: 3, padding: 1, bias: false}
      - {type: batchnorm2d}
      - relu
  - {type: maxpool2d, kernel_size: 2}
  - sigmoid
  - flatten
  - {type: linear, out_features: 5}
  - softmax
)";

Tensor filled(const Shape& s, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(s, DType::f32);
  Rng rng(seed, 0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * static_cast<float>(rng.normal());
  return t;
}

struct Pass {
  Tensor out;                             // the forward's output
  std::vector<std::vector<float>> grads;  // every parameter's gradient
  size_t allocated = 0;                   // what allocate allocated
  Model::NodeBuffers planned;             // buffer_plan's sums
  int64_t widened = 0;                    // elements widened from 16 bits for the backward pass
};

// One training forward and backward of `layers` (seed 5) over x with output gradient dy: with the activations kept in
// `storage` (nullopt: f32), the products in `products`, train.recompute `mode`.
Pass run(const std::string& layers, const Shape& input, const Tensor& x, const Tensor& dy,
         std::optional<HalfFormat> storage, Precision products, Recompute mode = Recompute::none,
         bool widen_everything = false) {
  const ConfigNode cfg = ConfigNode::load_string(layers, "m.yaml");
  Model m = Model::build(parse_model_spec(cfg), input, DType::f32, Device::cpu(), 5);
  // Layer by layer in fp32 too: half storage keeps every layer apart (Model::chains), so the plans compare alike.
  m.set_fusion(false);
  REQUIRE(m.set_recompute(mode).empty());
  m.set_activation_storage(storage);
  m.set_widen_everything(widen_everything);
  Pass p;
  for (const Model::NodeBuffers& b : m.buffer_plan(x.dim(0))) {
    p.planned.output += b.output;
    p.planned.gradient += b.gradient;
    p.planned.scratch += b.scratch;
    p.planned.half += b.half;
  }
  const size_t before = host_storage_bytes();
  m.allocate(x.dim(0));
  p.allocated = host_storage_bytes() - before;
  const ProductPrecisionScope scope(products);
  LayerContext ctx;
  ctx.step = 1;
  const Tensor& y = m.forward(x, ctx);
  p.out = Tensor::empty(y.shape(), DType::f32);
  p.out.copy_from(y);
  m.backward(dy, ctx);
  for (Param* q : m.params()) p.grads.emplace_back(q->grad.data<float>(), q->grad.data<float>() + q->grad.numel());
  p.widened = m.widened_elements();
  return p;
}

double worst_relative(const Pass& a, const Pass& b) { return worst_relative_difference(a.grads, b.grads); }

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() &&
         std::equal(a.data<float>(), a.data<float>() + a.numel(), b.data<float>(),
                    [](float u, float v) { return std::bit_cast<uint32_t>(u) == std::bit_cast<uint32_t>(v); });
}

struct Format {
  HalfFormat storage;
  Precision products;
  const char* name;
};
// A small GPT over token ids [12] (gpt_bytes' layers at toy sizes): embeddings, pre-norm blocks with attention, a
// GELU MLP and residual adds, and a tied head.
const std::string kHalfGptLayers = gpt_layers(32, 16, 12, 3, 2, 64);

// The nets the half-storage tests train one step of: the residual MLP, the conv net and the GPT (whose attention
// layers keep their q, k, v and output in 16 bits too), with their per-sample input and output shapes.
struct HalfNet {
  std::string layers;
  Shape input, output;
  bool tokens;  // the input is token ids
};
const HalfNet kHalfNets[] = {{mlp_layers(3), Shape{8, 16}, Shape{4}, false},
                             {kHalfConvLayers, Shape{2, 6, 6}, Shape{5}, false},
                             {kHalfGptLayers, Shape{12}, Shape{12, 32}, true}};

// A batch of `net`'s input: normal values, or token ids in [0, 32) for the GPT.
Tensor half_net_input(const HalfNet& net, int64_t batch, uint64_t seed) {
  Tensor x = filled(net.input.batched(batch), seed, 1.0f);
  if (net.tokens)
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = static_cast<float>((i * 5 + static_cast<int64_t>(seed)) % 32);
  return x;
}

const Format kFormats[] = {{HalfFormat::bf16, Precision::bf16, "bf16"}, {HalfFormat::fp16, Precision::fp16, "fp16"}};

}  // namespace

TEST_CASE("half activations: a bf16 step keeps the outputs for backward in 2 bytes, about half of fp32's bytes",
          "[cpu]") {
  const int64_t batch = 4;
  const Shape input{8, 16};
  const std::string layers = mlp_layers(12);
  const Tensor x = filled(input.batched(batch), 1, 1.0f);
  const Tensor dy = filled(Shape{batch, 4}, 2, 0.1f);
  const Pass fp32 = run(layers, input, x, dy, std::nullopt, Precision::fp32);
  const Pass bf16 = run(layers, input, x, dy, HalfFormat::bf16, Precision::bf16);
  // By hand, per sample: the first linear 8·16, per block ln, proj and the add 8·16 each and fc, gelu 8·48 each,
  // ln_f 8·16, the last linear 4 (the flatten is a view).
  const int64_t outputs = 8 * 16 + 12 * (3 * 8 * 16 + 2 * 8 * 48) + 8 * 16 + 4;
  CHECK(fp32.planned.output == batch * outputs);
  CHECK(fp32.planned.half == 0);
  // Under bf16 every output but the last (the loss reads it) is kept in 16 bits; the gradients are unchanged.
  CHECK(bf16.planned.half == batch * (outputs - 4));
  CHECK(bf16.planned.gradient == fp32.planned.gradient);
  CHECK(bf16.planned.scratch == fp32.planned.scratch);
  // What allocate allocated is what buffer_plan says, so the saved tensors are measured, not assumed.
  const auto grads = static_cast<size_t>(fp32.planned.gradient + fp32.planned.scratch) * 4;
  CHECK(fp32.allocated - grads == static_cast<size_t>(fp32.planned.output) * 4);
  CHECK(bf16.allocated - grads == static_cast<size_t>(bf16.planned.output) * 4 + bf16.planned.half * 2);
  const double saved_fp32 = static_cast<double>(fp32.allocated - grads);
  const double saved_bf16 = static_cast<double>(bf16.allocated - grads);
  INFO("saved bytes: fp32 " << saved_fp32 << ", bf16 " << saved_bf16);
  // Half of fp32's plus the forward's working buffers (the live outputs of one block: a few of 8·48 per sample).
  CHECK(saved_bf16 < 0.6 * saved_fp32);
  CHECK(saved_bf16 > 0.5 * saved_fp32);
  CHECK(static_cast<int64_t>(bf16.planned.output) <= batch * (4 + 4 * 8 * 48));
}

TEST_CASE("half activations: gradients from 16-bit saved tensors are within a stated tolerance of fp32's, and differ",
          "[cpu]") {
  for (const HalfNet& net : kHalfNets) {
    INFO(net.layers);
    const int64_t batch = 3;
    const Tensor x = half_net_input(net, batch, 3);
    const Tensor dy = filled(net.output.batched(batch), 4, 0.1f);
    const Pass fp32 = run(net.layers, net.input, x, dy, std::nullopt, Precision::fp32);
    for (const Format& f : kFormats) {
      INFO(f.name);
      // Half products with f32 storage (slices 1–2), and with the saved tensors in half too.
      const Pass products = run(net.layers, net.input, x, dy, std::nullopt, f.products);
      const Pass stored = run(net.layers, net.input, x, dy, f.storage, f.products);
      // The forward reads f32 outputs either way: the storage changes the backward alone.
      CHECK(same_bytes(stored.out, products.out));
      // bf16 keeps 8 significant bits (relative rounding 2^-9), fp16 11 (2^-12); a gradient sums many products of
      // rounded values, so the storage may move each tensor's gradients by 16 roundings' worth of its largest one
      // (3 % for bf16), and the gradients may be that much further from fp32's than the half products alone make
      // them (the batch-norm net's are 7 % away in bf16 with f32 storage already: a batch of 3).
      const double tolerance = 16 * (f.storage == HalfFormat::bf16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12));
      const double storage = worst_relative(stored, products);
      const double err = worst_relative(stored, fp32), products_err = worst_relative(products, fp32);
      INFO("worst relative difference: storage alone " << storage << ", against fp32 " << err
                                                       << " (half products alone " << products_err << ")");
      CHECK(storage < tolerance);
      CHECK(err < products_err + tolerance);
      // Not the gradients of f32 storage: the layer norms', GELU's, batch norm's, pooling's and the sigmoid's
      // backward read rounded values (a test that would pass with the storage silently left in f32 fails here).
      CHECK(storage > 0);
      CHECK(err > 0);
    }
  }
}

TEST_CASE(
    "half activations: under train.recompute: blocks the outputs a segment starts from stay f32, the rest "
    "go to half, within tolerance",
    "[cpu]") {
  // Six outputs of 8·16 after the blocks, kept by recompute (they are outside every block): their copies pay.
  const char* const head = R"(  - {type: linear, out_features: 16}
  - {type: gelu, approximate: tanh}
  - {type: linear, out_features: 16}
  - {type: gelu, approximate: tanh}
  - {type: layernorm}
)";
  const int64_t batch = 3;
  const Shape input{8, 16};
  const std::string layers = mlp_layers(4, head);
  const Tensor x = filled(input.batched(batch), 5, 1.0f);
  const Tensor dy = filled(Shape{batch, 4}, 6, 0.1f);
  const Pass fp32 = run(layers, input, x, dy, std::nullopt, Precision::fp32);
  const Pass recomputed = run(layers, input, x, dy, std::nullopt, Precision::bf16, Recompute::blocks);
  const Pass both = run(layers, input, x, dy, HalfFormat::bf16, Precision::bf16, Recompute::blocks);
  const Pass stored = run(layers, input, x, dy, HalfFormat::bf16, Precision::bf16);
  CHECK(same_bytes(both.out, stored.out));
  // The first linear and the adds of the first three passes stay f32 (a recomputed pass starts from them and must
  // get the forward's numbers); the last pass's add (read by ln_f alone), ln_f and the head's five outputs before the
  // last go to half.
  CHECK(both.planned.half == batch * 7 * 8 * 16);
  CHECK(both.allocated < recomputed.allocated);
  CHECK(both.allocated < stored.allocated);
  const double err = worst_relative(both, fp32);
  INFO("worst relative error against fp32: " << err);
  CHECK(err < 16 * std::ldexp(1.0, -9));  // as above
  // The head's backward read rounded values: not recompute's gradients with f32 storage.
  CHECK(worst_relative(both, recomputed) > 0);
}

namespace {

bool same_grads(const Pass& a, const Pass& b) {
  if (a.grads.size() != b.grads.size()) return false;
  for (size_t k = 0; k < a.grads.size(); ++k)
    if (a.grads[k].size() != b.grads[k].size() ||
        !std::equal(a.grads[k].begin(), a.grads[k].end(), b.grads[k].begin(),
                    [](float u, float v) { return std::bit_cast<uint32_t>(u) == std::bit_cast<uint32_t>(v); }))
      return false;
  return true;
}

}  // namespace

TEST_CASE(
    "half activations: widening only what each backward reads, and handing dense layers their 16-bit inputs, gives "
    "the gradients of widening everything, bit for bit",
    "[cpu]") {
  for (const HalfNet& net : kHalfNets) {
    INFO(net.layers);
    const int64_t batch = 3;
    const Tensor x = half_net_input(net, batch, 7);
    const Tensor dy = filled(net.output.batched(batch), 8, 0.1f);
    struct Path {
      HalfFormat storage;
      Precision products;
      cpu::CpuBf16Path bf16_path;
      const char* name;
    };
    const Path paths[] = {{HalfFormat::bf16, Precision::bf16, cpu::CpuBf16Path::native, "bf16 native"},
                          {HalfFormat::bf16, Precision::bf16, cpu::CpuBf16Path::conversion, "bf16 by conversion"},
                          {HalfFormat::fp16, Precision::fp16, cpu::CpuBf16Path::conversion, "fp16"}};
    for (const Path& path : paths) {
      INFO(path.name);
      const ForcedBf16Path forced(path.bf16_path);  // native only where the CPU has it
      const Pass everything = run(net.layers, net.input, x, dy, path.storage, path.products, Recompute::none, true);
      const Pass needed = run(net.layers, net.input, x, dy, path.storage, path.products);
      CHECK(same_bytes(needed.out, everything.out));
      CHECK(same_grads(needed, everything));
      // Less was widened: the adds' and the position table's inputs, the outputs no backward reads, and (dense
      // layers and attention) the inputs their weight gradients take in 16 bits.
      INFO("widened: everything " << everything.widened << ", what is read " << needed.widened);
      CHECK(everything.widened > 0);
      CHECK(needed.widened < everything.widened);
    }
  }
}

TEST_CASE("half activations: matmul_half_b is matmul of the widened operand, bit for bit, on every product path",
          "[cpu]") {
  // dW = dyᵀ·x with x in 16 bits, split over threads (1024 rows), and c = a·b untransposed; beta 0 and 1.
  const Tensor dy = filled(Shape{1024, 48}, 11, 1.0f), xf = filled(Shape{1024, 40}, 12, 1.0f);
  const Tensor a = filled(Shape{7, 1024}, 13, 1.0f);
  struct Path {
    HalfFormat format;
    Precision products;
    cpu::CpuBf16Path bf16_path;
  };
  const Path paths[] = {{HalfFormat::bf16, Precision::bf16, cpu::CpuBf16Path::native},
                        {HalfFormat::bf16, Precision::bf16, cpu::CpuBf16Path::conversion},
                        {HalfFormat::fp16, Precision::fp16, cpu::CpuBf16Path::conversion},
                        {HalfFormat::bf16, Precision::fp32, cpu::CpuBf16Path::conversion}};
  for (const Path& path : paths) {
    INFO("format " << static_cast<int>(path.format) << " products " << to_string(path.products));
    const ForcedBf16Path forced(path.bf16_path);
    std::vector<uint16_t> x16(static_cast<size_t>(xf.numel()));
    ops::pack_activation(path.format, xf, x16.data());
    Tensor wide = Tensor::empty(xf.shape(), DType::f32);
    ops::unpack_activation(path.format, x16.data(), wide);
    const ops::HalfMatrix b{x16.data(), path.format, 1024, 40};
    const ProductPrecisionScope scope(path.products);
    for (const double beta : {0.0, 1.0}) {
      Tensor want = filled(Shape{48, 40}, 14, 1.0f), got = filled(Shape{48, 40}, 14, 1.0f);
      ops::matmul(dy, true, wide, false, want, beta);
      ops::matmul_half_b(dy, true, b, got, beta);
      CHECK(same_bytes(got, want));
      Tensor want2 = Tensor::empty(Shape{7, 40}, DType::f32), got2 = Tensor::empty(Shape{7, 40}, DType::f32);
      ops::matmul(a, false, wide, false, want2, 0.0);
      ops::matmul_half_b(a, false, b, got2, 0.0);
      CHECK(same_bytes(got2, want2));
    }
    // The contract: b's rows must be op(a)'s columns.
    Tensor c = Tensor::empty(Shape{48, 40}, DType::f32);
    CHECK_THROWS(ops::matmul_half_b(dy, false, b, c, 0.0));
  }
}

TEST_CASE("half activations: activation_backward_half_x is activation_backward of the widened input, bit for bit",
          "[cpu]") {
  // Sizes around the 1024-element pieces and the GELU loop's vectors, split over threads at the largest.
  for (const int64_t n : {int64_t{1}, int64_t{31}, int64_t{1024}, int64_t{1057}, int64_t{300007}}) {
    const Tensor x = filled(Shape{n}, 21, 2.0f), dy = filled(Shape{n}, 22, 1.0f);
    for (const HalfFormat format : {HalfFormat::bf16, HalfFormat::fp16})
      for (const Activation a : {Activation::relu, Activation::gelu, Activation::gelu_tanh}) {
        INFO("n " << n << " format " << static_cast<int>(format) << " activation " << static_cast<int>(a));
        std::vector<uint16_t> x16(static_cast<size_t>(n));
        ops::pack_activation(format, x, x16.data());
        Tensor wide = Tensor::empty(x.shape(), DType::f32), y = Tensor::empty(x.shape(), DType::f32);
        ops::unpack_activation(format, x16.data(), wide);
        ops::activation_forward(a, wide, y);
        Tensor want = Tensor::empty(x.shape(), DType::f32), got = Tensor::empty(x.shape(), DType::f32);
        ops::activation_backward(a, wide, y, dy, want);
        ops::activation_backward_half_x(a, {x16.data(), format, 1, n}, dy, got);
        CHECK(same_bytes(got, want));
      }
  }
  // Not for an activation whose derivative reads its output.
  const Tensor dy = filled(Shape{4}, 23, 1.0f);
  Tensor dx = Tensor::empty(Shape{4}, DType::f32);
  std::vector<uint16_t> x16(4, 0);
  CHECK_THROWS(ops::activation_backward_half_x(Activation::tanh, {x16.data(), HalfFormat::bf16, 1, 4}, dy, dx));
}
