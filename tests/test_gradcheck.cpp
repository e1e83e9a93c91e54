// Finite-difference gradient checks, in double, for every registered layer and every loss.
// The case table is walked against the registry: a layer without a check fails the suite.
#include "graph/model.h"
#include "layers/layer.h"
#include "ops/activation.h"
#include "ops/conv2d.h"
#include "ops/loss.h"
#include "ops/pool2d.h"
#include "train/loss.h"

#include "layer_cases.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>

using namespace gt;

namespace gt::test {

// Every layer type needs at least one entry here.
const std::multimap<std::string, GradCase>& layer_cases() {
  static const std::multimap<std::string, GradCase> table = {
      {"add", {"add", Shape{2, 3}, {Shape{2, 3}}}},
      {"add", {"add", Shape{4}, {Shape{4}, Shape{4}}}},
      {"avgpool2d", {"{type: avgpool2d, kernel_size: 2}", Shape{2, 4, 5}}},
      {"avgpool2d", {"{type: avgpool2d, kernel_size: 3, stride: 2, padding: 1}", Shape{1, 5, 5}}},
      {"batchnorm1d", {"batchnorm1d", Shape{4}}},
      {"batchnorm1d", {"{type: batchnorm1d, eps: 0.001}", Shape{3, 5}}},
      {"batchnorm2d", {"batchnorm2d", Shape{3, 2, 3}}},
      {"concat", {"concat", Shape{2, 3, 2}, {Shape{1, 3, 2}}}},
      {"causal_self_attention", {"{type: causal_self_attention, heads: 2}", Shape{4, 6}}},
      {"causal_self_attention", {"{type: causal_self_attention, heads: 1, bias: false}", Shape{3, 4}}},
      // Training with attention dropout: the mask is fixed for the step, so central differences see one function.
      {"causal_self_attention", {"{type: causal_self_attention, heads: 2, dropout: 0.3}", Shape{5, 4}}},
      {"concat", {"{type: concat, dim: -1}", Shape{2, 3}, {Shape{2, 1}, Shape{2, 2}}}},
      {"conv2d", {"{type: conv2d, out_channels: 3, kernel_size: 3, padding: 1}", Shape{2, 5, 4}}},
      {"conv2d",
       {"{type: conv2d, out_channels: 4, kernel_size: [2, 3], stride: 2, dilation: [1, 2], groups: 2, bias: false}",
        Shape{4, 6, 7}}},
      {"conv2d", {"{type: conv2d, out_channels: 2, kernel_size: 1}", Shape{3, 3, 3}}},  // the 1×1 path without im2col
      {"dropout", {"{type: dropout, p: 0.3}", Shape{20}}},
      {"embedding", {"{type: embedding, num_embeddings: 4, embedding_dim: 3}", Shape{5}, {}, 4}},
      {"flatten", {"flatten", Shape{2, 3, 2}}},
      {"global_avgpool", {"global_avgpool", Shape{3, 2, 4}}},
      {"maxpool2d", {"{type: maxpool2d, kernel_size: 2}", Shape{2, 4, 4}}},
      {"maxpool2d", {"{type: maxpool2d, kernel_size: 2}", Shape{1, 5, 5}}},  // odd sides: the last row is dropped
      {"maxpool2d", {"{type: maxpool2d, kernel_size: 3, stride: 2, padding: 1}", Shape{1, 5, 6}}},
      {"gelu", {"gelu", Shape{7}}},
      {"gelu", {"{type: gelu, approximate: tanh}", Shape{7}}},
      {"layernorm", {"layernorm", Shape{2, 6}}},
      {"linear", {"{type: linear, out_features: 3}", Shape{5}}},
      {"linear", {"{type: linear, out_features: 4, bias: false}", Shape{6}}},
      {"linear", {"{type: linear, out_features: 2}", Shape{3, 4}}},  // over the last dimension
      // LoRA adapters (their B drawn, not zero, so that A's gradient is not zero too): the base path plus α/r·x·Aᵀ·Bᵀ.
      {"linear", {"{type: linear, out_features: 3, lora: {rank: 2, alpha: 6}}", Shape{5}}},
      {"linear", {"{type: linear, out_features: 4, lora: {rank: 3, dropout: 0.3}}", Shape{2, 5}}},
      {"causal_self_attention", {"{type: causal_self_attention, heads: 2, lora: {rank: 2, alpha: 3}}", Shape{4, 6}}},
      {"positional_embedding", {"{type: positional_embedding, max_len: 5}", Shape{3, 4}}},  // T < max_len
      {"positional_embedding", {"{type: positional_embedding, max_len: 2}", Shape{2, 3}}},
      {"relu", {"relu", Shape{9}}},
      {"sigmoid", {"sigmoid", Shape{2, 4}}},
      {"softmax", {"softmax", Shape{2, 5}}},
      {"tanh", {"tanh", Shape{8}}},
  };
  return table;
}

}  // namespace gt::test

