// Token data: llm.c shards (reader, writer, malformed files), the windows and their order, `gputrain tokenize`,
// sequence cross-entropy with ignore_index, and tiny GPT runs on tokenized text (training, resume, data parallel).
#include "core/error.h"
#include "data/dataset.h"
#include "data/tokens.h"
#include "helpers.h"
#include "io/safetensors.h"
#include "ops/loss.h"
#include "train/checkpoint.h"
#include "train/loss.h"

#include <fmt/format.h>
#include <signal.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

using namespace gt;
using namespace gt::test;
namespace fs = std::filesystem;

namespace {

// A shard as llm.c's Python (data_common.write_datafile) writes it, built here byte by byte: 256 int32s of header
// (magic, version, count, zeros) and the uint16 tokens, optionally with header fields overridden.
std::string llmc_shard(const std::vector<uint16_t>& tokens, int32_t magic = 20240520, int32_t version = 1,
                       int64_t count = -2) {
  std::string out(1024, '\0');
  const int32_t head[3] = {magic, version,
                           static_cast<int32_t>(count == -2 ? static_cast<int64_t>(tokens.size()) : count)};
  std::memcpy(out.data(), head, sizeof head);
  for (uint16_t t : tokens) {
    out.push_back(static_cast<char>(t & 0xff));
    out.push_back(static_cast<char>(t >> 8));
  }
  return out;
}

std::vector<uint16_t> iota_tokens(int n, int start = 0) {
  std::vector<uint16_t> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<uint16_t>(start + i));
  return v;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// log Σ exp(x) − x[y] of one row, in double (the op shifts by the max in float: agreement to ~1e-8 relative).
double row_loss(const float* x, int64_t k, int32_t y) {
  double mx = x[0], s = 0;
  for (int64_t j = 0; j < k; ++j) mx = std::max(mx, static_cast<double>(x[j]));
  for (int64_t j = 0; j < k; ++j) s += std::exp(x[j] - mx);
  return mx + std::log(s) - x[y];
}

Tensor random_tensor(Shape shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

// Text with structure a tiny model learns quickly: repeated words in a seeded order.
std::string generated_text(size_t bytes, uint32_t seed) {
  static const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "dogs ", "run ", "fast!\n"};
  std::mt19937 rng(seed);
  std::string s;
  while (s.size() < bytes) s += words[rng() % 9];
  s.resize(bytes);
  return s;
}

// A tiny GPT over byte tokens (block 16): embedding, positions, one attention block, the lm head.
std::string gpt_config(const std::string& dir, int64_t batch, int64_t epochs, const std::string& extra = "") {
  return fmt::format(R"(name: tiny_gpt
seed: 5
device: cpu
data:
  format: tokens
  train: {{path: "{0}/tok/train_*.bin"}}
  test: {{path: "{0}/tok/val_*.bin"}}
  block_size: 16
  batch_size: {1}
model:
  layers:
    - {{type: embedding, num_embeddings: 256, embedding_dim: 32, name: wte}}
    - {{type: positional_embedding, max_len: 16, name: wpe}}
    - {{type: causal_self_attention, heads: 2, name: attn}}
    - {{type: add, inputs: [wpe, attn]}}
    - layernorm
    - {{type: gelu, approximate: tanh}}
    - {{type: linear, out_features: 256}}
optimizer: {{type: adam, lr: 0.01}}
train: {{epochs: {2}, log_every: 5, eval_tokens: 512}}
{3})",
                     dir, batch, epochs, extra);
}

}  // namespace

TEST_CASE("token shards: llm.c's header and windows of T + 1 tokens with stride T, never across shards",
          "[cpu][data]") {
  TempDir dir;
  write_text(dir / "a.bin", llmc_shard(iota_tokens(10)));      // windows of 4 + 1: [0,5) [4,9): 2
  write_text(dir / "b.bin", llmc_shard(iota_tokens(9, 100)));  // [0,5) [4,9): 2
  write_text(dir / "c.bin", llmc_shard(iota_tokens(4, 200)));  // too short for one window
  const TokenWindows w({dir / "a.bin", dir / "b.bin", dir / "c.bin"}, 4, 0);
  CHECK(w.windows() == 4);
  CHECK(w.tokens() == 23);
  CHECK(w.vocab_size() == 256);  // every token is below 256
  float x[4];
  int32_t y[4];
  const int expect_start[] = {0, 4, 100, 104};
  for (int i = 0; i < 4; ++i) {
    w.window(i, x, y);
    for (int t = 0; t < 4; ++t) {
      CHECK(x[t] == static_cast<float>(expect_start[i] + t));
      CHECK(y[t] == expect_start[i] + t + 1);
    }
  }
  CHECK(glob_files(dir / "*.bin") == std::vector<std::string>{dir / "a.bin", dir / "b.bin", dir / "c.bin"});
  CHECK(glob_files(dir / "none_*.bin").empty());
}

