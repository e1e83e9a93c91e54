// LoRA: adapters on dense and attention products, against a dense reference; merged into the weights for export;
// trained alone on top of frozen weights.
#include "config/config.h"
#include "core/rng.h"
#include "graph/model.h"
#include "helpers.h"
#include "io/llmc.h"
#include "io/safetensors.h"
#include "llmc_cases.h"
#include "ops/precision.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

// A two-block GPT's layers (no tied head), with or without train.lora's plan on every product it can adapt.
const char* const kLoraGpt = R"(layers:
  - {type: embedding, name: wte, num_embeddings: 32, embedding_dim: 16}
  - {type: positional_embedding, name: wpe, max_len: 8}
  - repeat: 2
    name: h
    layers:
      - {type: layernorm, name: ln_1}
      - {type: causal_self_attention, name: attn, heads: 2}
      - {type: add, name: res_1, inputs: [input, attn]}
      - {type: layernorm, name: ln_2}
      - {type: linear, name: fc, out_features: 32}
      - {type: gelu, approximate: tanh}
      - {type: linear, name: proj, out_features: 16}
      - {type: add, inputs: [res_1, proj]}
  - {type: layernorm, name: ln_f}
  - {type: linear, name: lm_head, out_features: 32, bias: false}
)";

Model lora_gpt(DType dtype, bool lora, double b_value = 0) {
  ModelSpec spec = parse_model_spec(ConfigNode::load_string(kLoraGpt, "m.yaml"));
  if (lora)
    spec.lora = parse_lora_plan(
        ConfigNode::load_string("{targets: ['*.attn.*', '*.fc.weight', lm_head.weight], rank: 3, alpha: 5}", "l.yaml"));
  Model m = Model::build(spec, Shape{8}, dtype, Device::cpu(), 7);
  if (b_value != 0)  // a trained adapter: B not zero
    for (auto& [name, p] : m.named_params())
      if (name.find("lora_B") != std::string::npos)
        for (int64_t i = 0; i < p->value.numel(); ++i) {
          const double v = b_value * static_cast<double>(i % 7 - 3);
          if (dtype == DType::f64)
            p->value.data<double>()[i] = v;
          else
            p->value.data<float>()[i] = static_cast<float>(v);
        }
  return m;
}

Tensor lora_tokens(DType dtype) {
  Tensor x = Tensor::empty(Shape{2, 8}, dtype);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = static_cast<double>((i * 11 + 3) % 32);
    if (dtype == DType::f64)
      x.data<double>()[i] = v;
    else
      x.data<float>()[i] = static_cast<float>(v);
  }
  return x;
}

std::string lora_bytes(const Tensor& t) { return std::string(static_cast<const char*>(t.raw()), t.bytes()); }

double lora_largest_difference(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return worst;
}

}  // namespace

TEST_CASE("fresh LoRA adapters leave the model as it was, and the base weights are the plain model's", "[lora]") {
  Model plain = lora_gpt(DType::f32, false), adapted = lora_gpt(DType::f32, true);
  std::map<std::string, std::string> base;
  for (auto& [name, t] : plain.state_tensors()) base[name] = lora_bytes(*t);
  size_t adapters = 0;
  for (auto& [name, t] : adapted.state_tensors()) {
    if (name.find("lora_") != std::string::npos) {
      ++adapters;
      continue;
    }
    INFO(name);
    CHECK(base.at(name) == lora_bytes(*t));
  }
  CHECK(adapters == 2 * (2 * 3 + 1));  // A and B on qkv, proj and fc in each block, and on the head
  plain.allocate(2);
  adapted.allocate(2);
  LayerContext ctx;
  ctx.training = false;
  const Tensor x = lora_tokens(DType::f32);
  CHECK(lora_bytes(plain.forward(x, ctx)) == lora_bytes(adapted.forward(x, ctx)));
}

