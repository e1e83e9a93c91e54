// Every registered layer on CUDA against the CPU: the gradient-check case table (layer_cases.h) walked in f64,
// forward in training and evaluation, backward into the input and parameter gradients, and a second backward that
// accumulates. A layer without a case fails test_gradcheck.cpp; a layer whose CUDA path differs fails here.
#include "cuda_helpers.h"
#include "graph/model.h"
#include "helpers.h"
#include "layer_cases.h"
#include "layers/layer.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>

using namespace gt;
using namespace gt::test;

namespace {

Tensor random_f64(const Shape& s, Rng& rng, int64_t index_range) {
  Tensor t = Tensor::empty(s, DType::f64);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<double>()[i] =
        index_range > 0 ? static_cast<double>(rng.below(static_cast<uint64_t>(index_range))) : rng.uniform(-2, 2);
  return t;
}

// f64 on both sides; sums run in other orders (cuBLASLt, cuDNN, atomics) over at most a few hundred terms of
// magnitude ≤ ~10: |Δ| ≤ 1e-10 · max(1, |cpu|) leaves three orders of magnitude of margin, and a wrong index or a
// missed term costs far more than that.
void check_same(const Tensor& cuda, const Tensor& cpu, const std::string& what) {
  const Tensor h = to_host(cuda);
  REQUIRE(h.numel() == cpu.numel());
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double a = h.data<double>()[i], b = cpu.data<double>()[i];
    INFO(what << "[" << i << "]: cuda " << a << " cpu " << b);
    REQUIRE(std::abs(a - b) <= 1e-10 * std::max(1.0, std::abs(b)));
  }
}

struct Side {
  std::unique_ptr<Layer> layer;
  std::vector<Tensor> xs, dxs;
  Tensor y;
  std::vector<const Tensor*> xp;
  std::vector<Tensor*> dxp;
};

Side make_side(const LayerSpec& spec, const ConfigNode& cfg, const std::vector<Shape>& in, const Shape& out,
               const std::vector<Tensor>& host_x, Device d, int64_t batch) {
  Side s;
  s.layer = spec.make(cfg);
  std::vector<Shape> shapes = in;
  s.layer->infer_shape(shapes, cfg);
  Rng rng(42, 7);
  s.layer->init_params(rng, DType::f64, d);
  s.layer->init_lora(rng, DType::f64, d);
  for (Param* p : s.layer->params())  // a fresh adapter's B is zero, which would hide A's gradient: the same values
    if (p->name.find("lora_B") != std::string::npos) {
      Tensor host = Tensor::empty(p->value.shape(), DType::f64);
      for (int64_t i = 0; i < host.numel(); ++i) host.data<double>()[i] = 0.1 * static_cast<double>(i % 5 - 2);
      p->value.copy_from(host);
    }
  for (size_t k = 0; k < in.size(); ++k) {
    Tensor x = Tensor::empty(in[k].batched(batch), DType::f64, d);
    x.copy_from(host_x[k]);
    s.xs.push_back(x);
    s.dxs.push_back(Tensor::zeros(in[k].batched(batch), DType::f64, d));
  }
  for (size_t k = 0; k < s.xs.size(); ++k) s.xp.push_back(&s.xs[k]), s.dxp.push_back(&s.dxs[k]);
  s.y = Tensor::zeros(out.batched(batch), DType::f64, d);
  return s;
}

}  // namespace

TEST_CASE("every layer's CUDA forward and backward match the CPU in double", "[cuda]") {
  require_gpu();
  for (const auto& [type, c] : layer_cases()) {
    INFO("layer " << type << " " << c.yaml);
    const ConfigNode cfg = ConfigNode::load_string(c.yaml, "case.yaml");
    const LayerSpec* spec = find_layer(type);
    REQUIRE(spec);
    std::vector<Shape> in{c.input};
    in.insert(in.end(), c.extra.begin(), c.extra.end());
    const Shape out = spec->make(cfg)->infer_shape(in, cfg);
    const int64_t batch = 3;
    Rng rng(9, 1);
    std::vector<Tensor> host_x;
    for (const Shape& s : in) host_x.push_back(random_f64(s.batched(batch), rng, c.index_range));
    const Tensor r = random_f64(out.batched(batch), rng, 0);
    Side cpu = make_side(*spec, cfg, in, out, host_x, Device::cpu(), batch);
    Side gpu = make_side(*spec, cfg, in, out, host_x, Device::cuda(0), batch);
    Tensor r_gpu = to_cuda(r);
    for (bool accumulate : {false, true}) {
      const LayerContext ctx{true, accumulate, 3};
      cpu.layer->forward(cpu.xp, cpu.y, ctx);
      gpu.layer->forward(gpu.xp, gpu.y, ctx);
      check_same(gpu.y, cpu.y, "y");
      cpu.layer->backward(cpu.xp, cpu.y, r, cpu.dxp, ctx);
      gpu.layer->backward(gpu.xp, gpu.y, r_gpu, gpu.dxp, ctx);
      if (c.index_range == 0)  // an embedding's input is indices: no gradient
        for (size_t k = 0; k < cpu.dxs.size(); ++k) check_same(gpu.dxs[k], cpu.dxs[k], "dx" + std::to_string(k));
      const auto pc = cpu.layer->params(), pg = gpu.layer->params();
      REQUIRE(pc.size() == pg.size());
      for (size_t k = 0; k < pc.size(); ++k) {
        check_same(pg[k]->grad, pc[k]->grad, pc[k]->name + ".grad");
        check_same(pg[k]->value, pc[k]->value, pc[k]->name);
      }
    }
    const LayerContext eval{false, false, 4};  // running statistics, no dropout
    cpu.layer->forward(cpu.xp, cpu.y, eval);
    gpu.layer->forward(gpu.xp, gpu.y, eval);
    check_same(gpu.y, cpu.y, "y (evaluation)");
  }
}