TEST_CASE("a GPT-2 shard written by llm.c's Python is read, and its vocabulary defaults to GPT-2's", "[cpu][data]") {
  TempDir dir;
  write_text(dir / "gpt2.bin", llmc_shard({50256, 15496, 11, 995, 0, 50256, 40, 716, 257}));
  const TokenWindows w({dir / "gpt2.bin"}, 2, 0);
  CHECK(w.vocab_size() == 50257);
  CHECK(w.windows() == 4);
  float x[2];
  int32_t y[2];
  w.window(0, x, y);
  CHECK(x[0] == 50256.0f);
  CHECK(y[0] == 15496);
  CHECK(y[1] == 11);
  CHECK(TokenWindows({dir / "gpt2.bin"}, 2, 50304).vocab_size() == 50304);
  CHECK_THROWS_WITH(TokenWindows({dir / "gpt2.bin"}, 2, 1000),
                    Catch::Contains("gpt2.bin: token 50256 at position 0 is not below the vocabulary size 1000"));
  write_text(dir / "big.bin", llmc_shard({1, 2, 60000}));
  CHECK_THROWS_WITH(TokenWindows({dir / "big.bin"}, 1, 0),
                    Catch::Contains("big.bin: token 60000 at position 2") && Catch::Contains("set data.vocab_size"));
  CHECK(TokenWindows({dir / "big.bin"}, 1, 65536).vocab_size() == 65536);
}

TEST_CASE("malformed token shards are refused naming the file and what was expected", "[cpu][data]") {
  TempDir dir;
  struct Bad {
    const char* name;
    std::string bytes;
    const char* message;
  };
  const std::vector<Bad> cases{
      {"empty", "", "0 bytes: not an llm.c token shard (expected a header of 1024 bytes"},
      {"magic", llmc_shard({1, 2}, 20240326), "magic 20240326, expected 20240520"},
      {"version", llmc_shard({1, 2}, 20240520, 7), "version 7, expected 1"},
      {"truncated", llmc_shard({1, 2, 3}).substr(0, 1029), "the file has 1029 bytes, expected 1030"},
      {"mismatch", llmc_shard({1, 2, 3}, 20240520, 1, 2), "the file has 1030 bytes, expected 1028"},
      {"negative", llmc_shard({}, 20240520, 1, -5), "the header's token count is -5"},
      {"huge", llmc_shard({1}, 20240520, 1, 2147483647), "expected 4294968318"},
  };
  for (const Bad& b : cases) {
    DYNAMIC_SECTION(b.name) {
      const std::string path = dir / (std::string(b.name) + ".bin");
      write_text(path, b.bytes);
      CHECK_THROWS_WITH(TokenWindows({path}, 1, 0), Catch::StartsWith(path + ": ") && Catch::Contains(b.message));
      CHECK_THROWS_AS(TokenWindows({path}, 1, 0), DataError);
    }
  }
  write_text(dir / "short.bin", llmc_shard({1, 2, 3}));
  CHECK_THROWS_WITH(TokenWindows({dir / "short.bin"}, 3, 0), Catch::Contains("not one window of block_size + 1 = 4"));
  CHECK_THROWS_WITH(TokenWindows({dir / "missing.bin"}, 3, 0), Catch::Contains("missing.bin: cannot open"));
}

