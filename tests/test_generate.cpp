// `gputrain generate`: the key/value-cache decoding path against full forward passes, the sampler, and the command.
#include "config/config.h"
#include "graph/model.h"
#include "helpers.h"
#include "io/safetensors.h"
#include "train/generate.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <map>

using namespace gt;
using gt::test::run_gputrain;
using gt::test::run_shell;
using gt::test::TempDir;

namespace {

// The canonical GPT layout, tiny: vocabulary v, 8 channels, 2 heads, 2 blocks, sequences of t.
std::string tiny_gpt(int64_t v, int64_t t) { return gt::test::gpt_layers(v, 8, t, 2, 2, 32); }

// A random GPT: every parameter drawn from U(−0.5, 0.5), the token table from N(0, 1) (so the tied head gives
// logits of a few units), so that biases and layer norm scales take part too.
Model random_gpt(int64_t v, int64_t t, DType dtype, uint64_t seed) {
  const ConfigNode cfg = ConfigNode::load_string(tiny_gpt(v, t), "gpt.yaml");
  Model m = Model::build(parse_model_spec(cfg), Shape{t}, dtype, Device::cpu(), seed);
  Rng rng(seed, 99);
  for (auto& [name, p] : m.named_params()) {
    Tensor host = Tensor::empty(p->value.shape(), DType::f64);
    for (int64_t i = 0; i < host.numel(); ++i)
      host.data<double>()[i] = name == "wte.weight" ? rng.normal() : rng.uniform(-0.5, 0.5);
    if (dtype == DType::f64) {
      p->value.copy_from(host);
    } else {
      for (int64_t i = 0; i < host.numel(); ++i) p->value.data<float>()[i] = static_cast<float>(host.data<double>()[i]);
    }
  }
  m.allocate(1);
  return m;
}

Tensor tokens_tensor(const std::vector<int64_t>& ids, int64_t len, DType dtype) {
  Tensor x = Tensor::zeros(Shape{1, len}, dtype);
  for (size_t k = 0; k < ids.size(); ++k) {
    if (dtype == DType::f64)
      x.data<double>()[k] = static_cast<double>(ids[k]);
    else
      x.data<float>()[k] = static_cast<float>(ids[k]);
  }
  return x;
}

double at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::f64 ? t.data<double>()[i] : static_cast<double>(t.data<float>()[i]);
}

// Row `row` of a full forward over `ids` (zero-padded to T): causal, so it depends on ids[0..row] only.
std::vector<double> full_logits_row(Model& m, const std::vector<int64_t>& ids, int64_t row) {
  const int64_t t = m.input_shape()[0], v = m.output_shape()[1];
  const Tensor& y = m.forward(tokens_tensor(ids, t, m.dtype()), {false, false});
  std::vector<double> out(static_cast<size_t>(v));
  for (int64_t k = 0; k < v; ++k) out[static_cast<size_t>(k)] = at(y, row * v + k);
  return out;
}

int64_t argmax(const std::vector<double>& v) {
  return static_cast<int64_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// A config for the command: synthetic data only to give the model its input [t]; the weights come from a file.
std::string write_config(const TempDir& dir, const std::string& layers, int64_t t, int64_t classes) {
  const std::string path = dir / "gpt.yaml";
  std::string indented;
  for (const auto& line : gt::test::lines_of(layers)) indented += "  " + line + "\n";
  gt::test::write_text(path, fmt::format(R"(name: tiny_gpt
seed: 1
data:
  format: synthetic
  samples: 4
  input_shape: [{}]
  targets: {{classes: {}}}
  batch_size: 2
model:
{}loss: cross_entropy
optimizer: {{type: sgd, lr: 0.1}}
)",
                                         t, classes, indented));
  return path;
}

// stdout of `gputrain generate ARGS` alone (the rate line on stderr dropped), byte for byte.
gt::test::CommandResult generate_stdout(const std::string& args) {
  return run_shell(gt::test::gputrain_binary() + " generate " + args + " 2>/dev/null");
}