TEST_CASE("LoRA's gradients are the dense reference's, projected: dA = (α/r)·Bᵀ·dW, dB = (α/r)·dW·Aᵀ", "[lora]") {
  // A dense layer whose weight is W + (α/r)·B·A computes the same function; its weight gradient dW gives the
  // adapter's through the chain rule. In f64, so that the two differ by rounding only.
  const char* one = "layers:\n  - {type: linear, out_features: 4, lora: {rank: 2, alpha: 3}}\n";
  Model m =
      Model::build(parse_model_spec(ConfigNode::load_string(one, "m.yaml")), Shape{5}, DType::f64, Device::cpu(), 3);
  std::map<std::string, Param*> p;
  for (auto& [name, param] : m.named_params()) p[name] = param;
  REQUIRE(p.size() == 4);
  Tensor& a = p.at("layers.0.lora_A")->value;
  Tensor& b = p.at("layers.0.lora_B")->value;
  for (int64_t i = 0; i < b.numel(); ++i) b.data<double>()[i] = 0.1 * static_cast<double>(i % 5 - 2);
  const double s = 3.0 / 2.0;
  Model dense = Model::build(
      parse_model_spec(ConfigNode::load_string("layers:\n  - {type: linear, out_features: 4}\n", "d.yaml")), Shape{5},
      DType::f64, Device::cpu(), 3);
  std::map<std::string, Param*> d;
  for (auto& [name, param] : dense.named_params()) d[name] = param;
  Tensor& w = d.at("layers.0.weight")->value;
  w.copy_from(p.at("layers.0.weight")->value);
  d.at("layers.0.bias")->value.copy_from(p.at("layers.0.bias")->value);
  for (int64_t o = 0; o < 4; ++o)
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t k = 0; k < 2; ++k)
        w.data<double>()[o * 5 + i] += s * b.data<double>()[o * 2 + k] * a.data<double>()[k * 5 + i];
  Tensor x = Tensor::empty(Shape{3, 5}, DType::f64), dy = Tensor::empty(Shape{3, 4}, DType::f64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = 0.3 * static_cast<double>(i % 7 - 3);
  for (int64_t i = 0; i < dy.numel(); ++i) dy.data<double>()[i] = 0.2 * static_cast<double>(i % 5 - 2);
  m.allocate(3);
  dense.allocate(3);
  LayerContext ctx;
  const Tensor y = m.forward(x, ctx).clone();
  const Tensor yd = dense.forward(x, ctx);
  for (int64_t i = 0; i < y.numel(); ++i) CHECK(y.data<double>()[i] == Approx(yd.data<double>()[i]).margin(1e-12));
  m.backward(dy, ctx);
  dense.backward(dy, ctx);
  const Tensor& dw = d.at("layers.0.weight")->grad;
  const Tensor& da = p.at("layers.0.lora_A")->grad;
  const Tensor& db = p.at("layers.0.lora_B")->grad;
  for (int64_t k = 0; k < 2; ++k)
    for (int64_t i = 0; i < 5; ++i) {
      double want = 0;
      for (int64_t o = 0; o < 4; ++o) want += s * b.data<double>()[o * 2 + k] * dw.data<double>()[o * 5 + i];
      CHECK(da.data<double>()[k * 5 + i] == Approx(want).margin(1e-12));
    }
  for (int64_t o = 0; o < 4; ++o)
    for (int64_t k = 0; k < 2; ++k) {
      double want = 0;
      for (int64_t i = 0; i < 5; ++i) want += s * dw.data<double>()[o * 5 + i] * a.data<double>()[k * 5 + i];
      CHECK(db.data<double>()[o * 2 + k] == Approx(want).margin(1e-12));
    }
  // The base weight and bias are still trained as a dense layer's unless frozen (train.lora freezes them).
  CHECK(lora_bytes(p.at("layers.0.bias")->grad) == lora_bytes(d.at("layers.0.bias")->grad));
}