TEST_CASE("the loader cuts token windows on demand: unshuffled in shard order, limited, shuffled by seed, sharded",
          "[cpu][data]") {
  TempDir dir;
  write_text(dir / "a.bin", llmc_shard(iota_tokens(41)));  // 10 windows of 4 + 1
  Dataset ds;
  ds.tokens = std::make_shared<const TokenWindows>(std::vector<std::string>{dir / "a.bin"}, 4, 0);
  ds.num_classes = 256;
  REQUIRE(ds.size() == 10);
  CHECK(ds.input_shape() == Shape{4});
  CHECK(ds.target_dtype() == DType::i32);
  CHECK(ds.byte_tokens());
  Tensor x = Tensor::empty(Shape{3, 4}, DType::f32), y = Tensor::empty(Shape{3, 4}, DType::i32);
  Loader eval(ds, 3, false, 1);
  eval.limit(5);  // as train.eval_tokens = 17 with T = 4 asks: 5 windows
  eval.start_epoch(0);
  CHECK(eval.next(x, y) == 3);
  CHECK(x.data<float>()[4] == 4.0f);  // window 1 starts at token 4
  CHECK(eval.next(x, y) == 2);
  CHECK(y.data<int32_t>()[4 + 3] == 4 * 4 + 4);  // window 4's last target
  CHECK(eval.next(x, y) == 0);

  // Shuffled: every window once per epoch, in an order fixed by the seed; two ranks take disjoint halves.
  auto firsts = [&](Loader& l) {
    std::vector<int> out;
    while (const int64_t n = l.next(x, y))
      for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<int>(x.data<float>()[i * 4]) / 4);
    return out;
  };
  Loader a(ds, 3, true, 7), b(ds, 3, true, 7);
  a.start_epoch(2);
  b.start_epoch(2);
  const std::vector<int> order = firsts(a);
  CHECK(order == firsts(b));
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(order != std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  Loader r0(ds, 2, true, 7), r1(ds, 2, true, 7);
  r0.shard(0, 2);
  r1.shard(1, 2);
  r0.start_epoch(2);
  r1.start_epoch(2);
  const std::vector<int> o0 = firsts(r0), o1 = firsts(r1);
  CHECK(o0.size() == 4);
  CHECK(o1.size() == 4);
  for (int v : o0) CHECK(std::find(o1.begin(), o1.end(), v) == o1.end());
  CHECK(std::vector<int>{o0[0], o0[1], o1[0], o1[1]} == std::vector<int>(order.begin(), order.begin() + 4));
  // A resume at position 6 of the epoch goes on where the uninterrupted order is.
  Loader resumed(ds, 3, true, 7);
  resumed.start_epoch(2, 6);
  CHECK(firsts(resumed) == std::vector<int>(order.begin() + 6, order.end()));
}

TEST_CASE("gputrain tokenize writes byte shards that read back as the input, split train then val", "[cpu][data]") {
  TempDir dir;
  const std::string text1 = generated_text(700, 1), text2 = std::string("\xff\x00\x01", 3) + " binary bytes too";
  write_text(dir / "one.txt", text1);
  write_text(dir / "two.txt", text2);
  const std::string all = text1 + text2;
  const TokenizeResult r = tokenize_bytes({dir / "one.txt", dir / "two.txt"}, dir / "out", 0.25, 300);
  const auto val = static_cast<int64_t>(std::llround(all.size() * 0.25));
  CHECK(r.val_tokens == val);
  CHECK(r.train_tokens == static_cast<int64_t>(all.size()) - val);
  // 540 train tokens in shards of at most 300, then 180 val tokens.
  CHECK(all.size() == 720);
  CHECK(r.files == std::vector<std::string>{dir / "out/train_000000.bin", dir / "out/train_000001.bin",
                                            dir / "out/val_000000.bin"});
  std::string back;
  for (const std::string& f : r.files) {
    const TokenShard s(f);
    CHECK(s.size() <= 300);
    for (int64_t i = 0; i < s.size(); ++i) back.push_back(static_cast<char>(s.at(i)));
  }
  CHECK(back == all);
  CHECK(TokenShard(dir / "out/val_000000.bin").size() == val);
  // The shards are llm.c's format exactly: the header as llm.c's Python writes it, then the tokens.
  std::vector<uint16_t> first;
  for (size_t i = 0; i < 300; ++i) first.push_back(static_cast<uint8_t>(all[i]));
  CHECK(read_bytes(dir / "out/train_000000.bin") == llmc_shard(first));
  const std::string tok = read_text(dir / "out/gputrain_tokenizer.json");
  CHECK(json_string(tok, "type") == "bytes");
  CHECK(json_number(tok, "vocab_size") == 256);
  for (const auto& e : fs::directory_iterator(dir / "out")) CHECK(e.path().extension() != ".tmp");

  // Through the binary: refusals exit 1 with one line naming the file.
  write_text(dir / "empty.txt", "");
  auto res = run_gputrain("tokenize " + (dir / "empty.txt") + " --out " + (dir / "e") + " 2>&1");
  CHECK(res.exit_code == 1);
  CHECK_THAT(res.output, Catch::Contains("empty.txt: the input is empty"));
  CHECK(lines_of(res.output).size() == 1);
  res = run_gputrain("tokenize " + (dir / "nope.txt") + " --out " + (dir / "e") + " 2>&1");
  CHECK(res.exit_code == 1);
  CHECK_THAT(res.output, Catch::Contains("nope.txt: no such file"));
  res = run_gputrain("tokenize " + (dir / "one.txt") + " --out " + (dir / "e") + " --shard-tokens 2147483648 2>&1");
  CHECK(res.exit_code == 2);  // a flag out of range is a usage error
  CHECK_THAT(res.output, Catch::Contains("--shard-tokens 2147483648: expected a number in [1, 2147483647]"));
  CHECK(!fs::exists(dir / "e"));
  res = run_gputrain("tokenize " + (dir / "one.txt") + " --out " + (dir / "ok") + " 2>&1");
  CHECK(res.exit_code == 0);
  CHECK_THAT(res.output, Catch::Contains("630 training and 70 validation tokens (bytes) in 2 shard(s)"));
}