void save_weights(Model& m, const std::string& path) {
  std::vector<std::pair<std::string, const Tensor*>> list;
  for (auto& [name, t] : m.state_tensors()) list.emplace_back(name, t);
  write_safetensors(path, list);
}

}  // namespace

TEST_CASE("decoding with the key/value cache gives the logits of a full forward pass", "[cpu][generate]") {
  const int64_t v = 11, t = 16;
  for (const DType dtype : {DType::f32, DType::f64}) {
    // f32: the cached path multiplies fewer rows at a time, so the GEMMs may round differently (a few ulp of logits
    // of a few units); f64 leaves only rounding at 1e-16.
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
    Model m = random_gpt(v, t, dtype, 3);
    REQUIRE(m.decode_unsupported().empty());
    Rng rng(5, 5);
    std::vector<int64_t> ids;
    for (int64_t k = 0; k < t; ++k) ids.push_back(static_cast<int64_t>(rng.below(v)));
    const Tensor full = m.forward(tokens_tensor(ids, t, dtype), {false, false}).clone();  // [1, T, V]
    auto check_rows = [&](const Tensor& y, int64_t first, int64_t n) {
      REQUIRE(y.shape() == Shape{1, n, v});
      for (int64_t r = 0; r < n; ++r)
        for (int64_t k = 0; k < v; ++k) {
          INFO("position " << first + r << " logit " << k);
          CHECK(std::abs(at(y, r * v + k) - at(full, (first + r) * v + k)) <= tol);
        }
    };
    // A prefill of 5 tokens, then one token per call: 11 steps.
    check_rows(m.forward_decode(tokens_tensor({ids.begin(), ids.begin() + 5}, 5, dtype), 0), 0, 5);
    for (int64_t p = 5; p < t; ++p) check_rows(m.forward_decode(tokens_tensor({ids[p]}, 1, dtype), p), p, 1);
    // The cache starts over at position 0; runs of several new tokens at later positions too.
    for (int64_t p = 0; p < t; p += 3) {
      const int64_t n = std::min<int64_t>(3, t - p);
      check_rows(m.forward_decode(tokens_tensor({ids.begin() + p, ids.begin() + p + n}, n, dtype), p), p, n);
    }
    // Decoding leaves the ordinary forward pass as it was (the cache is the attention layers' own).
    const Tensor again = m.forward(tokens_tensor(ids, t, dtype), {false, false});
    for (int64_t i = 0; i < full.numel(); ++i) REQUIRE(at(again, i) == at(full, i));
    // A position past what is cached is refused, not read from stale rows.
    m.forward_decode(tokens_tensor({ids[0]}, 1, dtype), 0);
    CHECK_THROWS_WITH(m.forward_decode(tokens_tensor({ids[2]}, 1, dtype), 2), Catch::Contains("cached"));
    CHECK_THROWS(m.forward_decode(tokens_tensor({ids[0], ids[1]}, 2, dtype), t - 1));  // past T
  }
}

TEST_CASE("models that mix positions other than through attention cannot be decoded", "[cpu][generate]") {
  const ConfigNode flat = ConfigNode::load_string(R"(layers:
  - {type: embedding, num_embeddings: 5, embedding_dim: 3}
  - flatten
  - {type: linear, out_features: 5}
)",
                                                  "flat.yaml");
  const Model a = Model::build(parse_model_spec(flat), Shape{4}, DType::f32, Device::cpu(), 1);
  CHECK_THAT(a.decode_unsupported(), Catch::Contains("flatten"));
  CHECK_THAT(token_model_problem(a), Catch::Contains("not logits [T, V]"));
  const ConfigNode dense = ConfigNode::load_string("layers:\n  - {type: linear, out_features: 4}\n", "dense.yaml");
  const Model b = Model::build(parse_model_spec(dense), Shape{4}, DType::f32, Device::cpu(), 1);
  CHECK_THAT(b.decode_unsupported(), Catch::Contains("does not compute position by position"));
  const ConfigNode untied = ConfigNode::load_string(R"(layers:
  - {type: embedding, num_embeddings: 5, embedding_dim: 3}
  - {type: linear, out_features: 7}
)",
                                                    "untied.yaml");
  const Model c = Model::build(parse_model_spec(untied), Shape{4}, DType::f32, Device::cpu(), 1);
  CHECK(c.decode_unsupported().empty());
  CHECK_THAT(token_model_problem(c), Catch::Contains("could not be fed back"));
}

