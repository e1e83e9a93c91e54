// End to end: the gputrain binary on configs, what it leaves in the run directory, and its exit codes.
#include "core/json_read.h"
#include "core/rng.h"
#include "data/tokens.h"
#include "helpers.h"
#include "io/safetensors.h"
#include "ops/cpu/isa.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <sstream>
#include <vector>

using namespace gt::test;
namespace fs = std::filesystem;

namespace {

const std::string kSynthetic =
    "name: synth\nseed: 7\ndevice: cpu\n" +
    synthetic_mlp({.samples = 4000, .test_samples = 1000, .features = 20, .classes = 4, .batch = 64, .hidden = 64}) +
    R"(optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 8, log_every: 20}
)";

std::string losses_of(const std::string& metrics) {
  std::string out;
  const std::regex re("\"loss\": ([^,}]*)");
  for (const auto& l : lines_of(metrics)) {
    std::smatch m;
    if (std::regex_search(l, m, re)) out += m[1].str() + "\n";
  }
  return out;
}

}  // namespace

TEST_CASE("training a synthetic classification problem converges and writes the run directory", "[e2e]") {
  TempDir dir;
  write_text(dir / "synth.yaml", kSynthetic);
  const auto r = run_gputrain("train " + (dir / "synth.yaml") + " --out " + (dir / "run") + " --threads 2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);

  const std::string summary = read_text(dir / "run/summary.json");
  INFO(summary);
  CHECK(json_string(summary, "name") == "synth");
  CHECK(json_string(summary, "device") == "cpu");
  CHECK(json_number(summary, "world_size") == 1);
  CHECK(json_number(summary, "epochs") == 8);
  CHECK(json_number(summary, "steps") == 8 * 63);  // ceil(4000 / 64) per epoch
  CHECK(json_number(summary, "samples_per_sec").value_or(0) > 0);
  CHECK(json_number(summary, "final_train_loss").value_or(99) < 0.3);
  CHECK(json_number(summary, "test_loss").has_value());
  CHECK(json_number(summary, "test_accuracy").value_or(0) >= 0.95);
  CHECK(json_number(summary, "test_accuracy").value_or(2) <= 1.0);
  CHECK(json_number(summary, "wall_seconds").value_or(0) > 0);
  CHECK(json_string(summary, "exit_reason") == "completed");

  const auto metrics = lines_of(read_text(dir / "run/metrics.jsonl"));
  int train_lines = 0, eval_lines = 0;
  for (const auto& l : metrics) {
    if (json_string(l, "type") == "train") {
      ++train_lines;
      for (const char* k : {"step", "epoch", "loss", "lr", "samples_per_sec"}) CHECK(json_number(l, k).has_value());
    } else {
      ++eval_lines;
      for (const char* k : {"step", "epoch", "test_loss", "test_accuracy"}) CHECK(json_number(l, k).has_value());
    }
  }
  CHECK(train_lines == 8 * 63 / 20 + 1);  // every 20th step, and the last one
  CHECK(eval_lines == 8);

  const std::string resolved = read_text(dir / "run/config.resolved.yaml");
  CHECK_THAT(resolved, Catch::Contains("out_features: 64, bias: true") && Catch::Contains("momentum: 0.9") &&
                           Catch::Contains("max_steps: 0"));
  // The resolved config is itself a valid config that trains.
  CHECK(run_gputrain("check " + (dir / "run/config.resolved.yaml")).exit_code == 0);
  CHECK_THAT(read_text(dir / "run/train.log"), Catch::Contains("eval epoch 8/8"));
  // The final weights, readable without gputrain: Python's json module reads the safetensors header.
  const std::string weights = dir / "run/model.safetensors";
  const std::string py =
      "python3 -c \"import json,struct,sys; f=open(sys.argv[1],'rb'); n=struct.unpack('<Q',f.read(8))[0]; "
      "h=json.loads(f.read(n)); assert h['layers.0.weight']['shape']==[64,20]; "
      "assert h['layers.2.bias']['dtype']=='F32'; assert h['__metadata__']['format']=='pt'\" " +
      weights;
  CHECK(std::system(py.c_str()) == 0);
  // The console has one progress line per log_every steps with the fields in a fixed order.
  CHECK(std::regex_search(
      r.output,
      std::regex(
          R"(epoch 1/8 \| step 20/504 \| loss [0-9.]+ \| lr 0.05 \| grad_norm [0-9.e+-]+ \| [0-9]+ samples/s \| elapsed [0-9:]+ \| eta [0-9:]+)")));
}

TEST_CASE("gputrain eval reproduces a run's test metrics from its model.safetensors", "[e2e]") {
  TempDir dir;
  write_text(dir / "synth.yaml", kSynthetic);
  REQUIRE(run_gputrain("train " + (dir / "synth.yaml") + " --epochs 2 --quiet --out " + (dir / "run")).exit_code == 0);
  const std::string summary = read_text(dir / "run/summary.json");
  const auto r =
      run_gputrain("eval " + (dir / "synth.yaml") + " --checkpoint " + (dir / "run/model.safetensors") + " --json");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(json_number(r.output, "samples") == 1000);
  // Bit-identical: the same weights, data and evaluation order (compared as printed, to the last digit).
  CHECK(json_number(r.output, "test_accuracy") == json_number(summary, "test_accuracy"));
  CHECK(json_number(r.output, "test_loss") == json_number(summary, "test_loss"));
  // A run directory and its final checkpoint folder name the same weights.
  const std::string final_ckpt = dir / ("run/checkpoints/" + lines_of(read_text(dir / "run/checkpoints/latest")).at(0));
  for (const std::string& where : {dir / "run", final_ckpt}) {
    const auto same = run_gputrain("eval " + (dir / "synth.yaml") + " --checkpoint " + where + " --json");
    INFO(same.output);
    REQUIRE(same.exit_code == 0);
    CHECK(json_number(same.output, "test_loss") == json_number(summary, "test_loss"));
  }
  // A run directory without final weights (a run still going, or stopped) is evaluated at its newest checkpoint.
  fs::remove(dir / "run/model.safetensors");
  const auto from_ckpt = run_gputrain("eval " + (dir / "synth.yaml") + " --checkpoint " + (dir / "run") + " --json");
  CHECK(from_ckpt.exit_code == 0);
  CHECK(json_number(from_ckpt.output, "test_loss") == json_number(summary, "test_loss"));
  const auto empty = run_gputrain("eval " + (dir / "synth.yaml") + " --checkpoint " + dir.path());
  CHECK(empty.exit_code == 2);
  CHECK_THAT(empty.output, Catch::Contains("a folder without model.safetensors or checkpoints/"));
  // Weights that do not fit the model are refused with the differences listed.
  const auto bad =
      run_gputrain("eval " + (dir / "synth.yaml") + " --set model.layers[0].out_features=32 --checkpoint " +
                   final_ckpt + "/model.safetensors");
  CHECK(bad.exit_code == 1);
  CHECK_THAT(bad.output, Catch::Contains("does not match the model (3 differences)") &&
                             Catch::Contains("layers.0.weight: f32 [64, 20] in the file, f32 [32, 20] in the model"));
}

TEST_CASE("eval and generate refuse weights with NaN or Inf, naming the tensor and its first bad element", "[e2e]") {
  // Logits of NaN weights are NaN: the loss came out null and the accuracy a number (argmax of NaN picks class 0),
  // as if the weights had been evaluated. Weights like these come from a diverged run or a corrupt file.
  TempDir dir;
  write_text(dir / "c.yaml", R"(name: nan
device: cpu
data: {format: synthetic, samples: 8, test_samples: 8, input_shape: [2], targets: {classes: 2}, batch_size: 4}
model: {layers: [{type: linear, out_features: 2}]}
optimizer: {type: sgd, lr: 0.1}
)");
  gt::Tensor w = gt::Tensor::zeros(gt::Shape{2, 2}, gt::DType::f32),
             b = gt::Tensor::zeros(gt::Shape{2}, gt::DType::f32);
  gt::write_safetensors(dir / "good.safetensors", {{"layers.0.weight", &w}, {"layers.0.bias", &b}});
  w.data<float>()[2] = std::nanf("");
  w.data<float>()[3] = std::nanf("");
  gt::write_safetensors(dir / "nan.safetensors", {{"layers.0.weight", &w}, {"layers.0.bias", &b}});
  w.data<float>()[2] = w.data<float>()[3] = 0;
  b.data<float>()[1] = -INFINITY;
  gt::write_safetensors(dir / "inf.safetensors", {{"layers.0.weight", &w}, {"layers.0.bias", &b}});

  REQUIRE(run_gputrain("eval " + (dir / "c.yaml") + " --checkpoint " + (dir / "good.safetensors")).exit_code == 0);
  for (const std::string json : {"", " --json"}) {
    const auto nan = run_gputrain("eval " + (dir / "c.yaml") + " --checkpoint " + (dir / "nan.safetensors") + json);
    INFO(nan.output);
    CHECK(nan.exit_code == 1);
    CHECK(lines_of(nan.output).size() == 1);
    CHECK_THAT(nan.output, Catch::Contains(dir / "nan.safetensors: tensor \"layers.0.weight\" [2, 2] holds 2 "
                                                 "non-finite values, the first nan at [1, 0]"));
    CHECK_THAT(nan.output, !Catch::Contains("test_accuracy"));
  }
  const auto inf = run_gputrain("eval " + (dir / "c.yaml") + " --checkpoint " + (dir / "inf.safetensors"));
  INFO(inf.output);
  CHECK(inf.exit_code == 1);
  CHECK_THAT(inf.output,
             Catch::Contains("tensor \"layers.0.bias\" [2] holds 1 non-finite value, the first -inf at [1]"));

  // generate loads weights the same way: a token model [4] -> [4, 256] with one NaN in its embedding table.
  std::vector<uint16_t> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(97 + i % 26);
  gt::write_token_shard(dir / "t.bin", tokens.data(), tokens.size());
  write_text(dir / "gpt.yaml", "name: g\ndevice: cpu\ndata: {format: tokens, train: {path: " + (dir / "t.bin") +
                                   "}, block_size: 4, batch_size: 1}\n"
                                   "model: {layers: [{type: embedding, num_embeddings: 256, embedding_dim: 4}, "
                                   "{type: linear, out_features: 256}]}\noptimizer: {type: sgd, lr: 0.1}\n");
  gt::Tensor emb = gt::Tensor::zeros(gt::Shape{256, 4}, gt::DType::f32),
             lw = gt::Tensor::zeros(gt::Shape{256, 4}, gt::DType::f32),
             lb = gt::Tensor::zeros(gt::Shape{256}, gt::DType::f32);
  emb.data<float>()[4 * 97 + 1] = std::nanf("");
  gt::write_safetensors(dir / "gpt.safetensors",
                        {{"layers.0.weight", &emb}, {"layers.1.weight", &lw}, {"layers.1.bias", &lb}});
  const auto gen =
      run_gputrain("generate " + (dir / "gpt.yaml") + " --checkpoint " + (dir / "gpt.safetensors") + " --tokens 4");
  INFO(gen.output);
  CHECK(gen.exit_code == 1);
  CHECK_THAT(
      gen.output,
      Catch::Contains(
          "gpt.safetensors: tensor \"layers.0.weight\" [256, 4] holds 1 non-finite value, the first nan at [97, 1]"));
}

TEST_CASE("the same config and seed give bit-identical losses", "[e2e]") {
  TempDir dir;
  write_text(dir / "synth.yaml", kSynthetic);
  const std::string common = "train " + (dir / "synth.yaml") + " --epochs 2 --threads 2 --out ";
  REQUIRE(run_gputrain(common + (dir / "a")).exit_code == 0);
  REQUIRE(run_gputrain(common + (dir / "b")).exit_code == 0);
  REQUIRE(run_gputrain(common + (dir / "c") + " --seed 8").exit_code == 0);
  const std::string a = losses_of(read_text(dir / "a/metrics.jsonl"));
  CHECK(!a.empty());
  CHECK(a == losses_of(read_text(dir / "b/metrics.jsonl")));
  CHECK(a != losses_of(read_text(dir / "c/metrics.jsonl")));
}

TEST_CASE("max_steps stops early and says so", "[e2e]") {
  TempDir dir;
  write_text(dir / "synth.yaml", kSynthetic);
  const auto r = run_gputrain("train " + (dir / "synth.yaml") + " --max-steps 70 --out " + (dir / "run"));
  REQUIRE(r.exit_code == 0);
  const std::string summary = read_text(dir / "run/summary.json");
  CHECK(json_number(summary, "steps") == 70);
  CHECK(json_number(summary, "epochs") == 2);
  CHECK(json_string(summary, "exit_reason") == "max_steps");
}

TEST_CASE("gradient accumulation over 2 x 32 equals batches of 64", "[e2e]") {
  TempDir dir;
  write_text(dir / "synth.yaml", kSynthetic);
  const std::string common = "train " + (dir / "synth.yaml") + " --epochs 2 --threads 1 ";
  REQUIRE(run_gputrain(common + "--out " + (dir / "big")).exit_code == 0);
  const auto r = run_gputrain(common + "--set data.batch_size=32 --set train.accumulate=2 --out " + (dir / "acc"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("batch 32 × 2 accumulated = global batch 64"));
  const auto big = lines_of(read_text(dir / "big/metrics.jsonl")), acc = lines_of(read_text(dir / "acc/metrics.jsonl"));
  REQUIRE(big.size() == acc.size());
  for (size_t i = 0; i < big.size(); ++i) {
    INFO(big[i] << "\n" << acc[i]);
    CHECK(json_number(big[i], "step") == json_number(acc[i], "step"));
    // Same samples, same mean gradient; only the float summation order differs.
    const auto key = json_string(big[i], "type") == "train" ? "loss" : "test_loss";
    CHECK(json_number(acc[i], key).value() == Approx(json_number(big[i], key).value()).epsilon(1e-4));
  }
}

TEST_CASE("schedules, warmup, clipping and eval_every show in the metrics", "[e2e]") {
  TempDir dir;
  write_text(dir / "synth.yaml", kSynthetic);
  const auto r = run_gputrain("train " + (dir / "synth.yaml") +
                              " --epochs 2 --set train.log_every=1 --set train.eval_every=50"
                              " --set 'train.grad_clip={max_norm: 0.5}'"
                              " --set 'scheduler={type: cosine, warmup_steps: 10, warmup_start_factor: 0.1}'"
                              " --set 'optimizer={type: adamw, lr: 0.01}' --out " +
                              (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::vector<double> lr;
  int evals = 0;
  for (const auto& l : lines_of(read_text(dir / "run/metrics.jsonl"))) {
    if (json_string(l, "type") == "eval") {
      ++evals;
      continue;
    }
    lr.push_back(json_number(l, "lr").value());
    CHECK(json_number(l, "grad_norm").value_or(-1) > 0);
  }
  REQUIRE(lr.size() == 126);
  CHECK(lr[0] == Approx(0.001));                                             // 0.01 × warmup factor 0.1
  CHECK(lr[5] == Approx(0.01 * (1 + std::cos(M_PI * 5 / 126)) / 2 * 0.55));  // cosine × warmup 0.1 + 0.9·5/10
  CHECK(lr[125] < 1e-5);                                                     // the cosine ends near 0
  CHECK(evals == 3);                                                         // steps 50, 100 and the last (126)
}

TEST_CASE("training from CSV files", "[e2e]") {
  TempDir dir;
  // Label 1 when x > y: linearly separable, so a linear model learns it.
  std::string train = "x,y,label\n", test = "x,y,label\n";
  gt::Rng rng(1, 1);
  for (int i = 0; i < 600; ++i) {
    const double x = rng.uniform(-1, 1), y = rng.uniform(-1, 1);
    (i < 500 ? train : test) += fmt::format("{},{},{}\n", x, y, x > y ? 1 : 0);
  }
  write_text(dir / "train.csv", train);
  write_text(dir / "test.csv", test);
  write_text(dir / "csv.yaml", "name: csv\ndata: {format: csv, train: {path: " + (dir / "train.csv") +
                                   "}, test: {path: " + (dir / "test.csv") +
                                   "}, label: label, batch_size: 20}\n"
                                   "model: {layers: [{type: linear, out_features: 2}]}\n"
                                   "optimizer: {type: sgd, lr: 0.5, momentum: 0.9}\ntrain: {epochs: 10}\n");
  const auto r = run_gputrain("train " + (dir / "csv.yaml") + " --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(json_number(read_text(dir / "run/summary.json"), "test_accuracy").value_or(0) >= 0.95);
}

TEST_CASE("profiling (--profile) writes a Chrome trace and a per-layer table that accounts for the step time",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "synth.yaml", kSynthetic);
  // Wide enough layers that a step is mostly arithmetic rather than loop overhead.
  const auto r = run_gputrain(
      "train " + (dir / "synth.yaml") +
      " --profile --set 'data.input_shape=[256]' --set model.layers[0].out_features=512 --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string table = read_text(dir / "run/profile.txt");
  INFO(table);
  for (const char* row :
       {"layers.0       linear       forward       20", "layers.2       linear       backward      20",
        "optimizer      sgd          update        20", "data           trainer      load          20"})
    CHECK_THAT(table, Catch::Contains(row));
  std::smatch m;
  REQUIRE(std::regex_search(table, m, std::regex(R"(20 steps: [0-9.]+ ms per step; the spans cover ([0-9.]+) %)")));
  const double cover = std::stod(m[1].str());
  // The named spans account for the measured step time within 10 %: checked below on the median step of the trace,
  // since ctest runs two tests at once and one stall of this 0.6 ms step between spans (seen once in CI: 66 % over
  // the 20 steps) would sink the average; the table's figure is the same sum over all steps.
  CHECK(cover > 50.0);
  CHECK(cover <= 100.5);
  // The trace is valid JSON in Chrome's trace-event format: checked with Python's own parser.
  const std::string trace = dir / "run/trace.json";
  // Complete events ('X') for spans and steps, metadata events ('M') naming the rows.
  const std::string check =
      "python3 -c \"import json,sys; t=json.load(open(sys.argv[1])); a=t['traceEvents']; "
      "e=[x for x in a if x['ph']=='X']; m=[x for x in a if x['ph']=='M']; "
      "assert len(e)+len(m)==len(a) and all(x['name']=='thread_name' for x in m); "
      "assert all(x['dur']>=0 and 'ts' in x and 'name' in x for x in e); "
      "assert sum(x['cat']=='step' for x in e)==20; assert len(e)>100; "
      "s=[x for x in e if x['cat']=='step']; p=[x for x in e if x['cat']!='step']; "
      "c=sorted(sum(q['dur'] for q in p if st['ts']<=q['ts']<st['ts']+st['dur'])/st['dur'] for st in s); "
      "assert 0.9<c[10]<=1.005, c\" " +
      trace;
  CHECK(std::system(check.c_str()) == 0);

  SECTION("data-parallel: the all-reduce of every bucket on the communication thread's row, and the wait for it") {
    const auto two =
        run_gputrain("train " + (dir / "synth.yaml") + " --device '[cpu, cpu]' --profile --out " + (dir / "two"));
    INFO(two.output);
    REQUIRE(two.exit_code == 0);
    const std::string t2 = read_text(dir / "two/profile.txt");
    INFO(t2);
    CHECK_THAT(t2, Catch::Contains("all-reduce     bucket 0     bucket        20") &&
                       Catch::Contains("all-reduce     after backward wait          20") &&
                       Catch::Contains("are not counted"));
    REQUIRE(std::regex_search(t2, m, std::regex(R"(the spans cover ([0-9.]+) %)")));
    CHECK(std::stod(m[1].str()) > 90.0);
    CHECK(std::stod(m[1].str()) <= 100.5);
    const std::string lanes =
        "python3 -c \"import json,sys; e=json.load(open(sys.argv[1]))['traceEvents']; "
        "assert sum(x['tid']==3 and x['name']=='all-reduce bucket' for x in e)==20; "
        "assert any(x['ph']=='M' and x['tid']==3 and x['args']['name']=='communication thread' "
        "for x in e)\" " +
        (dir / "two/trace.json");
    CHECK(std::system(lanes.c_str()) == 0);
  }
}

TEST_CASE("configs/seed_linear.yaml trains like the PyTorch example it mirrors", "[e2e]") {
  TempDir dir;
  const auto r = run_gputrain("train " + source_path("configs/seed_linear.yaml") + " --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto metrics = lines_of(read_text(dir / "run/metrics.jsonl"));
  REQUIRE(metrics.size() == 10);  // one line per epoch
  const double first = json_number(metrics.front(), "loss").value();
  const double last = json_number(metrics.back(), "loss").value();
  CHECK(last < first);
  CHECK(json_number(read_text(dir / "run/summary.json"), "test_accuracy") == std::nullopt);
}

TEST_CASE("configs/fashion_mnist_mlp.yaml checks and trains", "[e2e]") {
  TempDir dir;
  const auto check = run_gputrain("check " + source_path("configs/fashion_mnist_mlp.yaml"));
  INFO(check.output);
  REQUIRE(check.exit_code == 0);
  CHECK_THAT(check.output, Catch::Contains("60000 training samples, 10000 test samples") &&
                               Catch::Contains("layers.1     linear     [128, 512]               401920") &&
                               Catch::Contains("535818 parameters"));
  const auto r =
      run_gputrain("train " + source_path("configs/fashion_mnist_mlp.yaml") + " --max-steps 60 --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(json_number(read_text(dir / "run/summary.json"), "test_accuracy").value_or(0) > 0.6);
}

TEST_CASE("configs/fashion_mnist_cnn.yaml, fashion_mnist_resnet.yaml and fashion_mnist_speedrun.yaml check and train",
          "[e2e]") {
  TempDir dir;
  for (const std::string name : {"fashion_mnist_cnn", "fashion_mnist_resnet", "fashion_mnist_speedrun"}) {
    const std::string cfg = source_path("configs/" + name + ".yaml");
    const auto check = run_gputrain("check " + cfg);
    INFO(check.output);
    REQUIRE(check.exit_code == 0);
    const auto r = run_gputrain("train " + cfg + " --max-steps 40 --set train.eval_every=40 --out " + (dir / name));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(json_number(read_text(dir / (name + "/summary.json")), "test_accuracy").value_or(0) > 0.5);
  }
}

// The documented commands: tokenize the fortunes text, train a few steps, sample. The shipped config reads
// data/fortunes relative to the working directory, so the test runs gputrain from a scratch directory.
TEST_CASE("configs/image_folder.yaml trains on an image folder written from Fashion-MNIST, as its header says",
          "[e2e]") {
  TempDir dir;
  // The config's own recipe, smaller: scripts/fashion_folder.py, then train from the folder the paths are relative to.
  const auto w = run_shell("/usr/bin/python3 " + source_path("scripts/fashion_folder.py") + " " +
                           (dir / "data/fashion_folder") + " --per-class 60 2>&1");
  INFO(w.output);
  REQUIRE(w.exit_code == 0);
  CHECK_THAT(w.output, Catch::Contains("600 training and 100 test images in 10 class folders"));
  const std::string cfg = source_path("configs/image_folder.yaml");
  const std::string in_dir = "cd " + dir.path() + " && " + gputrain_binary() + " ";
  const auto c = run_shell(in_dir + "check " + cfg + " 2>&1");
  INFO(c.output);
  CHECK(c.exit_code == 0);
  CHECK_THAT(c.output, Catch::Contains("images: 700 decoded from"));
  CHECK(fs::exists(dir / "data/fashion_folder/decoded.cache"));
  // Training reads the cache check wrote, and learns (10 classes: chance is 0.1).
  const auto r = run_shell(in_dir + "train " + cfg + " --threads 2 --epochs 4 --no-progress --out run 2>&1");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("images: 700 from cache"));
  const auto acc = json_number(read_text(dir / "run/summary.json"), "test_accuracy");
  REQUIRE(acc.has_value());
  CHECK(*acc > 0.5);
}

TEST_CASE("configs/gpt_bytes.yaml tokenizes, trains and generates as the README shows", "[e2e]") {
  TempDir dir;
  REQUIRE(fs::is_directory("/usr/share/games/fortunes"));  // Debian's fortunes, installed by scripts/setup.sh
  const std::string cfg = source_path("configs/gpt_bytes.yaml");
  const auto tok = run_gputrain("tokenize $(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort) --out " +
                                (dir / "data/fortunes"));
  INFO(tok.output);
  REQUIRE(tok.exit_code == 0);
  const std::string in_dir = "cd " + dir.path() + " && ";
  const auto check = run_gputrain("check " + cfg, in_dir);
  INFO(check.output);
  REQUIRE(check.exit_code == 0);
  CHECK_THAT(check.output, Catch::Contains("834304 parameters") && Catch::Contains("per token:"));
  const auto r = run_gputrain("train " + cfg + " --max-steps 20 --set train.eval_tokens=4096 --out run", in_dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(json_number(read_text(dir / "run/summary.json"), "test_bpb").value_or(99) < 8.0);
  const auto g = run_gputrain("generate " + cfg + " --checkpoint run --prompt 'The ' --tokens 40 --seed 3", in_dir);
  INFO(g.output);
  REQUIRE(g.exit_code == 0);
  CHECK(g.output.rfind("The ", 0) == 0);
}

TEST_CASE("configs/gpt2_124m.yaml is GPT-2 small as llm.c trains it", "[e2e]") {
  TempDir dir;
  // Stand-in shards (the config's FineWeb paths are llm.c's): check needs the data only for its shapes.
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 2049;
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes += std::string(2 * 2049, '\0');
  write_text(dir / "shard.bin", bytes);
  const auto check =
      run_gputrain("check " + source_path("configs/gpt2_124m.yaml") + " --set data.train.path=" + (dir / "shard.bin") +
                   " --set data.test.path=" + (dir / "shard.bin"));
  INFO(check.output);
  REQUIRE(check.exit_code == 0);
  CHECK_THAT(check.output, Catch::Contains("124475904 parameters") && Catch::Contains("per token: 266.11 MFLOP") &&
                               Catch::Contains("fits on "));
}

TEST_CASE("fashion_mnist_mlp reaches 80% test accuracy after one epoch", "[e2e]") {
  // A guard only: seed 1 on 1 thread gives 81.98 % here. The 5-epoch targets (MLP mean of ten seeds >= 86.5 %, CNN
  // >= 89.8 %) take about 15 min on 2 cores and are checked by bench/accuracy.sh.
  TempDir dir;
  const auto r = run_gputrain("train " + source_path("configs/fashion_mnist_mlp.yaml") +
                              " --quiet --threads 1 --seed 1 --set train.epochs=1 --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(json_number(read_text(dir / "run/summary.json"), "test_accuracy").value_or(0) >= 0.80);
}

TEST_CASE("gputrain devices, --version and --help exit 0", "[e2e]") {
  const auto d = run_gputrain("devices");
  INFO(d.output);
  CHECK(d.exit_code == 0);
  CHECK_THAT(d.output, Catch::Contains("cpu:") && Catch::Contains("cuda:"));
  // A GPUTRAIN_CPU_* value it cannot take: exit 1 with one line that names the variable and what it takes.
  auto refused = [](const std::string& env, const std::string& message) {
    const auto r = run_gputrain("devices", env);
    INFO(env << "\n" << r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains(message));
    CHECK(lines_of(r.output).size() == 1);
  };
  // The path bf16 products take: native where the CPU has avx512_bf16, conversion when asked for (or without it).
  CHECK_THAT(d.output, Catch::Contains("bf16 products: native") || Catch::Contains("bf16 products: conversion"));
  const auto convert = run_gputrain("devices", "GPUTRAIN_CPU_BF16=convert");
  CHECK_THAT(convert.output, Catch::Contains("bf16 products: conversion"));
  refused("GPUTRAIN_CPU_BF16=fastest", "GPUTRAIN_CPU_BF16=fastest: expected auto, native or convert");
  // The other kernels' hot loops (ops/cpu/isa.h): the widest instruction set the CPU has.
  const char* isa_line[] = {"other kernels: baseline x86-64", "other kernels: AVX2+FMA (x86-64-v3)",
                            "other kernels: AVX-512 (x86-64-v4)"};
  CHECK_THAT(d.output, Catch::Contains(isa_line[static_cast<int>(gt::cpu::best_cpu_isa())]));
  // GPUTRAIN_CPU_ISA picks a narrower path (or refuses, exit 1 with one line).
  CHECK_THAT(run_gputrain("devices", "GPUTRAIN_CPU_ISA=baseline").output, Catch::Contains(isa_line[0]));
  if (gt::cpu::best_cpu_isa() >= gt::cpu::CpuIsa::avx2)
    CHECK_THAT(run_gputrain("devices", "GPUTRAIN_CPU_ISA=avx2").output, Catch::Contains(isa_line[1]));
  if (gt::cpu::best_cpu_isa() < gt::cpu::CpuIsa::avx512) {
    refused("GPUTRAIN_CPU_ISA=avx512", "GPUTRAIN_CPU_ISA=avx512: this CPU lacks the instructions it needs");
  }
  refused("GPUTRAIN_CPU_ISA=sse9", "GPUTRAIN_CPU_ISA=sse9: expected auto, avx512, avx2 or baseline");
  // A value with control bytes is quoted and escaped, the message still one line (core/env.h).
  refused("GPUTRAIN_CPU_ISA=\"$(printf 'a\\nb')\"", "GPUTRAIN_CPU_ISA=\"a\\nb\": expected auto");
  // How 3x3 convolutions multiply on the CPU (ops/cpu/conv_algo.h): auto, or GPUTRAIN_CPU_CONV's choice.
  CHECK_THAT(d.output,
             Catch::Contains("3x3 convolutions: Winograd F(2x2,3x3) for 3x3 stride-1 layers of 16+ channels"));
  CHECK_THAT(run_gputrain("devices", "GPUTRAIN_CPU_CONV=im2col").output,
             Catch::Contains("3x3 convolutions: im2col (GPUTRAIN_CPU_CONV=im2col)"));
  CHECK_THAT(run_gputrain("devices", "GPUTRAIN_CPU_CONV=winograd").output,
             Catch::Contains("3x3 convolutions: Winograd F(2x2,3x3) (GPUTRAIN_CPU_CONV=winograd)"));
  refused("GPUTRAIN_CPU_CONV=fft", "GPUTRAIN_CPU_CONV=fft: expected auto, im2col or winograd");
  // Which layer chains run fused (graph/model.h's Model::chains): on, or off by GPUTRAIN_CPU_FUSE.
  CHECK_THAT(d.output, Catch::Contains("fused chains: batch norm -> 2x2 max pool -> relu"));
  CHECK_THAT(run_gputrain("devices", "GPUTRAIN_CPU_FUSE=off").output,
             Catch::Contains("fused chains: off (GPUTRAIN_CPU_FUSE=off)"));
  refused("GPUTRAIN_CPU_FUSE=fast", "GPUTRAIN_CPU_FUSE=fast: expected auto, on or off");
  // The f32 products' kernels (ops/cpu/sgemm.h): chosen by CPUID, or by GPUTRAIN_CPU_SGEMM.
  CHECK_THAT(d.output, Catch::Contains("f32 products: gputrain AVX-512") ||
                           Catch::Contains("f32 products: gputrain AVX2+FMA") ||
                           Catch::Contains("f32 products: OpenBLAS"));
  CHECK_THAT(run_gputrain("devices", "GPUTRAIN_CPU_SGEMM=openblas").output,
             Catch::Contains("f32 products: OpenBLAS sgemm"));
  // auto: ours on every AVX-512 CPU, whatever core OpenBLAS runs; at AVX2, ours where OpenBLAS runs an older core
  // and OpenBLAS where it runs an AVX2 one.
  if (gt::cpu::cpu_sgemm_supported(gt::cpu::CpuSgemmPath::avx2)) {
    const bool avx512 = gt::cpu::cpu_sgemm_supported(gt::cpu::CpuSgemmPath::avx512);
    CHECK_THAT(run_gputrain("devices", "OPENBLAS_CORETYPE=Prescott").output,
               Catch::Contains(avx512 ? "f32 products: gputrain AVX-512" : "f32 products: gputrain AVX2+FMA"));
    CHECK_THAT(run_gputrain("devices", "OPENBLAS_CORETYPE=Haswell").output,
               Catch::Contains(avx512 ? "f32 products: gputrain AVX-512" : "f32 products: OpenBLAS sgemm"));
    if (avx512)
      CHECK_THAT(run_gputrain("devices", "OPENBLAS_CORETYPE=SkylakeX").output,
                 Catch::Contains("f32 products: gputrain AVX-512"));
  }
  refused("GPUTRAIN_CPU_SGEMM=fastest", "GPUTRAIN_CPU_SGEMM=fastest: expected auto, avx512, avx2 or openblas");
  CHECK(run_gputrain("--version").exit_code == 0);
  const auto h = run_gputrain("train --help");
  CHECK(h.exit_code == 0);
  CHECK_THAT(h.output, Catch::Contains("--set") && Catch::Contains("Exit codes"));
}

TEST_CASE("bad configs and usage exit 2 with one error line, bad data exits 1", "[e2e]") {
  TempDir dir;
  auto expect = [&](const std::string& args, int code, const std::string& message) {
    const auto r = run_gputrain(args);
    INFO(args << "\n" << r.output);
    CHECK(r.exit_code == code);
    CHECK_THAT(r.output, Catch::Contains(message));
    CHECK(lines_of(r.output).size() <= 2);  // one clear line (CLI usage errors add a hint)
  };
  write_text(dir / "bad.yaml", std::string(kSynthetic) + "epochs: 3\n");
  expect("train " + (dir / "bad.yaml"), 2, "epochs: unknown key (did you mean \"train.epochs\"?)");
  write_text(dir / "good.yaml", kSynthetic);
  expect("train " + (dir / "good.yaml") + " --set model.layers[0].out_features=-4", 2,
         "model.layers[0].out_features: expected a positive integer, got -4 (--set model.layers[0].out_features=-4)");
  expect("check " + (dir / "good.yaml") + " --set train.nope.deeper=1", 2,
         "the config has no key train.nope; write +train.nope.deeper=1 to add it");
  expect("train " + (dir / "missing.yaml"), 2, "cannot open config file");
  expect("train", 2, "a config is needed");
  expect("frobnicate", 2, "error:");
  expect("train " + (dir / "good.yaml") + " --device cuda:0", 1, "device cuda:0");

  // A corrupt data file is a data error: exit 1, naming the file.
  write_text(dir / "img.idx", "not an idx file");
  write_text(dir / "lbl.idx", "not an idx file");
  write_text(dir / "idx.yaml", "name: x\ndata: {format: idx, train: {images: " + (dir / "img.idx") +
                                   ", labels: " + (dir / "lbl.idx") +
                                   "}}\nmodel: {layers: [flatten, {type: linear, out_features: 2}]}\n"
                                   "optimizer: {type: sgd, lr: 0.1}\n");
  expect("train " + (dir / "idx.yaml") + " --out " + (dir / "run"), 1, dir / "img.idx");
  CHECK_FALSE(fs::exists(dir / "run"));  // nothing is created for a run that cannot start
}

TEST_CASE("every test name is one ctest can run (no semicolon, no leading dashes)", "[cpu]") {
  // ctest splits a name at ';' into filters that match nothing, and reports the test as passed without running it.
  char self[4096] = {};
  REQUIRE(readlink("/proc/self/exe", self, sizeof self - 1) > 0);
  FILE* p = popen((std::string(self) + " --list-test-names-only").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string names;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) names.append(buf, n);
  pclose(p);
  int count = 0;
  for (const auto& name : lines_of(names)) {
    INFO(name);
    CHECK(name.find(';') == std::string::npos);
    CHECK(name.rfind("--", 0) != 0);
    ++count;
  }
  CHECK(count > 60);
}

// Heavy augmentation of big images in front of a linear model (data preparation is about 70 % of the step) and a
// wide MLP on 8 features (well under 1 %): far from the 10 % line either way, also on a loaded machine.
TEST_CASE("data_wait_ms is in every train row, and the log says once when getting batches ready dominates", "[e2e]") {
  TempDir dir;
  const std::string common = R"(seed: 1
device: cpu
optimizer: {type: sgd, lr: 0.01}
loss: cross_entropy
train: {epochs: 3, log_every: 4}
)";
  write_text(dir / "heavy.yaml", common + R"(name: heavy
data:
  format: synthetic
  samples: 512
  input_shape: [3, 64, 64]
  targets: {classes: 2}
  batch_size: 64
  augment: {random_crop: {padding: 4}, hflip: true}
model: {layers: [flatten, {type: linear, out_features: 2}]}
)");
  write_text(dir / "light.yaml", common + R"(name: light
data: {format: synthetic, samples: 512, input_shape: [8], targets: {classes: 2}, batch_size: 64}
model:
  layers: [{type: linear, out_features: 1024}, relu, {type: linear, out_features: 1024}, relu,
           {type: linear, out_features: 2}]
)");
  for (const std::string name : {"heavy", "light"}) {
    const auto r = run_gputrain("train " + (dir / (name + ".yaml")) + " --out " + (dir / name) + " --threads 1");
    INFO(name << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    int rows = 0;
    double wait_sum = 0;
    for (const auto& l : lines_of(read_text(dir / (name + "/metrics.jsonl")))) {
      if (json_string(l, "type") != "train") continue;
      ++rows;
      const std::optional<double> wait = json_number(l, "data_wait_ms");
      REQUIRE(wait.has_value());
      CHECK(*wait >= 0);
      wait_sum += *wait;
    }
    CHECK(rows == 6);  // 24 steps, every 4th
    const std::string log = read_text(dir / (name + "/train.log"));
    size_t notes = 0;
    for (size_t at = log.find("data wait: "); at != std::string::npos; at = log.find("data wait: ", at + 1)) ++notes;
    if (name == "heavy") {
      CHECK(wait_sum > 0);
      CHECK(notes == 1);
      std::smatch m;
      REQUIRE(std::regex_search(log, m, std::regex(R"(data wait: ([0-9]+)% of the step time \(([0-9.e+-]+) ms of )")));
      CHECK(std::stod(m[1].str()) > 10);
      CHECK(std::stod(m[2].str()) > 0);
      CHECK_THAT(log, Catch::Contains("data.augment (random_crop, hflip)"));
    } else {
      CHECK(notes == 0);
    }
  }
}

// Known arrays in NPY files (and token shards): the numbers data inspect prints are checked against a two-pass
// computation here, after data.scale, as the model sees them.
TEST_CASE("gputrain data inspect: class counts, shapes, range and per-channel mean and std of each split", "[e2e]") {
  TempDir dir;
  const int64_t n_train = 6, n_test = 3, channels = 2, per = 3;  // samples of shape [2, 3]
  auto make = [&](int64_t n, int64_t salt, std::vector<float>& x) {
    x.resize(static_cast<size_t>(n * channels * per));
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>(static_cast<int64_t>((i * 7 + static_cast<size_t>(salt)) % 11)) - 2.5f;
  };
  std::vector<float> xtr, xte;
  make(n_train, 0, xtr);
  make(n_test, 5, xte);
  const std::vector<int64_t> ytr{0, 2, 2, 1, 2, 0}, yte{1, 1, 0};
  write_npy(dir / "xtr.npy", "<f4", "(6, 2, 3)", xtr.data(), xtr.size() * 4);
  write_npy(dir / "ytr.npy", "<i8", "(6,)", ytr.data(), ytr.size() * 8);
  write_npy(dir / "xte.npy", "<f4", "(3, 2, 3)", xte.data(), xte.size() * 4);
  write_npy(dir / "yte.npy", "<i8", "(3,)", yte.data(), yte.size() * 8);
  write_text(dir / "npy.yaml", fmt::format(R"(name: inspect
data:
  format: npy
  train: {{inputs: {0}/xtr.npy, targets: {0}/ytr.npy}}
  test: {{inputs: {0}/xte.npy, targets: {0}/yte.npy}}
  scale: 0.5
model: {{layers: [flatten, {{type: linear, out_features: 3}}]}}
optimizer: {{type: sgd, lr: 0.1}}
)",
                                           dir.path()));
  const auto r = run_gputrain("data inspect " + (dir / "npy.yaml") + " --json");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const gt::JsonValue v = gt::json_read_object(r.output);
  const gt::JsonValue* splits = v.find("splits");
  REQUIRE(splits != nullptr);
  REQUIRE(splits->items.size() == 2);
  auto numbers = [](const gt::JsonValue& o, const char* key) {
    std::vector<double> out;
    if (const gt::JsonValue* a = o.find(key))
      for (const gt::JsonValue& e : a->items) out.push_back(e.number);
    return out;
  };
  for (int k = 0; k < 2; ++k) {
    const gt::JsonValue& s = splits->items[static_cast<size_t>(k)];
    const std::vector<float>& x = k == 0 ? xtr : xte;
    const std::vector<int64_t>& y = k == 0 ? ytr : yte;
    const int64_t n = k == 0 ? n_train : n_test;
    CHECK(s.find("split")->string == (k == 0 ? "train" : "test"));
    CHECK(s.find("samples")->number == static_cast<double>(n));
    CHECK(numbers(s, "input_shape") == std::vector<double>{2, 3});
    // Counts of the labels as written; both splits have the classes of the larger label set (3).
    std::vector<double> counts(3, 0.0);
    for (int64_t l : y) counts[static_cast<size_t>(l)] += 1;
    CHECK(numbers(s, "class_counts") == counts);
    double lo = 1e30, hi = -1e30;
    std::vector<double> mean(channels, 0.0), var(channels, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t j = 0; j < per; ++j) {
          const double e = 0.5 * x[static_cast<size_t>((i * channels + c) * per + j)];
          mean[static_cast<size_t>(c)] += e / static_cast<double>(n * per);
          lo = std::min(lo, e);
          hi = std::max(hi, e);
        }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t j = 0; j < per; ++j) {
          const double d = 0.5 * x[static_cast<size_t>((i * channels + c) * per + j)] - mean[static_cast<size_t>(c)];
          var[static_cast<size_t>(c)] += d * d / static_cast<double>(n * per);
        }
    CHECK(s.find("min")->number == lo);
    CHECK(s.find("max")->number == hi);
    const std::vector<double> got_mean = numbers(s, "mean"), got_std = numbers(s, "std");
    REQUIRE(got_mean.size() == channels);
    REQUIRE(got_std.size() == channels);
    for (size_t c = 0; c < channels; ++c) {
      CHECK(got_mean[c] == Approx(mean[c]).margin(1e-12));
      CHECK(got_std[c] == Approx(std::sqrt(var[c])).epsilon(1e-9));
      CHECK(got_std[c] > 0);  // the data is not constant: a zero would mean the wrong axis
    }
  }
  // The text form says the same for people.
  const auto t = run_gputrain("data inspect " + (dir / "npy.yaml"));
  INFO(t.output);
  CHECK(t.exit_code == 0);
  CHECK_THAT(t.output, Catch::Contains("train: 6 samples") && Catch::Contains("test: 3 samples") &&
                           Catch::Contains("3 classes, samples per class: 0:2 1:1 2:3"));

  // Token shards: count, distinct ids and their range over every token.
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 200; ++i) tokens.push_back(static_cast<uint16_t>(10 + (i * 13) % 40));  // ids 10..49
  fs::create_directories(dir / "tok");
  gt::write_token_shard(dir / "tok/train_000000.bin", tokens.data(), tokens.size());
  write_text(dir / "tok.yaml", fmt::format(R"(name: tok
data: {{format: tokens, train: {{path: "{0}/tok/train_*.bin"}}, block_size: 8}}
model: {{layers: [{{type: embedding, num_embeddings: 256, embedding_dim: 8}}, {{type: linear, out_features: 256}}]}}
optimizer: {{type: sgd, lr: 0.1}}
)",
                                           dir.path()));
  const auto tk = run_gputrain("data inspect " + (dir / "tok.yaml") + " --json");
  INFO(tk.output);
  REQUIRE(tk.exit_code == 0);
  const gt::JsonValue tv = gt::json_read_object(tk.output);
  REQUIRE(tv.find("splits")->items.size() == 1);
  const gt::JsonValue& ts = tv.find("splits")->items[0];
  std::vector<bool> seen(65536, false);
  for (uint16_t tok : tokens) seen[tok] = true;
  CHECK(ts.find("tokens")->number == 200);
  CHECK(ts.find("distinct_tokens")->number == static_cast<double>(std::count(seen.begin(), seen.end(), true)));
  CHECK(ts.find("min_token")->number == *std::min_element(tokens.begin(), tokens.end()));
  CHECK(ts.find("max_token")->number == *std::max_element(tokens.begin(), tokens.end()));

  // A config error is exit 2 naming the key, as check does.
  const auto bad = run_gputrain("data inspect " + (dir / "npy.yaml") + " --set data.scale=abc");
  INFO(bad.output);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("data.scale"));
  CHECK(run_gputrain("data inspect").exit_code == 2);
}

TEST_CASE("window rates add up: samples over the training time of the window, across epoch boundaries", "[e2e]") {
  // 4 steps an epoch, a row every 30 steps: each window spans 7 or 8 epoch boundaries, evaluations and checkpoints.
  TempDir dir;
  std::string cfg = kTinyConfig;
  const auto swap = [&cfg](const std::string& from, const std::string& to) {
    cfg.replace(cfg.find(from), from.size(), to);
  };
  swap("train: {epochs: 1, log_every: 1}", "train: {epochs: 30, log_every: 30}");
  swap("samples: 256", "samples: 128");
  write_text(dir / "c.yaml", cfg + "checkpoint: {every_steps: 40}\n");
  const auto r = run_gputrain("train " + (dir / "c.yaml") + " --threads 1 --no-progress --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  int64_t last_step = 0;
  double last_elapsed = 0, samples = 0, train_seconds = 0;
  int rows = 0;
  for (const std::string& line : lines_of(read_text(dir / "run/metrics.jsonl"))) {
    const gt::JsonValue row = gt::json_read_object(line);
    if (row.find("type")->string != "train") continue;
    ++rows;
    const int64_t step = *row.find("step")->integer;
    const double window = static_cast<double>((step - last_step) * 32);  // the window's samples
    for (const char* key : {"samples_per_sec", "elapsed_s", "train_s", "eval_s", "checkpoint_s"})
      REQUIRE(row.find(key) != nullptr);
    const double rate = row.find("samples_per_sec")->number, elapsed = row.find("elapsed_s")->number;
    const double train_s = row.find("train_s")->number, eval_s = row.find("eval_s")->number,
                 checkpoint_s = row.find("checkpoint_s")->number;
    INFO("row at step " << step << ": " << line);
    CHECK(window / rate == Approx(train_s).epsilon(1e-9));  // the rate is the window's samples over its time
    // The window's training, evaluation and checkpoint time fit in the wall time since the previous row.
    CHECK(train_s + eval_s + checkpoint_s <= elapsed - last_elapsed + 1e-3);
    CHECK(eval_s > 0);  // an evaluation at every epoch's end, inside every window
    samples += window;
    train_seconds += train_s;
    last_step = step;
    last_elapsed = elapsed;
  }
  CHECK(last_step == 120);
  CHECK(rows == 4);  // steps 30, 60, 90, 120
  // The run's rate (summary.json, the done line) is the windows' samples over their summed time (and the few
  // microseconds the clock runs after the last row).
  const double done = *json_number(read_text(dir / "run/summary.json"), "samples_per_sec");
  CHECK(done == Approx(samples / train_seconds).epsilon(1e-3));
  CHECK_THAT(r.output, Catch::Contains(fmt::format("done: 120 steps, {:.0f} samples/s", done)));
}

TEST_CASE("the command line takes what people type: bare overrides, --config, a run directory, flags that win",
          "[e2e]") {
  TempDir dir;
  std::string cfg = kTinyConfig;
  cfg.replace(cfg.find("train: {epochs: 1, log_every: 1}"), 32, "train: {epochs: 2, log_every: 100}");
  write_text(dir / "c.yaml", cfg);
  // Hydra's bare KEY=VALUE after the config, with its prefixes, and --config FILE.
  auto r = run_gputrain("train " + (dir / "c.yaml") + " optimizer.lr=0.05 ++train.log_every=2 '~seed'" +
                        " --quiet --out " + (dir / "a"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(read_text(dir / "a/overrides.json") ==
        "{\"overrides\": [\"optimizer.lr=0.05\", \"++train.log_every=2\", \"~seed\"]}\n");
  CHECK_THAT(read_text(dir / "a/config.resolved.yaml"), Catch::Contains("lr: 0.05"));
  r = run_gputrain("train --config " + (dir / "c.yaml") + " optimizer.lr=0.2 --quiet --out " + (dir / "b"));
  CHECK(r.exit_code == 0);
  CHECK_THAT(read_text(dir / "b/config.resolved.yaml"), Catch::Contains("lr: 0.2"));
  // What does not parse says what would.
  r = run_gputrain("train " + (dir / "c.yaml") + " --optimizer.lr=0.02");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("an override is --set optimizer.lr=0.02 (or optimizer.lr=0.02 after CONFIG)"));
  r = run_gputrain("train " + (dir / "c.yaml") + " --set optimizer.lr 0.02");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--set optimizer.lr 0.02: write --set optimizer.lr=0.02"));
  r = run_gputrain("train " + (dir / "c.yaml") + " " + (dir / "c.yaml"));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("not an override") && Catch::Contains("only one config may be given"));
  // A run directory stands for its config and, for eval, generate and export llmc, its weights.
  r = run_gputrain("eval " + (dir / "a") + " --json");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(json_number(r.output, "test_loss").has_value());
  r = run_gputrain("eval " + (dir / "c.yaml"));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--checkpoint PATH is needed (the weights), or give a run directory as CONFIG"));
  CHECK(run_gputrain("check " + (dir / "a")).exit_code == 0);
  // --max-steps trains that many steps even past the config's epochs (2 of 8 steps), and says which limit ends it.
  r = run_gputrain("train " + (dir / "c.yaml") + " --max-steps 30 --no-progress --out " + (dir / "m"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("steps: 30 (train.max_steps; train.epochs lifted)"));
  CHECK(json_number(read_text(dir / "m/summary.json"), "steps") == 30);
  r = run_gputrain("train " + (dir / "c.yaml") + " --max-steps 30 --epochs 2 --no-progress --out " + (dir / "n"));
  CHECK_THAT(r.output, Catch::Contains("steps: 16 — train.epochs ends the run first (train.epochs 2 × 8 steps = 16, "
                                       "train.max_steps 30)"));
  CHECK(json_number(read_text(dir / "n/summary.json"), "steps") == 16);
  // Bare gputrain: the help and examples, exit 0; numeric flags are typed in --help.
  r = run_gputrain("");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("Examples:") && Catch::Contains("gputrain train configs/"));
  r = run_gputrain("train --help");
  CHECK_THAT(r.output,
             Catch::Contains("--max-steps N") && Catch::Contains("--epochs N") && Catch::Contains("--seed N"));
}