TEST_CASE("a merged model computes what the adapted one did, and decoding with adapters matches the forward pass",
          "[lora]") {
  Model adapted = lora_gpt(DType::f32, true, 0.05);
  Model merged = lora_gpt(DType::f32, true, 0.05);
  merged.merge_lora();
  CHECK_FALSE(merged.has_lora());
  for (auto& [name, t] : merged.state_tensors()) CHECK(name.find("lora_") == std::string::npos);
  adapted.allocate(2);
  merged.allocate(2);
  LayerContext ctx;
  ctx.training = false;
  const Tensor x = lora_tokens(DType::f32);
  const Tensor want = adapted.forward(x, ctx).clone();
  const Tensor got = merged.forward(x, ctx).clone();
  // Folded in f64 and rounded once: the logits (of order 1) differ by float rounding only; an adapter left out or
  // scaled wrongly moves them by ≥ 1e-2.
  CHECK(lora_largest_difference(want, got) < 2e-5);
  // Generation's incremental pass (the key/value cache) runs the adapters on the new positions alone.
  Tensor one = Tensor::empty(Shape{1, 8}, DType::f32);
  for (int64_t i = 0; i < 8; ++i) one.data<float>()[i] = x.data<float>()[i];
  const Tensor whole = adapted.forward(one, ctx).clone();
  const int64_t vocab = 32;
  for (int64_t t = 0; t < 8; ++t) {
    Tensor xt = Tensor::empty(Shape{1, 1}, DType::f32);
    xt.data<float>()[0] = one.data<float>()[t];
    const Tensor& yt = adapted.forward_decode(xt, t);
    for (int64_t v = 0; v < vocab; ++v)
      CHECK(yt.data<float>()[v] == Approx(whole.data<float>()[t * vocab + v]).margin(1e-5));
  }
}

TEST_CASE("adapters keep fused chains and recompute exact: the same bits as the layers one after another", "[lora]") {
  // An adapter's path joins its product before any epilogue (the residual add after attention's projection, GELU
  // after a dense layer), so a layer with one takes no epilogue.
  std::vector<std::string> runs;
  for (int mode = 0; mode < 3; ++mode) {
    Model m = lora_gpt(DType::f32, true, 0.05);
    m.set_fusion(mode == 1);
    if (mode == 2) REQUIRE(m.set_recompute(Recompute::all).empty());
    m.allocate(2);
    LayerContext ctx;
    const Tensor& y = m.forward(lora_tokens(DType::f32), ctx);
    Tensor dy = Tensor::empty(y.shape(), DType::f32);
    for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = 0.01f * static_cast<float>(i % 9 - 4);
    std::string bits = lora_bytes(y);
    m.backward(dy, ctx);
    for (const auto& [name, p] : m.named_params()) bits += lora_bytes(p->grad);
    runs.push_back(bits);
  }
  CHECK(runs[1] == runs[0]);
  CHECK(runs[2] == runs[0]);
}

TEST_CASE("an adapter on a tied head is not folded into the table the embedding reads", "[lora]") {
  const char* tied = R"(layers:
  - {type: embedding, name: wte, num_embeddings: 20, embedding_dim: 8}
  - {type: linear, name: head, out_features: 20, bias: false, tied_to: wte, lora: {rank: 2}}
)";
  Model m =
      Model::build(parse_model_spec(ConfigNode::load_string(tied, "m.yaml")), Shape{4}, DType::f32, Device::cpu(), 1);
  CHECK(m.has_lora());
  CHECK_THROWS_WITH(m.merge_lora(), Catch::Contains("tied layer"));
}

namespace {

std::string lora_gpt_config(const std::string& tok, const std::string& extra) {
  return fmt::format(R"(name: lora
seed: 3
device: cpu
data: {{format: tokens, train: {{path: {0}/train_*.bin}}, test: {{path: {0}/val_*.bin}}, block_size: 16, batch_size: 4}}
model:
  layers:
    - {{type: embedding, name: wte, num_embeddings: 256, embedding_dim: 32}}
    - {{type: positional_embedding, name: wpe, max_len: 16}}
    - repeat: 2
      name: h
      layers:
        - {{type: layernorm, name: ln_1}}
        - {{type: causal_self_attention, name: attn, heads: 2}}
        - {{type: add, name: res_1, inputs: [input, attn]}}
        - {{type: layernorm, name: ln_2}}
        - {{type: linear, name: fc, out_features: 64}}
        - {{type: gelu, approximate: tanh}}
        - {{type: linear, name: proj, out_features: 32}}
        - {{type: add, inputs: [res_1, proj]}}
    - {{type: layernorm, name: ln_f}}
    - {{type: linear, name: lm_head, tied_to: wte, bias: false, out_features: 256}}
optimizer: {{type: adamw, lr: 0.01}}
train: {{epochs: 1, max_steps: 12, log_every: 4{1}}}
checkpoint: {{every_steps: 6}}
)",
                     tok, extra);
}

std::map<std::string, std::string> lora_weights(const std::string& path) {
  std::map<std::string, std::string> out;
  for (const auto& [name, t] : read_safetensors(path)) out[name] = lora_bytes(t);
  return out;
}

}  // namespace