TEST_CASE("greedy generation is the argmax of full recomputation, also after the window slides", "[cpu][generate]") {
  const int64_t v = 13, t = 8;
  Model m = random_gpt(v, t, DType::f64, 7);
  Generator gen(m, SamplingConfig{0.0, 0, 1});
  const std::vector<int64_t> prompt{3, 1, 4};
  gen.start(prompt);
  // The reference: the documented window (the newest T to T/2 tokens at positions 0 …), recomputed in full.
  std::vector<int64_t> context = prompt;
  for (int step = 0; step < 30; ++step) {
    const std::vector<double> ref = full_logits_row(m, context, static_cast<int64_t>(context.size()) - 1);
    const int64_t token = gen.next();
    REQUIRE(gen.context() == context);
    for (size_t k = 0; k < ref.size(); ++k) CHECK(gen.logits()[k] == Approx(ref[k]).margin(1e-12));
    REQUIRE(token == argmax(ref));
    if (static_cast<int64_t>(context.size()) == t) context.erase(context.begin(), context.begin() + t / 2 + 1);
    context.push_back(token);
  }
  CHECK(gen.slides() >= 5);  // 30 tokens through a window of 8 that keeps 4
}

TEST_CASE("a prompt longer than the window keeps its last T tokens", "[cpu][generate]") {
  const int64_t v = 7, t = 4;
  Model m = random_gpt(v, t, DType::f64, 2);
  Generator gen(m, SamplingConfig{0.0, 0, 1});
  gen.start({1, 2, 3, 4, 5, 6});
  CHECK(gen.context() == std::vector<int64_t>{3, 4, 5, 6});
  CHECK(gen.next() == argmax(full_logits_row(m, {3, 4, 5, 6}, 3)));
}

TEST_CASE("sampling is seeded: one seed gives one sequence, another seed another", "[cpu][generate]") {
  Model m = random_gpt(11, 16, DType::f32, 4);
  auto draw = [&](uint64_t seed, double temperature, int64_t top_k) {
    Generator gen(m, SamplingConfig{temperature, top_k, seed});
    gen.start({0});
    std::vector<int64_t> out;
    for (int k = 0; k < 40; ++k) out.push_back(gen.next());
    return out;
  };
  CHECK(draw(1, 1.0, 0) == draw(1, 1.0, 0));
  CHECK(draw(1, 1.0, 0) != draw(2, 1.0, 0));
  CHECK(draw(1, 0.7, 3) == draw(1, 0.7, 3));
}

TEST_CASE("the sampler: argmax, top-k, temperature and the draw's frequencies", "[cpu][generate]") {
  Rng rng(1, 1);
  const double nan = std::nan("");
  CHECK(sample_token({0.5, 2.0, 2.0, -1.0}, {0.0, 0, 0}, rng) == 1);  // ties go to the lower index
  CHECK(sample_token({nan, 1.0, 3.0}, {0.0, 0, 0}, rng) == 2);
  CHECK_THROWS_WITH(sample_token({nan, nan}, {1.0, 0, 0}, rng), Catch::Contains("not finite"));
  for (int k = 0; k < 200; ++k) {
    CHECK(sample_token({0.1, 0.2, 5.0, 0.3}, {1.0, 1, 0}, rng) == 2);  // top-1 is the argmax
    const int64_t two = sample_token({4.0, 0.2, 5.0, 0.3}, {10.0, 2, 0}, rng);
    CHECK((two == 0 || two == 2));
    CHECK(sample_token({nan, 1.0}, {1.0, 0, 0}, rng) == 1);
  }
  // P(1) = 3/4 for logits (0, ln 3); at temperature 2 it is √3/(1+√3) ≈ 0.634. 20000 draws: σ ≈ 0.003.
  for (const auto& [temperature, expected] : std::map<double, double>{{1.0, 0.75}, {2.0, 0.6339746}}) {
    int ones = 0;
    const int n = 20000;
    for (int k = 0; k < n; ++k) ones += sample_token({0.0, std::log(3.0)}, {temperature, 0, 0}, rng) == 1;
    CHECK(static_cast<double>(ones) / n == Approx(expected).margin(0.015));
  }
}