TEST_CASE("sequence cross-entropy: the mean over every token, and ignore_index skips targets as PyTorch does",
          "[cpu]") {
  const int64_t b = 3, t = 5, v = 7;
  const Tensor out = random_tensor(Shape{b, t, v}, 3);
  Tensor y = Tensor::empty(Shape{b, t}, DType::i32);
  for (int64_t i = 0; i < b * t; ++i) y.data<int32_t>()[i] = static_cast<int32_t>((i * 5 + 2) % v);
  // The direct computation: each token's loss, the mean over the tokens, the argmax hits.
  double sum = 0, hits = 0;
  for (int64_t i = 0; i < b * t; ++i) {
    const float* row = out.data<float>() + i * v;
    sum += row_loss(row, v, y.data<int32_t>()[i]);
    hits += std::max_element(row, row + v) - row == y.data<int32_t>()[i];
  }
  LossConfig loss;
  Tensor stats = Tensor::zeros(Shape{2}, DType::f64), dout = Tensor::empty(Shape{b, t, v}, DType::f32);
  compute_loss(loss, out, y, 1.0 / b, dout, stats);
  // Per-sample units: Σ / B is the per-token mean (what the logs and test_loss report).
  CHECK(stats.data<double>()[0] / b == Approx(sum / (b * t)).epsilon(1e-7));
  CHECK(stats.data<double>()[1] / b == Approx(hits / (b * t)).epsilon(1e-7));
  // Gradient: (softmax − onehot) / (B·T) for every token.
  for (int64_t i = 0; i < b * t; ++i) {
    const float* row = out.data<float>() + i * v;
    double mx = row[0], z = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    for (int64_t j = 0; j < v; ++j) z += std::exp(row[j] - mx);
    for (int64_t j = 0; j < v; ++j) {
      const double want = (std::exp(row[j] - mx) / z - (j == y.data<int32_t>()[i])) / (b * t);
      CHECK(dout.data<float>()[i * v + j] == Approx(want).margin(1e-7));
    }
  }

  // ignore_index -1: those tokens count nowhere; the mean is over the counted ones.
  y.data<int32_t>()[0] = -1;
  y.data<int32_t>()[7] = -1;
  y.data<int32_t>()[14] = -1;
  double csum = 0;
  int counted = 0;
  for (int64_t i = 0; i < b * t; ++i)
    if (y.data<int32_t>()[i] != -1) csum += row_loss(out.data<float>() + i * v, v, y.data<int32_t>()[i]), ++counted;
  loss.ignore_index = -1;
  stats.zero_();
  compute_loss(loss, out, y, 1.0 / b, dout, stats);
  CHECK(counted == 12);
  CHECK(stats.data<double>()[0] / b == Approx(csum / counted).epsilon(1e-7));
  for (int64_t j = 0; j < v; ++j) {
    CHECK(dout.data<float>()[0 * v + j] == 0.0f);
    CHECK(dout.data<float>()[7 * v + j] == 0.0f);
  }
  // A counted token's gradient is scaled by 1/counted, PyTorch's reduction='mean' with ignore_index.
  const float* row = out.data<float>() + 1 * v;
  double mx = row[0], z = 0;
  for (int64_t j = 0; j < v; ++j) mx = std::max(mx, static_cast<double>(row[j]));
  for (int64_t j = 0; j < v; ++j) z += std::exp(row[j] - mx);
  const int32_t y1 = y.data<int32_t>()[1];
  CHECK(dout.data<float>()[v + y1] == Approx((std::exp(row[y1] - mx) / z - 1) / counted).margin(1e-7));
  // Every target ignored: nothing counts, no gradient.
  for (int64_t i = 0; i < b * t; ++i) y.data<int32_t>()[i] = -1;
  stats.zero_();
  compute_loss(loss, out, y, 1.0 / b, dout, stats);
  CHECK(stats.data<double>()[0] == 0);
  for (int64_t i = 0; i < b * t * v; ++i) REQUIRE(dout.data<float>()[i] == 0.0f);
}