TEST_CASE(
    "a LoRA run trains the adapters alone, counts them as check does, and exports merged weights that "
    "evaluate to its loss",
    "[e2e][lora]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 300; ++i) text += fmt::format("line {} of a small text, said {} times. ", i, i % 7);
  write_text(dir / "text.txt", text);
  REQUIRE(run_gputrain(fmt::format("tokenize {} --out {}", dir / "text.txt", dir / "tok")).exit_code == 0);
  write_text(dir / "base.yaml", lora_gpt_config(dir / "tok", ""));
  REQUIRE(
      run_gputrain(fmt::format("train {} --quiet --threads 2 --out {}", dir / "base.yaml", dir / "base")).exit_code ==
      0);
  const std::string lora = fmt::format(
      ", init_from: {}, lora: {{targets: ['*.attn.qkv.weight', '*.fc.weight'], rank: 4, alpha: 8}}", dir / "base");
  write_text(dir / "lora.yaml", lora_gpt_config(dir / "tok", lora));
  const auto check = run_gputrain(fmt::format("check {}", dir / "lora.yaml"));
  INFO(check.output);
  REQUIRE(check.exit_code == 0);
  // Per block, qkv: A [4, 32] + B [96, 4]; fc: [4, 32] + [64, 4].
  const int64_t adapters = 2 * (4 * 32 + 96 * 4 + 4 * 32 + 64 * 4);
  CHECK_THAT(check.output, Catch::Contains(fmt::format("trainable: {} of", adapters)));
  const auto run = run_gputrain(fmt::format("train {} --threads 2 --out {}", dir / "lora.yaml", dir / "run"));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK_THAT(run.output, Catch::Contains(fmt::format("({} trainable: the LoRA adapters)", adapters)));
  // The base weights are the source's, bit for bit; the adapters moved.
  const auto src = lora_weights(dir / "base/model.safetensors");
  const auto out = lora_weights(dir / "run/model.safetensors");
  for (const auto& [name, bytes] : src) {
    INFO(name);
    CHECK(out.at(name) == bytes);
  }
  CHECK(out.size() == src.size() + 8);
  CHECK(out.at("h.0.fc.lora_B") != std::string(out.at("h.0.fc.lora_B").size(), '\0'));
  // AdamW's two moments for each adapter tensor, nothing else.
  CHECK(read_safetensors(dir / "run/checkpoints/step-12/optimizer.safetensors").size() == 2 * 8);
  // A resume from step 6 ends where the run ended, bit for bit, with the init_from source gone.
  std::filesystem::rename(dir / "base", dir / "base-moved");
  const auto resumed = run_gputrain(fmt::format("train {} --quiet --threads 2 --resume {} --out {}", dir / "lora.yaml",
                                                dir / "run/checkpoints/step-6", dir / "resumed"));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(lora_weights(dir / "resumed/model.safetensors") == out);
  std::filesystem::rename(dir / "base-moved", dir / "base");
  // export --merge-lora: plain weights, which the plain config evaluates to the adapted run's loss.
  const auto merged =
      run_gputrain(fmt::format("export {} --to {} --merge-lora", dir / "run", dir / "merged.safetensors"));
  INFO(merged.output);
  REQUIRE(merged.exit_code == 0);
  const auto plain = lora_weights(dir / "merged.safetensors");
  CHECK(plain.size() == src.size());
  CHECK(plain.at("h.0.fc.weight") != src.at("h.0.fc.weight"));
  CHECK(plain.at("h.0.proj.weight") == src.at("h.0.proj.weight"));
  const auto eval_lora = run_gputrain(fmt::format("eval {} --checkpoint {} --json", dir / "lora.yaml", dir / "run"));
  const auto eval_merged =
      run_gputrain(fmt::format("eval {} --checkpoint {} --json", dir / "base.yaml", dir / "merged.safetensors"));
  INFO(eval_lora.output << eval_merged.output);
  REQUIRE(eval_lora.exit_code == 0);
  REQUIRE(eval_merged.exit_code == 0);
  const double a = json_number(eval_lora.output, "test_loss").value_or(-1);
  const double b = json_number(eval_merged.output, "test_loss").value_or(-2);
  CHECK(std::abs(a - b) < 1e-5 * std::abs(a));
  // A run of plain weights has nothing to merge.
  CHECK(run_gputrain(fmt::format("export {} --to {} --merge-lora", dir / "base", dir / "x.safetensors")).exit_code ==
        2);
}