// Decoding with the key/value cache on the device: a tiny GPT built with one seed on both backends (the same
// initial weights), a prefill and single-token steps, logits against the CPU's.
TEST_CASE("CUDA key/value-cache decoding of a GPT matches the CPU in double", "[cuda]") {
  require_gpu();
  const ConfigNode cfg = ConfigNode::load_string(gt::test::gpt_layers(13, 64, 12, 2, 2, 96), "gpt.yaml");
  Model cpu = Model::build(parse_model_spec(cfg), Shape{12}, DType::f64, Device::cpu(), 3);
  Model gpu = Model::build(parse_model_spec(cfg), Shape{12}, DType::f64, Device::cuda(0), 3);
  cpu.allocate(1);
  gpu.allocate(1);
  const std::vector<double> ids{1, 5, 12, 0, 7, 7, 3, 9, 11, 2, 4, 6};
  auto step = [&](int64_t first, int64_t n) {
    INFO("positions [" << first << ", " << first + n << ")");
    Tensor x = Tensor::empty(Shape{1, n}, DType::f64);
    for (int64_t k = 0; k < n; ++k) x.data<double>()[k] = ids[static_cast<size_t>(first + k)];
    const Tensor want = cpu.forward_decode(x, first).clone();
    const Tensor got = to_host(gpu.forward_decode(to_cuda(x), first));
    // Double on both sides; the device's sums run in another order: 1e-10 absolute and relative.
    check_close(got, want, 1e-10, 1e-10);
  };
  step(0, 4);
  for (int64_t p = 4; p < 12; ++p) step(p, 1);
}

TEST_CASE("a model with frozen layers in the middle gets the CPU's gradients on CUDA", "[cuda]") {
  require_gpu();
  // The frozen convolution, batch norm scale and dense weight still pass the input gradient on (cuDNN's filter
  // gradient is skipped; batch norm writes its scale's into a discarded buffer).
  const char* layers = R"(layers:
  - {type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}
  - {type: batchnorm2d}
  - relu
  - {type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}
  - flatten
  - {type: linear, out_features: 12, lora: {rank: 2}}
  - {type: layernorm}
  - tanh
  - {type: linear, out_features: 3}
)";
  const ConfigNode cfg = ConfigNode::load_string(layers, "m.yaml");
  const std::vector<std::string> frozen = {"layers.3.*", "layers.1.weight", "layers.5.weight", "layers.6.bias"};
  Model cpu = Model::build(parse_model_spec(cfg), Shape{2, 5, 5}, DType::f64, Device::cpu(), 3);
  Model gpu = Model::build(parse_model_spec(cfg), Shape{2, 5, 5}, DType::f64, Device::cuda(0), 3);
  CHECK(cpu.set_frozen(frozen) == gpu.set_frozen(frozen));
  for (auto* m : {&cpu, &gpu})  // the adapter's B not zero, the same values on both
    for (auto& [name, p] : m->named_params())
      if (name.find("lora_B") != std::string::npos) {
        Tensor host = Tensor::empty(p->value.shape(), DType::f64);
        for (int64_t i = 0; i < host.numel(); ++i) host.data<double>()[i] = 0.1 * static_cast<double>(i % 5 - 2);
        p->value.copy_from(host);
      }
  cpu.allocate(4);
  gpu.allocate(4);
  Rng rng(2, 2);
  const Tensor x = random_f64(Shape{4, 2, 5, 5}, rng, 0);
  const Tensor dy = random_f64(Shape{4, 3}, rng, 0);
  const LayerContext ctx;
  check_same(gpu.forward(to_cuda(x), ctx), cpu.forward(x, ctx), "y");
  cpu.backward(dy, ctx);
  gpu.backward(to_cuda(dy), ctx);
  const auto pc = cpu.named_params(), pg = gpu.named_params();
  REQUIRE(pc.size() == pg.size());
  REQUIRE(pc.size() == 9);
  for (size_t k = 0; k < pc.size(); ++k) check_same(pg[k].second->grad, pc[k].second->grad, pc[k].first + ".grad");
}