TEST_CASE("ops::cross_entropy in groups with ignore_index matches a direct computation, plain rows unchanged",
          "[cpu]") {
  const Tensor logits = random_tensor(Shape{6, 4}, 9);
  Tensor labels = Tensor::empty(Shape{6}, DType::i32);
  const int32_t ys[] = {1, 3, 99, 0, 2, 99};  // 99: ignored
  std::copy(ys, ys + 6, labels.data<int32_t>());
  Tensor stats = Tensor::zeros(Shape{2}, DType::f64), d = Tensor::empty(Shape{6, 4}, DType::f32);
  ops::cross_entropy(logits, labels, 0.0, 0.5, d, stats, {.group = 3, .ignore_index = 99});
  double s = 0;
  for (int i : {0, 1, 3, 4}) s += row_loss(logits.data<float>() + i * 4, 4, ys[i]);
  // 2 samples, 4 counted rows: w = 2/4.
  CHECK(stats.data<double>()[0] == Approx(2.0 * s / 4).epsilon(1e-7));
  Tensor plain_stats = Tensor::zeros(Shape{2}, DType::f64), none;
  labels.data<int32_t>()[2] = 2;
  labels.data<int32_t>()[5] = 1;
  ops::cross_entropy(logits, labels, 0.0, 1.0, none, plain_stats);
  double all = 0;
  for (int i = 0; i < 6; ++i) all += row_loss(logits.data<float>() + i * 4, 4, labels.data<int32_t>()[i]);
  CHECK(plain_stats.data<double>()[0] == Approx(all).epsilon(1e-7));
}

TEST_CASE("loss: ignore_index is read and written back, and sequence outputs must be [T, V]", "[cpu][config]") {
  LossConfig c;
  parse_loss(ConfigNode::load_string("{type: cross_entropy, ignore_index: -100}", "l.yaml"), c);
  CHECK(c.ignore_index == -100);
  CHECK(to_yaml(c)["ignore_index"].as<int64_t>() == -100);
  LossConfig d;
  parse_loss(ConfigNode::load_string("cross_entropy", "l.yaml"), d);
  CHECK(d.ignore_index == ops::kNoIgnore);
  CHECK(to_yaml(d)["ignore_index"].IsNull());
  LossConfig e;
  CHECK_THROWS_WITH(parse_loss(ConfigNode::load_string("{type: mse, ignore_index: 0}", "l.yaml"), e),
                    Catch::Contains("ignore_index: applies to cross_entropy only"));
  CHECK_THROWS_WITH(parse_loss(ConfigNode::load_string("{type: cross_entropy, ignore_index: 3000000000}", "l.yaml"), e),
                    Catch::Contains("ignore_index"));

  TempDir dir;
  write_text(dir / "a.bin", llmc_shard(iota_tokens(20)));
  Dataset ds;
  ds.tokens = std::make_shared<const TokenWindows>(std::vector<std::string>{dir / "a.bin"}, 4, 0);
  ds.num_classes = 256;
  const ConfigNode where = ConfigNode::load_string("loss: cross_entropy\n", "c.yaml")["loss"];
  CHECK_NOTHROW(check_loss_fits(c, Shape{4, 256}, ds, where));
  for (const Shape& bad : {Shape{256}, Shape{4, 100}, Shape{3, 256}, Shape{4, 256, 1}})
    CHECK_THROWS_WITH(check_loss_fits(c, bad, ds, where),
                      Catch::Contains("cross_entropy over sequences of 4 targets and 256 classes needs a model output "
                                      "of [4, 256]") &&
                          Catch::Contains("got " + bad.str()));
}