using gt::test::GradCase;
using gt::test::layer_cases;

namespace {

Tensor random_tensor(const Shape& s, Rng& rng, double min_abs = 0) {
  Tensor t = Tensor::empty(s, DType::f64);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = 0;
    // Points within min_abs of 0 are redrawn: relu's kink would make the finite difference meaningless.
    do v = rng.uniform(-2, 2);
    while (std::abs(v) < min_abs);
    t.data<double>()[i] = v;
  }
  return t;
}

// Central difference of loss() in the value v: (L(v + h) − L(v − h)) / 2h, leaving v as it was.
template <class F>
double central_difference(double& v, F&& loss) {
  const double h = 1e-6, keep = v;
  v = keep + h;
  const double up = loss();
  v = keep - h;
  const double down = loss();
  v = keep;
  return (up - down) / (2 * h);
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

// Caffe's rule: |analytic − numeric| ≤ thr · max(1, |analytic|, |numeric|).
void check_close(double analytic, double numeric, const std::string& what) {
  const double thr = 1e-6;
  INFO(what << ": analytic " << analytic << " numeric " << numeric);
  CHECK(std::abs(analytic - numeric) <= thr * std::max({1.0, std::abs(analytic), std::abs(numeric)}));
}

void gradcheck_layer(const std::string& type, const GradCase& c) {
  const ConfigNode cfg = ConfigNode::load_string(c.yaml, "case.yaml");
  const LayerSpec* spec = find_layer(type);
  REQUIRE(spec);
  std::unique_ptr<Layer> layer = spec->make(cfg);
  std::vector<Shape> in_shapes{c.input};
  in_shapes.insert(in_shapes.end(), c.extra.begin(), c.extra.end());
  const Shape out_shape = layer->infer_shape(in_shapes, cfg);
  Rng rng(42, 7);
  layer->init_params(rng, DType::f64, Device::cpu());
  layer->init_lora(rng, DType::f64, Device::cpu());
  for (Param* p : layer->params())  // a fresh adapter's B is zero, which would hide A's gradient
    if (p->name.find("lora_B") != std::string::npos) p->value.copy_from(random_tensor(p->value.shape(), rng));

  const int64_t batch = 3;
  std::vector<Tensor> xs, dxs;
  std::vector<const Tensor*> xp;
  std::vector<Tensor*> dxp;
  for (const Shape& s : in_shapes) {
    xs.push_back(random_tensor(s.batched(batch), rng, 0.05));
    if (c.index_range > 0)
      for (int64_t i = 0; i < xs.back().numel(); ++i)
        xs.back().data<double>()[i] = static_cast<double>(rng.below(static_cast<uint64_t>(c.index_range)));
    dxs.push_back(Tensor::zeros(s.batched(batch), DType::f64));
  }
  for (size_t k = 0; k < xs.size(); ++k) xp.push_back(&xs[k]), dxp.push_back(&dxs[k]);
  const Tensor r = random_tensor(out_shape.batched(batch), rng);  // L = Σ y · r, so ∂L/∂y = r
  Tensor y = Tensor::zeros(out_shape.batched(batch), DType::f64);

  auto loss = [&] {
    layer->forward(xp, y, {true, false});
    return dot(y, r);
  };
  loss();
  layer->backward(xp, y, r, dxp, {true, false});

  auto numeric = [&](double& v) { return central_difference(v, loss); };
  for (size_t k = 0; k < xs.size(); ++k)
    for (int64_t i = 0; i < xs[k].numel(); ++i)
      check_close(dxs[k].data<double>()[i], numeric(xs[k].data<double>()[i]),
                  type + " dx" + std::to_string(k) + "[" + std::to_string(i) + "]");
  std::vector<Tensor> analytic;
  for (Param* p : layer->params()) analytic.push_back(p->grad.clone());
  const auto params = layer->params();
  for (size_t k = 0; k < params.size(); ++k)
    for (int64_t i = 0; i < params[k]->value.numel(); ++i)
      check_close(analytic[k].data<double>()[i], numeric(params[k]->value.data<double>()[i]),
                  type + " " + params[k]->name + "[" + std::to_string(i) + "]");
  // accumulate_grads adds to what is there (gradient accumulation relies on it).
  loss();
  layer->backward(xp, y, r, dxp, {true, true});
  for (size_t k = 0; k < params.size(); ++k)
    for (int64_t i = 0; i < params[k]->grad.numel(); ++i)
      CHECK(params[k]->grad.data<double>()[i] == Approx(2 * analytic[k].data<double>()[i]).margin(1e-12));
}

// Every parameter gradient of a whole model (loss = <model(x), r>) against central differences.
void check_model_gradients(Model& m, const Tensor& x, const Tensor& r) {
  auto loss = [&] { return dot(m.forward(x, {true, false}), r); };
  loss();
  m.backward(r, {true, false});
  std::vector<Tensor> analytic;
  for (Param* p : m.params()) analytic.push_back(p->grad.clone());
  size_t k = 0;
  for (auto& [name, p] : m.named_params()) {
    for (int64_t i = 0; i < p->value.numel(); ++i)
      check_close(analytic[k].data<double>()[i], central_difference(p->value.data<double>()[i], loss),
                  name + "[" + std::to_string(i) + "]");
    ++k;
  }
}

}  // namespace