TEST_CASE("the sampler's top-p keeps the most likely tokens until their share reaches p", "[cpu][generate]") {
  Rng rng(2, 1);
  // Probabilities 0.5, 0.3, 0.15, 0.05 (listed out of order): p = 0.45 keeps the first alone, p = 0.7 the first two,
  // and among those two the draw goes 5 : 3.
  const std::vector<double> logits = {std::log(0.15), std::log(0.5), std::log(0.05), std::log(0.3)};
  int first = 0;
  const int n = 8000;
  for (int k = 0; k < n; ++k) {
    CHECK(sample_token(logits, {1.0, 0, 0, 0.45}, rng) == 1);
    const int64_t t = sample_token(logits, {1.0, 0, 0, 0.7}, rng);
    CHECK((t == 1 || t == 3));
    first += t == 1;
  }
  CHECK(static_cast<double>(first) / n == Approx(0.625).margin(0.02));
  // p = 1 leaves every token in: the least likely is drawn too.
  bool least = false;
  for (int k = 0; k < 2000 && !least; ++k) least = sample_token(logits, {1.0, 0, 0, 1.0}, rng) == 2;
  CHECK(least);
}

TEST_CASE("gputrain generate prints bytes for a byte model, seeded, and greedy as the model says", "[e2e][generate]") {
  TempDir dir;
  const int64_t t = 16;
  const std::string cfg = write_config(dir, tiny_gpt(256, t), t, 256);
  Model m = random_gpt(256, t, DType::f32, 9);
  save_weights(m, dir / "w.safetensors");
  const std::string base = cfg + " --checkpoint " + dir / "w.safetensors" + " --threads 1";
  // The prompt's bytes (é is two) come back first, then exactly --tokens bytes; the rate line goes to stderr.
  const auto a = generate_stdout(base + " --prompt 'hé' --tokens 40 --seed 3");
  REQUIRE(a.exit_code == 0);
  REQUIRE(a.output.size() == 3 + 40);
  CHECK(a.output.substr(0, 3) == "h\xc3\xa9");
  CHECK(generate_stdout(base + " --prompt 'hé' --tokens 40 --seed 3").output == a.output);
  CHECK(generate_stdout(base + " --prompt 'hé' --tokens 40 --seed 4").output != a.output);
  // Past the window of 16 it goes on; greedy equals the in-process generator on the same weights.
  const auto g = generate_stdout(base + " --prompt 'hé' --tokens 40 --temperature 0");
  REQUIRE(g.exit_code == 0);
  Generator gen(m, SamplingConfig{0.0, 0, 0});
  gen.start({'h', 0xc3, 0xa9});
  std::string expected = "h\xc3\xa9";
  for (int k = 0; k < 40; ++k) expected += static_cast<char>(static_cast<unsigned char>(gen.next()));
  CHECK(g.output == expected);
  // Without --prompt a byte model starts from a newline; --tokens 0 prints the prompt alone.
  CHECK(generate_stdout(base + " --tokens 0").output == "\n");
  const auto rate = run_shell(gt::test::gputrain_binary() + " generate " + base + " --tokens 5 2>&1 >/dev/null");
  CHECK_THAT(rate.output, Catch::Contains("generated 5 tokens") && Catch::Contains("window 16"));
}