TEST_CASE("a tiny GPT learns tokenized text: the loss falls, eval reports test_bpb, gputrain eval agrees", "[e2e]") {
  TempDir dir;
  write_text(dir / "text.txt", generated_text(12000, 2));
  REQUIRE(
      run_gputrain("tokenize " + (dir / "text.txt") + " --out " + (dir / "tok") + " --shard-tokens 5000").exit_code ==
      0);
  write_text(dir / "c.yaml", gpt_config(dir.path(), 8, 2));
  const auto r = run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 2 --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<double> losses = train_losses(read_text(dir / "run/metrics.jsonl"));
  REQUIRE(losses.size() > 10);
  CHECK(losses.front() > 4.5);  // about ln 256 = 5.5 at the start
  CHECK(losses.back() < 0.6 * losses.front());
  const std::string summary = read_text(dir / "run/summary.json");
  const auto test_loss = json_number(summary, "test_loss");
  REQUIRE(test_loss);
  CHECK(json_number(summary, "test_bpb") == Approx(*test_loss / std::log(2.0)));
  CHECK(*test_loss < 0.7 * std::log(256.0));
  CHECK_THAT(read_text(dir / "run/metrics.jsonl"), Catch::Contains("\"test_bpb\""));
  // gputrain eval: the same eval_tokens limit (512 tokens = 32 windows of 16), the same loss.
  const auto e = run_gputrain("eval " + (dir / "c.yaml") + " --checkpoint " + (dir / "run") + " --json --threads 2");
  INFO(e.output);
  REQUIRE(e.exit_code == 0);
  CHECK(json_number(e.output, "samples") == 32);
  CHECK(json_number(e.output, "tokens") == 512);
  CHECK(json_number(e.output, "test_loss") == Approx(*test_loss).epsilon(1e-6));
  CHECK(json_number(e.output, "test_bpb") == Approx(*test_loss / std::log(2.0)).epsilon(1e-6));

  // Every step line of a token run says tokens/s and the MFU; the CPU has no known peak, so it says that.
  const auto line =
      run_gputrain("train " + (dir / "c.yaml") + " --max-steps 2 --set train.log_every=1 --out " + (dir / "line"));
  CHECK_THAT(line.output, Catch::Contains(" tok/s | MFU: unknown peak | "));
  const std::string row = lines_of(read_text(dir / "run/metrics.jsonl")).front();
  CHECK(json_number(row, "tokens_per_sec").value_or(0) == Approx(16 * json_number(row, "samples_per_sec").value()));
  CHECK_FALSE(json_number(row, "mfu"));
  // With train.peak_tflops the MFU is the model's training FLOPs (3 × forward, from `gputrain check`) per second
  // over the peak.
  const auto peak = run_gputrain("train " + (dir / "c.yaml") + " --max-steps 5 --set train.peak_tflops=0.001 --out " +
                                 (dir / "peak"));
  REQUIRE(peak.exit_code == 0);
  const auto check = run_gputrain("check " + (dir / "c.yaml") + " --json");
  REQUIRE(check.exit_code == 0);
  const std::string totals = check.output.substr(check.output.find("\"totals\""));
  const double forward = json_number(totals, "forward_flops").value_or(0) / 8;  // per batch of 8
  REQUIRE(forward > 0);
  CHECK(json_number(check.output, "train_flops_per_token").value_or(0) == Approx(3 * forward / 16));  // T = 16
  CHECK_THAT(run_gputrain("check " + (dir / "c.yaml")).output, Catch::Contains("MFLOP to train (3 × forward"));
  const std::string prow = lines_of(read_text(dir / "peak/metrics.jsonl")).front();
  CHECK(json_number(prow, "mfu").value_or(0) ==
        Approx(3 * forward * json_number(prow, "samples_per_sec").value() / 1e9).epsilon(1e-9));
  CHECK_THAT(peak.output, Catch::Matches("(.|\\n)* tok/s \\| MFU [0-9.]+% \\|(.|\\n)*"));
}