TEST_CASE("export llmc --merge-lora writes an llm.c GPT that evaluates to the LoRA run's loss", "[e2e][lora]") {
  TempDir dir;
  const LlmcHeader h = tiny_llmc(3);  // vocabulary 60: digits, spaces and dots are tokens below it
  write_llmc(dir / "orig.bin", random_checkpoint(h, 5));
  REQUIRE(run_gputrain("import llmc " + (dir / "orig.bin") + " --out " + (dir / "imp")).exit_code == 0);
  std::string text;
  for (int i = 0; i < 2000; ++i) text += fmt::format("{} {}. ", i, i * 7 % 13);
  write_text(dir / "digits.txt", text);
  REQUIRE(run_gputrain(fmt::format("tokenize {} --out {}", dir / "digits.txt", dir / "tok")).exit_code == 0);
  const std::string data = fmt::format(
      "--set '+data.train={{path: \"{0}/train_*.bin\"}}' --set 'data.test.path={0}/val_*.bin'", dir / "tok");
  const std::string lora = data + " --set '+train.lora={targets: [\"*.attn.*\", \"*.fc.weight\"], rank: 2, alpha: 4}'";
  const auto run =
      run_gputrain(fmt::format("train {} --threads 2 --out {} {} --set train.max_steps=6 --set "
                               "+train.init_from={} --set optimizer.lr=0.01",
                               dir / "imp/config.yaml", dir / "run", lora, dir / "orig.bin"));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const auto refused = run_gputrain(fmt::format("export llmc {} {} --checkpoint {} --out {}", dir / "imp/config.yaml",
                                                lora, dir / "run", dir / "m.bin"));
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("--merge-lora"));
  const auto exported = run_gputrain(fmt::format("export llmc {} {} --checkpoint {} --out {} --merge-lora",
                                                 dir / "imp/config.yaml", lora, dir / "run", dir / "m.bin"));
  INFO(exported.output);
  REQUIRE(exported.exit_code == 0);
  REQUIRE(run_gputrain("import llmc " + (dir / "m.bin") + " --out " + (dir / "back")).exit_code == 0);
  const auto eval_lora =
      run_gputrain(fmt::format("eval {} {} --checkpoint {} --json", dir / "imp/config.yaml", lora, dir / "run"));
  const auto eval_merged =
      run_gputrain(fmt::format("eval {} {} --checkpoint {} --json", dir / "back/config.yaml", data, dir / "back"));
  INFO(eval_lora.output << eval_merged.output);
  const double a = json_number(eval_lora.output, "test_loss").value_or(-1);
  const double b = json_number(eval_merged.output, "test_loss").value_or(-2);
  CHECK(std::abs(a - b) < 1e-5 * std::abs(a));
}

TEST_CASE("train.lora errors name the key", "[lora]") {
  TempDir dir;
  write_text(dir / "t.yaml", kTinyConfig);
  const auto none =
      run_gputrain(fmt::format("check {} --set '+train.lora={{targets: [\"*.qkv.weight\"]}}'", dir / "t.yaml"));
  CHECK(none.exit_code == 2);
  CHECK_THAT(none.output, Catch::Contains("train.lora.targets[0]") && Catch::Contains("layers.0.weight"));
  const auto rank = run_gputrain(
      fmt::format("check {} --set '+train.lora={{targets: [\"layers.0.weight\"], rank: 0}}'", dir / "t.yaml"));
  CHECK(rank.exit_code == 2);
  CHECK_THAT(rank.output, Catch::Contains("train.lora.rank"));
  const auto key = run_gputrain(
      fmt::format("check {} --set '+train.lora={{targets: [\"layers.0.weight\"], rnak: 4}}'", dir / "t.yaml"));
  CHECK(key.exit_code == 2);
  CHECK_THAT(key.output, Catch::Contains("rnak"));
}