TEST_CASE("a branching model's parameter gradients match central differences", "[gradcheck][cpu]") {
  // Two consumers of one output, a view (flatten) between branches, add and concat: the graph must sum the
  // gradient contributions of every consumer.
  const ConfigNode cfg = ConfigNode::load_string(R"(layers:
  - {type: conv2d, name: stem, out_channels: 2, kernel_size: 3, padding: 1}
  - {type: conv2d, name: branch, out_channels: 2, kernel_size: 1}
  - {type: add, name: sum, inputs: [stem, branch]}
  - {type: flatten, name: flat, inputs: stem}
  - {type: flatten, name: flat2, inputs: sum}
  - {type: concat, name: both, inputs: [flat, flat2, flat]}
  - tanh
  - {type: linear, out_features: 3}
)",
                                                 "dag.yaml");
  Model m = Model::build(parse_model_spec(cfg), Shape{1, 3, 3}, DType::f64, Device::cpu(), 5);
  m.allocate(2);
  Rng rng(8, 8);
  Tensor x = random_tensor(Shape{2, 1, 3, 3}, rng);
  const Tensor r = random_tensor(Shape{2, 3}, rng);
  check_model_gradients(m, x, r);
}

// An add shares its gradient with the inputs it alone writes the gradient of, instead of copying it: chains of adds
// (an input that is itself such an add, through a view), an input that other layers also write (a copy, then their
// scratch sums), and an add of one input twice, against central differences.
TEST_CASE("adds that share their gradient with their inputs give the gradients of copies", "[gradcheck][cpu]") {
  const ConfigNode cfg = ConfigNode::load_string(R"(layers:
  - {type: linear, name: a, out_features: 6}
  - {type: linear, name: b, out_features: 6}
  - {type: add, name: s1, inputs: [a, b]}
  - tanh
  - {type: linear, name: c, out_features: 6}
  - {type: add, name: s2, inputs: [s1, c]}
  - {type: add, name: s3, inputs: [s2, s2]}
  - {type: flatten, name: flat, inputs: s3}
  - {type: add, name: s4, inputs: [flat, a]}
  - {type: linear, out_features: 2}
)",
                                                 "residual.yaml");
  Model m = Model::build(parse_model_spec(cfg), Shape{3}, DType::f64, Device::cpu(), 6);
  m.allocate(2);
  Rng rng(9, 9);
  Tensor x = random_tensor(Shape{2, 3}, rng);
  const Tensor r = random_tensor(Shape{2, 2}, rng);
  check_model_gradients(m, x, r);
}