TEST_CASE("a shard cut short or rewritten in place is an error naming it, never a signal", "[cpu][data]") {
  TempDir dir;
  std::vector<uint16_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 200);
  write_text(dir / "s.bin", llmc_shard(tokens));
  const TokenWindows w({dir / "s.bin"}, 8, 0);
  std::vector<float> x(8);
  std::vector<int32_t> y(8);
  w.window(w.windows() - 1, x.data(), y.data());
  CHECK_NOTHROW(w.check_unchanged());
  fs::resize_file(dir / "s.bin", 1024 + 2 * 1000);  // in place: the open file shrinks under the reader
  CHECK_THROWS_WITH(w.window(w.windows() - 1, x.data(), y.data()),
                    Catch::Contains(dir / "s.bin: the file was cut short while this run read it (9024 bytes when "
                                          "opened, 3024 now)"));
  w.window(0, x.data(), y.data());  // what is still there reads
  CHECK(y[0] == 1);
  CHECK_THROWS_WITH(w.check_unchanged(), Catch::Contains(dir / "s.bin: the file changed size while this run read it"));
}

TEST_CASE("a shard truncated while a run trains on it ends the run with exit 1 naming it, its checkpoint kept",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "text.txt", generated_text(200000, 5));
  REQUIRE(run_gputrain("tokenize " + (dir / "text.txt") + " --out " + (dir / "tok")).exit_code == 0);
  write_text(dir / "c.yaml", gpt_config(dir.path(), 4, 50, "checkpoint: {every_steps: 20, keep: 2}\n"));
  const std::string run = dir / "run";
  const Background b = start_gputrain("train " + (dir / "c.yaml") + " --threads 1 --out " + run, dir / "log");
  REQUIRE(wait_for_file(run + "/checkpoints/latest", 60));
  fs::resize_file(dir / "tok/train_000000.bin", 1024 + 2 * 3000);
  const int code = wait_exit(b);
  const std::string log = read_text(dir / "log");
  INFO(log);
  CHECK(code == 1);
  CHECK_THAT(log, Catch::Contains(dir / "tok/train_000000.bin: the file"));
  CHECK(log.find("Bus error") == std::string::npos);
  // The last periodic checkpoint is whole: a resume on the same data (re-tokenized) would start from it.
  CHECK_NOTHROW(read_checkpoint(run + "/checkpoints/" + lines_of(read_text(run + "/checkpoints/latest")).at(0)));
}

TEST_CASE("a token run stopped by SIGTERM resumes to the uninterrupted run's weights and metrics", "[e2e]") {
  TempDir dir;
  write_text(dir / "text.txt", generated_text(80000, 3));
  REQUIRE(run_gputrain("tokenize " + (dir / "text.txt") + " --out " + (dir / "tok")).exit_code == 0);
  write_text(dir / "c.yaml", gpt_config(dir.path(), 4, 3, "checkpoint: {every_steps: 100, keep: 2}\n"));
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 1 --out " + (dir / "full")).exit_code == 0);
  const std::string run = dir / "run";
  const Background b = start_gputrain("train " + (dir / "c.yaml") + " --threads 1 --out " + run, dir / "log");
  REQUIRE(wait_for_file(run + "/checkpoints/latest", 60));
  kill(b.pid, SIGTERM);
  const int code = wait_exit(b);
  INFO(read_text(dir / "log"));
  REQUIRE(code == 75);
  CHECK(json_number(read_text(run + "/summary.json"), "steps") <
        *json_number(read_text(dir / "full/summary.json"), "steps"));  // it did stop early
  const auto r = run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 1 --resume auto --out " + run);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(read_bytes(run + "/model.safetensors") == read_bytes(dir / "full/model.safetensors"));
  static const std::regex timing(
      R"re(, "(samples_per_sec|tokens_per_sec|mfu|data_wait_ms|train_s|eval_s|checkpoint_s|elapsed_s|host_[a-z_]+|gpu[0-9]+_[a-z_]+)": ("[^"]*"|[^,}]*))re");
  CHECK(std::regex_replace(read_text(run + "/metrics.jsonl"), timing, "") ==
        std::regex_replace(read_text(dir / "full/metrics.jsonl"), timing, ""));
}