TEST_CASE("a LoRA run over 2 ranks under dist.zero 0 to 3: the base weights stay, the stages agree",
          "[e2e][dist][lora]") {
  TempDir dir;
  std::string config = kTinyConfig;
  config.replace(config.find("{type: sgd, lr: 0.1}"), 20, "{type: adamw, lr: 0.01}");
  write_text(dir / "t.yaml", config);
  std::vector<std::map<std::string, std::string>> out;
  for (int z = 0; z <= 3; ++z) {
    const auto r = run_gputrain(fmt::format(
        "train {} --device '[cpu, cpu]' --threads 2 --quiet --out {} --set dist.zero={} --set dist.bucket_mb=0.001 "
        "--set '+train.lora={{targets: [layers.0.weight], rank: 2, also_train: [\"layers.2.*\"]}}'",
        dir / "t.yaml", dir / fmt::format("z{}", z), z));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    out.push_back(lora_weights(dir / fmt::format("z{}/model.safetensors", z)));
  }
  REQUIRE(run_gputrain(fmt::format("train {} --quiet --threads 2 --out {} --set optimizer.lr=1e-30", dir / "t.yaml",
                                   dir / "fresh"))
              .exit_code == 0);
  const auto fresh = lora_weights(dir / "fresh/model.safetensors");
  for (const auto& w : out) {
    CHECK(w.at("layers.0.weight") == fresh.at("layers.0.weight"));  // frozen under the adapter
    CHECK(w.at("layers.0.bias") == fresh.at("layers.0.bias"));
    CHECK(w.at("layers.2.weight") != fresh.at("layers.2.weight"));  // also_train
    CHECK(w.at("layers.0.lora_B") != std::string(w.at("layers.0.lora_B").size(), '\0'));
  }
  CHECK(out[1] == out[0]);  // stage 1 updates as zero 0 does
  // Stage 2 sums the gradient norm in another order (see the dist.zero tests): close, not the same bits. Stage 3
  // shards the frozen base too, and its buckets of 0.001 MB hold one layer's parameters that learn each, as stage
  // 2's do: the same bits as stage 2.
  CHECK(out[3] == out[2]);
  for (const auto& [name, bytes] : out[0]) {
    INFO(name);
    const auto* a = reinterpret_cast<const float*>(bytes.data());
    const auto* b = reinterpret_cast<const float*>(out[2].at(name).data());
    for (size_t i = 0; i < bytes.size() / 4; ++i)
      CHECK(std::abs(a[i] - b[i]) <= 1e-5f * std::max(1.0f, std::abs(a[i])));
  }
}

TEST_CASE("an adapter reads its layer's input kept in 16 bits, to the gradients of the widened input's bits",
          "[lora]") {
  // bf16 storage keeps the adapted layers' inputs in 16 bits (deep enough that the copies pay, Model::half_plan); the
  // dense product and the adapter's dA both read that copy, with the numbers of the input widened first.
  const char* layers = R"(layers:
  - {type: linear, out_features: 128}
  - {type: gelu, approximate: tanh}
  - {type: linear, out_features: 128, lora: {rank: 4}}
  - {type: linear, out_features: 128, lora: {rank: 4}}
  - {type: linear, out_features: 128}
  - {type: linear, out_features: 128}
  - {type: linear, out_features: 8}
)";
  Rng rng(71, 0);
  Tensor x = Tensor::empty(Shape{16, 32}, DType::f32), dy = Tensor::empty(Shape{16, 8}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
  for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
  const auto grads = [&](bool widen_everything) {
    Model m = Model::build(parse_model_spec(ConfigNode::load_string(layers, "m.yaml")), Shape{32}, DType::f32,
                           Device::cpu(), 5);
    for (Param* p : m.params()) {  // B away from 0, so that dA is not zero
      if (p->value.numel() == 128 * 4)
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] = 0.01f * static_cast<float>(i % 7);
    }
    m.set_fusion(false);
    m.set_activation_storage(HalfFormat::bf16);
    REQUIRE(m.activation_storage() == HalfFormat::bf16);
    m.set_widen_everything(widen_everything);
    m.allocate(16);
    const ProductPrecisionScope scope(Precision::bf16);
    LayerContext ctx;
    ctx.training = true;
    m.forward(x, ctx);
    m.backward(dy, ctx);
    std::vector<std::string> out;
    for (auto& [name, p] : m.named_params()) out.push_back(name + ":" + lora_bytes(p->grad));
    return out;
  };
  CHECK(grads(false) == grads(true));
}