// GPT-2's tied lm head: the linear reads the embedding's table, so the one parameter's gradient is the sum of both
// uses (the linear's backward writes it, the embedding's adds to it), with and without gradient accumulation.
// With out_features below the table's rows (llm.c's vocabulary V padded to Vp) the head reads the first rows only:
// the padded rows' gradient is the embedding's alone.
TEST_CASE("a linear tied to an embedding gets the sum of both uses' gradients", "[gradcheck][cpu]") {
  const int64_t out = GENERATE(5, 3);
  const ConfigNode cfg = ConfigNode::load_string(fmt::format(R"(layers:
  - {{type: embedding, name: wte, num_embeddings: 5, embedding_dim: 3}}
  - {{type: layernorm, name: ln}}
  - {{type: linear, name: head, out_features: {}, tied_to: wte, bias: false}}
)",
                                                             out),
                                                 "tied.yaml");
  INFO("out_features " << out);
  Model m = Model::build(parse_model_spec(cfg), Shape{4}, DType::f64, Device::cpu(), 5);
  const auto named = m.named_params();
  REQUIRE(named.size() == 3);  // wte.weight, ln.weight, ln.bias: the head has no weight of its own
  CHECK(named[0].first == "wte.weight");
  CHECK(m.param_count() == 5 * 3 + 2 * 3);
  CHECK(YAML::Dump(m.resolved_layers()).find("tied_to: wte") != std::string::npos);
  m.allocate(2);
  Rng rng(8, 8);
  Tensor x = Tensor::empty(Shape{2, 4}, DType::f64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = static_cast<double>(rng.below(5));
  x.data<double>()[0] = 4;  // the last row is looked up, so a padded row has the embedding's gradient
  const Tensor r = random_tensor(Shape{2, 4, out}, rng);
  auto loss = [&] { return dot(m.forward(x, {true, false}), r); };
  loss();
  m.backward(r, {true, false});
  Param& wte = *named[0].second;
  const Tensor analytic = wte.grad.clone();
  for (int64_t i = 0; i < wte.value.numel(); ++i)
    check_close(analytic.data<double>()[i], central_difference(wte.value.data<double>()[i], loss),
                "wte.weight[" + std::to_string(i) + "]");
  if (out < 5) {  // the padded rows were used by the embedding (token 4 appears) but not by the head
    CHECK(m.output_shape() == Shape{4, out});
    CHECK(analytic.data<double>()[4 * 3] != 0.0);
  }
  loss();
  m.backward(r, {true, true});  // a second micro-batch adds the same again
  for (int64_t i = 0; i < wte.grad.numel(); ++i)
    CHECK(wte.grad.data<double>()[i] == Approx(2 * analytic.data<double>()[i]).margin(1e-12));
  loss();
  m.backward(r, {true, false});  // a new step overwrites every row, the padded ones too
  for (int64_t i = 0; i < wte.grad.numel(); ++i)
    CHECK(wte.grad.data<double>()[i] == Approx(analytic.data<double>()[i]).margin(1e-12));
}