TEST_CASE("gputrain generate prints token ids for other vocabularies", "[e2e][generate]") {
  TempDir dir;
  const int64_t t = 8, v = 11;
  const std::string cfg = write_config(dir, tiny_gpt(v, t), t, v);
  Model m = random_gpt(v, t, DType::f32, 5);
  save_weights(m, dir / "w.safetensors");
  const std::string base = cfg + " --checkpoint " + dir / "w.safetensors" + " --threads 1";
  const auto r = generate_stdout(base + " --prompt '3, 5 7' --tokens 20 --temperature 0.8 --top-k 4");
  REQUIRE(r.exit_code == 0);
  REQUIRE(gt::test::lines_of(r.output).size() == 1);
  std::vector<int64_t> ids;
  for (size_t i = 0, j; i < r.output.size(); i = j + 1) {
    j = r.output.find_first_of(" \n", i);
    ids.push_back(std::stoll(r.output.substr(i, j - i)));
  }
  REQUIRE(ids.size() == 3 + 20);
  CHECK(ids[0] == 3);
  CHECK(ids[1] == 5);
  CHECK(ids[2] == 7);
  for (int64_t id : ids) CHECK((id >= 0 && id < v));
  CHECK(generate_stdout(base + " --tokens 0").output == "0\n");  // no GPT-2 vocabulary: token 0
  const auto bad = run_gputrain("generate " + base + " --prompt '3, x'");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("--prompt") && Catch::Contains("\"x\" is not a token id in [0, 11)"));
  CHECK(run_gputrain("generate " + base + " --prompt 11").exit_code == 2);
  CHECK(run_gputrain("generate " + base + " --prompt ' , '").exit_code == 2);
}

TEST_CASE("gputrain generate refuses bad options, weights and models with one line", "[e2e][generate]") {
  TempDir dir;
  const int64_t t = 8;
  const std::string cfg = write_config(dir, tiny_gpt(256, t), t, 256);
  Model m = random_gpt(256, t, DType::f32, 5);
  save_weights(m, dir / "w.safetensors");
  const std::string base = cfg + " --checkpoint " + dir / "w.safetensors";
  for (const std::string flags : {"--tokens -1", "--tokens 1e12", "--tokens x", "--top-k -2", "--temperature -1",
                                  "--temperature nan", "--temperature inf"}) {
    const auto r = run_gputrain("generate " + base + " " + flags);
    INFO(flags << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK(gt::test::lines_of(r.output).size() <= 2);  // the error, and the hint to run --help
  }
  auto one_line = [](const gt::test::CommandResult& r, int code, const std::string& says) {
    INFO(r.output);
    CHECK(r.exit_code == code);
    CHECK(gt::test::lines_of(r.output).size() == 1);
    CHECK_THAT(r.output, Catch::Contains(says));
  };
  one_line(run_gputrain("generate " + cfg + " --checkpoint " + dir / "missing.safetensors"), 1, "missing.safetensors");
  gt::test::write_text(dir / "junk.safetensors", "not a safetensors file at all");
  one_line(run_gputrain("generate " + cfg + " --checkpoint " + dir / "junk.safetensors"), 1, "junk.safetensors");
  // Weights of another model (a vocabulary of 11) do not fit: listed differences, exit 1.
  Model small = random_gpt(11, t, DType::f32, 5);
  save_weights(small, dir / "small.safetensors");
  const auto other = run_gputrain("generate " + cfg + " --checkpoint " + dir / "small.safetensors");
  CHECK(other.exit_code == 1);
  CHECK_THAT(other.output, Catch::Contains("wte.weight"));
  // Not a token model: a classifier over vectors; a sequence model that flattens.
  const std::string mlp =
      write_config(dir, "layers:\n  - {type: linear, out_features: 3}\n", 4, 3);  // overwrites gpt.yaml
  one_line(run_gputrain("generate " + mlp + " --checkpoint " + dir / "w.safetensors"), 2,
           "generate needs a token model");
  const std::string flat = write_config(dir, R"(layers:
  - {type: embedding, num_embeddings: 256, embedding_dim: 4}
  - flatten
  - {type: linear, out_features: 256}
)",
                                        t, 256);
  one_line(run_gputrain("generate " + flat + " --checkpoint " + dir / "w.safetensors"), 2, "not logits [T, V]");
}