TEST_CASE("a token run on device: [cpu, cpu] with batch B trains like one worker with batch 2B", "[e2e][dist]") {
  TempDir dir;
  write_text(dir / "text.txt", generated_text(6000, 4));
  REQUIRE(run_gputrain("tokenize " + (dir / "text.txt") + " --out " + (dir / "tok")).exit_code == 0);
  write_text(dir / "two.yaml", gpt_config(dir.path(), 4, 1));
  write_text(dir / "one.yaml", gpt_config(dir.path(), 8, 1));
  // 30 steps: the same global batches (one worker with 2B would take a partial last batch the two drop). SGD, not
  // Adam: the key bias's gradient is 0 in exact arithmetic (softmax ignores a shift shared by a row's scores), and
  // Adam scales the rounding noise left in it up to steps of size lr, which differ with the summation order.
  const std::string common = " --max-steps 30 --set 'optimizer={type: sgd, lr: 0.5, momentum: 0.9}' --out ";
  const auto two =
      run_gputrain("train " + (dir / "two.yaml") + " --device '[cpu, cpu]' --threads 2" + common + (dir / "two"));
  INFO(two.output);
  REQUIRE(two.exit_code == 0);
  REQUIRE(run_gputrain("train " + (dir / "one.yaml") + " --quiet --threads 1" + common + (dir / "one")).exit_code == 0);
  const std::vector<double> one = train_losses(read_text(dir / "one/metrics.jsonl"));
  CHECK(one.back() < 0.7 * one.front());  // it did learn
  const auto a = read_safetensors(dir / "one/model.safetensors"), b = read_safetensors(dir / "two/model.safetensors");
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    double diff = 0, norm = 0;
    for (int64_t k = 0; k < a[i].second.numel(); ++k) {
      const double x = a[i].second.data<float>()[k], y = b[i].second.data<float>()[k];
      diff += (x - y) * (x - y);
      norm += x * x;
    }
    INFO(a[i].first);
    CHECK(std::sqrt(diff / std::max(norm, 1e-30)) < 1e-5);
  }
  CHECK(json_number(read_text(dir / "two/summary.json"), "world_size") == 2);
  CHECK(json_number(read_text(dir / "one/summary.json"), "test_loss") ==
        Approx(*json_number(read_text(dir / "two/summary.json"), "test_loss")).epsilon(1e-4));
}

TEST_CASE("a run directory is all eval, generate and check need: no training data, any folder", "[e2e]") {
  TempDir dir;
  write_text(dir / "text.txt", generated_text(12000, 6));
  REQUIRE(run_gputrain("tokenize " + (dir / "text.txt") + " --out " + (dir / "tok")).exit_code == 0);
  // Relative data paths, trained from the config's folder.
  std::string cfg = gpt_config(".", 4, 1);
  write_text(dir / "c.yaml", cfg);
  const auto t = run_shell("cd " + dir.path() + " && " + gputrain_binary() + " train c.yaml --quiet --max-steps 6 " +
                           "--out run 2>&1");
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  CHECK_THAT(read_text(dir / "run/config.resolved.yaml"), Catch::Contains("path: " + (dir / "tok/train_*.bin")));
  // From another folder: eval and generate take the run directory alone.
  const auto e = run_shell("cd / && " + gputrain_binary() + " eval " + (dir / "run") + " --json 2>&1");
  INFO(e.output);
  CHECK(e.exit_code == 0);
  CHECK(json_number(e.output, "test_loss").has_value());
  // With the training shards gone, eval runs on the test shards, generate still runs (it reads none) and check sizes
  // the GPT from its config.
  fs::copy(dir / "tok/val_000000.bin", dir / "val.bin");
  for (const auto& f : fs::directory_iterator(dir / "tok")) fs::remove(f.path());
  fs::create_directories(dir / "tok");
  fs::copy(dir / "val.bin", dir / "tok/val_000000.bin");  // the test shard back, the training shards still gone
  const auto ev = run_gputrain("eval " + (dir / "run") + " --json");
  INFO(ev.output);
  CHECK(ev.exit_code == 0);
  CHECK_THAT(ev.output, Catch::Contains("no shard matches " + (dir / "tok/train_*.bin")));
  const auto g = run_gputrain("generate " + (dir / "run") + " --tokens 5 --prompt ab");
  INFO(g.output);
  CHECK(g.exit_code == 0);
  CHECK_THAT(g.output, Catch::Contains("generated 5 tokens"));
  const auto c = run_gputrain("check " + (dir / "c.yaml") + " --set data.train.path=" + (dir / "tok/train_*.bin") +
                              " --set data.test.path=" + (dir / "tok/val_*.bin"));
  INFO(c.output);
  CHECK(c.exit_code == 0);
  CHECK_THAT(c.output,
             Catch::Contains("sized from the config (windows of 16 tokens, vocabulary 256, the model's output"));
  CHECK_THAT(c.output, Catch::Contains("valid, sized from the config"));
  // Training still needs its data, and says which key names it.
  const auto r = run_gputrain("train " + (dir / "run") + " --out " + (dir / "again"));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("data.train.path: no file matches " + (dir / "tok/train_*.bin")));
}