TEST_CASE("tied_to errors name the key", "[config][cpu]") {
  auto error = [](const std::string& layers) {
    try {
      Model::build(parse_model_spec(ConfigNode::load_string("layers:\n" + layers, "t.yaml")), Shape{4}, DType::f32,
                   Device::cpu(), 1);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string emb = "  - {type: embedding, name: wte, num_embeddings: 5, embedding_dim: 3}\n";
  CHECK_THAT(error(emb + "  - {type: linear, out_features: 5, tied_to: wtf}\n"),
             Catch::StartsWith("layers[1].tied_to: no layer is named \"wtf\""));
  CHECK_THAT(error(emb + "  - {type: linear, out_features: 6, tied_to: wte}\n"),
             Catch::StartsWith("layers[1].tied_to: \"wte\" has a weight of [5, 3], but this layer needs [6, 3] (at "
                               "most its 5 rows)"));
  CHECK_THAT(error(emb + "  - {type: layernorm, name: ln}\n  - {type: linear, out_features: 3, tied_to: ln}\n"),
             Catch::StartsWith("layers[2].tied_to: \"ln\" is a layernorm, which has no weight to share"));
}

TEST_CASE("every registered layer has a gradient check", "[gradcheck][cpu]") {
  for (const LayerSpec& spec : layer_registry()) {
    INFO("layer type " << spec.type);
    CHECK(layer_cases().count(spec.type) > 0);
  }
}

TEST_CASE("layer gradients match central differences in double", "[gradcheck][cpu]") {
  for (const auto& [type, c] : layer_cases()) {
    SECTION(type + " " + c.yaml) { gradcheck_layer(type, c); }
  }
}

namespace {

void gradcheck_loss(const LossConfig& lc, const Tensor& target, int64_t batch, int64_t width) {
  Rng rng(3, 3);
  Tensor out = random_tensor(Shape{batch, width}, rng);
  Tensor dout = Tensor::zeros(out.shape(), DType::f64);
  Tensor stats = Tensor::zeros(Shape{2}, DType::f64);
  const double scale = 1.0 / static_cast<double>(batch);
  compute_loss(lc, out, target, scale, dout, stats);
  Tensor none;
  auto loss = [&] {
    stats.zero_();
    compute_loss(lc, out, target, scale, none, stats);
    return scale * stats.data<double>()[0];
  };
  for (int64_t i = 0; i < out.numel(); ++i)
    check_close(dout.data<double>()[i], central_difference(out.data<double>()[i], loss),
                to_string(lc.type) + " dout[" + std::to_string(i) + "]");
}

}  // namespace

TEST_CASE("loss gradients match central differences in double", "[gradcheck][cpu]") {
  Tensor labels = Tensor::empty(Shape{4}, DType::i32);
  for (int i = 0; i < 4; ++i) labels.data<int32_t>()[i] = (i * 3) % 5;
  SECTION("cross_entropy") { gradcheck_loss({LossType::cross_entropy, 0.0}, labels, 4, 5); }
  SECTION("cross_entropy with label smoothing") { gradcheck_loss({LossType::cross_entropy, 0.1}, labels, 4, 5); }
  SECTION("mse") {
    Rng rng(9, 9);
    gradcheck_loss({LossType::mse, 0.0}, random_tensor(Shape{3, 4}, rng), 3, 4);
  }
}

TEST_CASE("cross_entropy values match hand-computed ones", "[cpu]") {
  // logits [1, 2, 3], label 2: loss = log(e¹ + e² + e³) − 3 = 0.40760596444 (computed by hand, log-sum-exp).
  Tensor logits = Tensor::empty(Shape{2, 3}, DType::f32);
  const float v[] = {1, 2, 3, 1000, 0, -1000};  // the second row would overflow a naive softmax
  std::copy(v, v + 6, logits.data<float>());
  Tensor labels = Tensor::empty(Shape{2}, DType::i32);
  labels.data<int32_t>()[0] = 2;
  labels.data<int32_t>()[1] = 0;
  Tensor stats = Tensor::zeros(Shape{2}, DType::f64), none;
  ops::cross_entropy(logits, labels, 0.0, 1.0, none, stats);
  CHECK(stats.data<double>()[0] == Approx(0.40760596444).epsilon(1e-7));
  CHECK(stats.data<double>()[1] == 2);  // both argmaxes are right
}

// GPT-2's initialisation from the config: N(0, std) tables and weights, zero biases, scaled residual projections.
TEST_CASE("init_std and proj_init_std draw N(0, std) weights and zero biases", "[cpu]") {
  const ConfigNode cfg = ConfigNode::load_string(R"(layers:
  - {type: embedding, name: wte, num_embeddings: 300, embedding_dim: 64, init_std: 0.02}
  - {type: causal_self_attention, name: attn, heads: 4, proj_init_std: 0.005}
  - {type: linear, name: fc, out_features: 256, init_std: 0.01}
  - {type: linear, name: plain, out_features: 8}
)",
                                                 "init.yaml");
  Model m = Model::build(parse_model_spec(cfg), Shape{16}, DType::f64, Device::cpu(), 3);
  auto stats = [&](const std::string& name) {
    for (const auto& [n, p] : m.named_params())
      if (n == name) {
        double s = 0, s2 = 0;
        const int64_t k = p->value.numel();
        for (int64_t i = 0; i < k; ++i) {
          s += p->value.data<double>()[i];
          s2 += p->value.data<double>()[i] * p->value.data<double>()[i];
        }
        return std::pair{s / k, std::sqrt(s2 / k)};
      }
    FAIL("no parameter " << name);
    return std::pair{0.0, 0.0};
  };
  CHECK(stats("wte.weight").second == Approx(0.02).epsilon(0.03));
  CHECK(stats("attn.qkv.weight").second == Approx(0.02).epsilon(0.03));
  CHECK(stats("attn.proj.weight").second == Approx(0.005).epsilon(0.03));
  CHECK(stats("fc.weight").second == Approx(0.01).epsilon(0.03));
  CHECK(stats("fc.bias").second == 0.0);
  // Without init_std: torch.nn.Linear's U(±1/√in), whose RMS is 1/√(3·in), and a uniform bias.
  CHECK(stats("plain.weight").second == Approx(1 / std::sqrt(3.0 * 256)).epsilon(0.05));
  CHECK(stats("plain.bias").second > 0.0);
  CHECK(YAML::Dump(m.resolved_layers()).find("init_std: 0.01") != std::string::npos);
}

// Model::build runs a relu whose only reader is a max pool after the pool (model_spec.cpp, relu_after_max_pool). The
// model must still compute relu-then-pool: its output and every gradient equal that chain run op by op, bit for bit, in
// f32, on a conv output with ties (channels of constant value, negative and positive), and the output with a NaN in the
// input; the config's wiring is what resolved_layers gives back; a relu with a second reader stays where it is.
TEST_CASE("a relu before a max pool runs after it with the outputs and gradients of relu then pool",
          "[gradcheck][cpu]") {
  const std::string yaml = R"(layers:
  - {type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}
  - relu
  - {type: maxpool2d, kernel_size: 2}
  - flatten
)";
  Model m = Model::build(parse_model_spec(ConfigNode::load_string(yaml, "t.yaml")), Shape{2, 6, 6}, DType::f32,
                         Device::cpu(), 3);
  REQUIRE(m.nodes().size() == 4);
  CHECK(m.nodes()[1].type == "maxpool2d");  // executed before the relu
  CHECK(m.nodes()[2].type == "relu");
  CHECK(YAML::Dump(m.resolved_layers()) ==
        YAML::Dump(Model::build(parse_model_spec(ConfigNode::load_string(yaml, "t.yaml")), Shape{2, 6, 6}, DType::f32,
                                Device::cpu(), 3)
                       .resolved_layers()));
  CHECK(YAML::Dump(m.resolved_layers()).find("inputs") == std::string::npos);  // the config's plain sequence

  const int64_t batch = 3;
  Rng rng(21, 21);
  Tensor x = Tensor::empty(Shape{batch, 2, 6, 6}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.uniform() * 2 - 1);
  auto params = m.named_params();
  REQUIRE(params.size() == 2);
  Tensor& w = params[0].second->value;                                // [4, 2, 3, 3]
  Tensor& b = params[1].second->value;                                // [4]
  for (int64_t i = 0; i < 2 * 2 * 9; ++i) w.data<float>()[i] = 0.0f;  // channels 0 and 1: their bias everywhere
  b.data<float>()[0] = -0.5f;
  b.data<float>()[1] = 0.25f;

  m.allocate(batch);
  const Tensor y = m.forward(x, LayerContext{});
  Tensor dout = Tensor::empty(y.shape(), DType::f32);
  for (int64_t i = 0; i < dout.numel(); ++i) dout.data<float>()[i] = static_cast<float>(rng.uniform() - 0.5);
  m.backward(dout, LayerContext{});

  // The chain as the config writes it.
  const Window2d conv_win{3, 3, 1, 1, 1, 1}, pool_win{2, 2, 2, 2, 0, 0};
  Tensor c = Tensor::empty(Shape{batch, 4, 6, 6}, DType::f32), r = Tensor::empty(c.shape(), DType::f32);
  Tensor p = Tensor::empty(Shape{batch, 4, 3, 3}, DType::f32);
  ops::conv2d_forward(x, w, b, conv_win, 1, c);
  ops::activation_forward(Activation::relu, c, r);
  ops::pool2d_forward(PoolKind::max, r, pool_win, p);
  const Tensor dp = dout.view(p.shape());
  Tensor dr = Tensor::empty(c.shape(), DType::f32), dc = Tensor::empty(c.shape(), DType::f32);
  ops::pool2d_backward(PoolKind::max, r, dp, pool_win, dr);
  ops::activation_backward(Activation::relu, c, r, dr, dc);
  Tensor no_dx, dw = Tensor::empty(w.shape(), DType::f32), db = Tensor::empty(b.shape(), DType::f32);
  ops::conv2d_backward(x, w, dc, conv_win, 1, no_dx, dw, db, 0.0);

  auto same_bits = [](const Tensor& got, const Tensor& want, const char* what) {
    REQUIRE(got.numel() == want.numel());
    for (int64_t i = 0; i < got.numel(); ++i) {
      const float a = got.data<float>()[i], e = want.data<float>()[i];
      INFO(what << " element " << i << ": model " << a << ", relu then pool " << e);
      CHECK((std::memcmp(&a, &e, sizeof a) == 0 || (std::isnan(a) && std::isnan(e))));
    }
  };
  same_bits(y, p, "output");
  same_bits(params[0].second->grad, dw, "weight gradient");
  same_bits(params[1].second->grad, db, "bias gradient");

  // A NaN in the input: relu keeps it and the pool passes it on, in either order.
  x.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  const Tensor y_nan = m.forward(x, LayerContext{});
  ops::conv2d_forward(x, w, b, conv_win, 1, c);
  ops::activation_forward(Activation::relu, c, r);
  ops::pool2d_forward(PoolKind::max, r, pool_win, p);
  same_bits(y_nan, p, "output with a NaN");
  int nan_outputs = 0;
  for (int64_t i = 0; i < y_nan.numel(); ++i) nan_outputs += std::isnan(y_nan.data<float>()[i]) ? 1 : 0;
  CHECK(nan_outputs > 0);

  // A relu read by a second layer too is not moved.
  Model kept = Model::build(parse_model_spec(ConfigNode::load_string(R"(layers:
  - {type: conv2d, out_channels: 2, kernel_size: 3, padding: 1}
  - {type: relu, name: act}
  - {type: maxpool2d, kernel_size: 2}
  - {type: flatten, name: a}
  - {type: flatten, name: b, inputs: act}
  - {type: concat, inputs: [a, b]}
)",
                                                                     "t.yaml")),
                            Shape{1, 4, 4}, DType::f32, Device::cpu(), 3);
  CHECK(kept.nodes()[1].type == "relu");
  CHECK(kept.nodes()[2].type == "maxpool2d");
}
