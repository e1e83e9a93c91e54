// train.precision on the CPU: bf16/fp16 products by conversion (ops/precision.h) equal fp32 products of the rounded
// operands and differ from plain fp32 ones; a bf16 or fp16 run trains to within a margin of fp32; the flag, the
// warning and the CUDA refusal.
#include "core/half.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "helpers.h"
#include "ops/math.h"
#include "ops/matmul.h"
#include "ops/optim.h"
#include "ops/precision.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <limits>
#include <regex>
#include <string>
#include <thread>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

Tensor random_tensor(Shape shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::f32);
  Rng rng(seed, 0);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.normal());
  return t;
}

Tensor rounded(const Tensor& t, HalfFormat f) {
  Tensor r = Tensor::empty(t.shape(), DType::f32);
  round_to_half(f, t.data<float>(), r.data<float>(), static_cast<size_t>(t.numel()));
  return r;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return m;
}

// A dense layer's three products: y = x·wᵀ + bias, dW = dyᵀ·x, dx = dy·W, in the calling thread's precision.
struct LinearProducts {
  Tensor y, dw, dx;
};
LinearProducts linear_products(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& dy) {
  LinearProducts r{Tensor::empty(Shape{x.dim(0), w.dim(0)}, DType::f32), Tensor::empty(w.shape(), DType::f32),
                   Tensor::empty(x.shape(), DType::f32)};
  ops::linear_forward(x, w, bias, r.y);
  ops::matmul(dy, true, x, false, r.dw, 0.0);
  ops::matmul(dy, false, w, false, r.dx, 0.0);
  return r;
}

}  // namespace

TEST_CASE("precision: a linear layer's products in bf16/fp16 are fp32 products of the rounded operands", "[cpu]") {
  // 96 rows × 300 inputs → 200 outputs: large enough that the products split over threads and k spans more than one
  // of OpenBLAS's panels (the order of the sums is then the same in both runs, so the results are equal exactly).
  const Tensor x = random_tensor(Shape{96, 300}, 1), w = random_tensor(Shape{200, 300}, 2),
               bias = random_tensor(Shape{200}, 3), dy = random_tensor(Shape{96, 200}, 4);
  const LinearProducts fp32 = linear_products(x, w, bias, dy);
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    const HalfFormat f = *half_format(p);
    INFO(to_string(p));
    LinearProducts half;
    {
      const ProductPrecisionScope autocast(p);
      CHECK(product_precision() == p);
      half = linear_products(x, w, bias, dy);
    }
    CHECK(product_precision() == Precision::fp32);  // the scope ends with its block
    // The bias is added in fp32, as a half GEMM's fp32 epilogue does.
    const LinearProducts reference = linear_products(rounded(x, f), rounded(w, f), bias, rounded(dy, f));
    CHECK(max_abs_diff(half.y, reference.y) == 0);
    CHECK(max_abs_diff(half.dw, reference.dw) == 0);
    CHECK(max_abs_diff(half.dx, reference.dx) == 0);
    // And not fp32: the sums of ~300 products of unit normals are ~17 in size, fp32's rounding of them ~1e-5 (the
    // two differ there only in the order of the sums), while bf16's operands are off by up to 2^-9 relative, fp16's
    // 2^-12, which moves the sums by ~1e-2 and ~1e-3.
    const double expected = p == Precision::bf16 ? 5e-3 : 5e-4;
    CHECK(max_abs_diff(half.y, fp32.y) > expected);
    CHECK(max_abs_diff(half.dw, fp32.dw) > expected);
    CHECK(max_abs_diff(half.dx, fp32.dx) > expected);
    CHECK(max_abs_diff(half.y, fp32.y) < 0.5);  // but near it
  }
  // fp32 and tf32 scopes leave the CPU's products fp32, bit for bit.
  for (Precision p : {Precision::fp32, Precision::tf32}) {
    const ProductPrecisionScope autocast(p);
    const LinearProducts same = linear_products(x, w, bias, dy);
    CHECK(max_abs_diff(same.y, fp32.y) == 0);
    CHECK(max_abs_diff(same.dw, fp32.dw) == 0);
  }
}

TEST_CASE("precision: scopes nest and each thread has its own", "[cpu]") {
  CHECK(product_precision() == Precision::fp32);
  {
    const ProductPrecisionScope outer(Precision::bf16);
    {
      const ProductPrecisionScope inner(Precision::fp16);
      CHECK(product_precision() == Precision::fp16);
    }
    CHECK(product_precision() == Precision::bf16);
    Precision seen = Precision::bf16;
    std::thread([&] { seen = product_precision(); }).join();
    CHECK(seen == Precision::fp32);
  }
  CHECK(product_precision() == Precision::fp32);
}

namespace {

const char* kMlp = R"(name: mlp
seed: 11
device: cpu
data:
  format: synthetic
  samples: 4000
  test_samples: 1000
  input_shape: [20]
  targets: {classes: 4}
  batch_size: 64
model:
  layers:
    - {type: linear, out_features: 64}
    - relu
    - {type: linear, out_features: 4}
loss: cross_entropy
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 3, log_every: 20}
)";

std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  for (const auto& l : lines_of(metrics))
    if (l.find("\"type\": \"train\"") != std::string::npos)
      if (auto v = json_number(l, "loss")) out.push_back(*v);
  return out;
}

}  // namespace

TEST_CASE("precision: bf16 and fp16 runs of an MLP train to within 2% of fp32's losses, and say how they ran",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "mlp.yaml", kMlp);
  const std::string common = "train " + (dir / "mlp.yaml") + " --threads 2 --no-progress --out ";
  const auto fp32 = run_gputrain(common + (dir / "fp32"));
  REQUIRE(fp32.exit_code == 0);
  CHECK(fp32.output.find("by conversion") == std::string::npos);
  const std::vector<double> ref = losses(read_text(dir / "fp32/metrics.jsonl"));
  REQUIRE(ref.size() >= 8);
  for (const char* p : {"bf16", "fp16"}) {
    INFO(p);
    const std::string out = dir / p;
    const auto r = run_gputrain(common + out + " --precision " + p);
    REQUIRE(r.exit_code == 0);
    // One warning, naming the instruction set this CPU lacks (or that it has one gputrain does not use yet).
    const std::regex warning("precision \\w+: matrix products round their operands .*by conversion.*(no|has) AVX");
    const auto n = std::distance(std::sregex_iterator(r.output.begin(), r.output.end(), warning), {});
    CHECK(n == 1);
    CHECK(read_text(out + "/overrides.json").find(std::string("train.precision=") + p) != std::string::npos);
    CHECK(read_text(out + "/config.resolved.yaml").find(std::string("precision: ") + p) != std::string::npos);
    const std::vector<double> got = losses(read_text(out + "/metrics.jsonl"));
    REQUIRE(got.size() == ref.size());
    // Converges as fp32 does: the loss falls by more than half, and each logged loss is within 2% of fp32's
    // (measured: ≤ 0.27% for bf16, ≤ 0.21% for fp16); not equal, or the mode did nothing.
    CHECK(got.back() < 0.5 * got.front());
    bool differs = false;
    for (size_t i = 0; i < ref.size(); ++i) {
      CHECK(std::fabs(got[i] - ref[i]) <= 0.02 * ref[i]);
      differs = differs || got[i] != ref[i];
    }
    CHECK(differs);
  }
}

TEST_CASE("precision: an unknown train.precision exits 2 naming the choices, and tf32 on the CPU is fp32", "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);
  const auto bad = run_gputrain("train " + (dir / "tiny.yaml") + " --precision fp8 --out " + (dir / "bad"));
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("train.precision") != std::string::npos);
  CHECK(bad.output.find("bf16") != std::string::npos);
  const auto bad_scale =
      run_gputrain("check " + (dir / "tiny.yaml") + " --set 'train.loss_scale={init: 1024, bogus: 1}'");
  CHECK(bad_scale.exit_code == 2);
  CHECK(bad_scale.output.find("train.loss_scale.bogus: unknown key") != std::string::npos);
  CHECK(run_gputrain("check " + (dir / "tiny.yaml") + " --set train.loss_scale=-1").exit_code == 2);
  const std::string common = "train " + (dir / "tiny.yaml") + " --threads 2 --no-progress --out ";
  REQUIRE(run_gputrain(common + (dir / "fp32")).exit_code == 0);
  const auto tf32 = run_gputrain(common + (dir / "tf32") + " --precision tf32");
  REQUIRE(tf32.exit_code == 0);
  CHECK(tf32.output.find("precision tf32: fp32 on the CPU") != std::string::npos);
  CHECK(losses(read_text(dir / "fp32/metrics.jsonl")) == losses(read_text(dir / "tf32/metrics.jsonl")));
}

TEST_CASE("loss scaler: GradScaler's exact skip/grow/backoff sequence on injected overflows", "[cpu]") {
  // The device op (CPU backend) on a step's statistics, finite or not, against the sequence worked out by hand:
  // init 2^16, growth ×2 after 3 finite steps in a row, backoff ×0.5 on an Inf or NaN in the loss or the gradients.
  const LossScaleHyper h{.growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3};
  Tensor state = Tensor::zeros(Shape{kLossScaleState}, DType::f64);
  Tensor stats = Tensor::zeros(Shape{kStepStats}, DType::f64);
  double* s = state.data<double>();
  s[kScale] = 65536;
  s[kInvScale] = 1.0 / 65536;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  struct Step {
    double loss_sum, grad_sq;  // what the step's statistics hold
    double scale;              // the scale after it
    double tracker;
  };
  const Step steps[] = {
      {1, 1, 65536, 1},   {1, 1, 65536, 2}, {1, 1, 131072, 0},  // three finite: grow
      {1, inf, 65536, 0},                                       // an overflowing gradient: back off, tracker reset
      {1, 1, 65536, 1},   {1, 1, 65536, 2},                     // two finite
      {1, nan, 32768, 0},                                       // a NaN gradient one short of growing: back off
      {nan, 1, 16384, 0},                                       // a NaN loss: back off again
      {1, 1, 16384, 1},   {1, 1, 16384, 2}, {1, 1, 32768, 0},   // grow
      {1, 1, 32768, 1},
  };
  for (const Step& st : steps) {
    stats.data<double>()[kLossSum] = st.loss_sum;
    stats.data<double>()[kGradSq] = st.grad_sq;
    ops::update_loss_scale(stats, state, h);
    REQUIRE(s[kScale] == st.scale);
    REQUIRE(s[kInvScale] == 1.0 / st.scale);
    REQUIRE(s[kGrowthTracker] == st.tracker);
  }
  // A fixed scale never moves.
  const LossScaleHyper fixed{.dynamic = false};
  stats.data<double>()[kGradSq] = inf;
  ops::update_loss_scale(stats, state, fixed);
  CHECK(s[kScale] == 32768);
}

namespace {

// The MLP in fp16 with a scale far too large for fp16's range (2^40: the scaled loss gradient overflows in the
// backward products' fp16 operands), so the scaler must back off, then grows every 3 finite steps and overflows
// again: skips, growth and backoff all happen within a few dozen steps.
std::string fp16_config(int64_t every_steps) {
  return std::string(kMlp).replace(std::string(kMlp).find("train: {epochs: 3, log_every: 20}"),
                                   std::string("train: {epochs: 3, log_every: 20}").size(),
                                   "train: {epochs: 1, log_every: 1, precision: fp16, loss_scale: {init: "
                                   "1099511627776, growth_interval: 3}}\ncheckpoint: {every_steps: " +
                                       std::to_string(every_steps) + ", keep: 100}");
}

std::vector<double> field(const std::string& metrics, const std::string& key) {
  std::vector<double> out;
  for (const auto& l : lines_of(metrics))
    if (l.find("\"type\": \"train\"") != std::string::npos)
      if (auto v = json_number(l, key)) out.push_back(*v);
  return out;
}

}  // namespace

TEST_CASE(
    "loss scaler: an fp16 run backs off from an overflowing scale, skips those steps, grows, and resumes "
    "bit-identically from mid-way through a growth interval",
    "[e2e]") {
  TempDir dir;
  write_text(dir / "fp16.yaml", fp16_config(5));
  const auto full = run_gputrain("train " + (dir / "fp16.yaml") + " --threads 2 --no-progress --out " + (dir / "full"));
  INFO(full.output);
  REQUIRE(full.exit_code == 0);
  CHECK(full.output.find("gradient overflow at loss scale 1.09951e+12") != std::string::npos);
  const std::string metrics = read_text(dir / "full/metrics.jsonl");
  const std::vector<double> scale = field(metrics, "loss_scale"), skips = field(metrics, "overflow_skips"),
                            loss = field(metrics, "loss");
  // 63 steps (4000 samples, batch 64); a skipped step logs no train row, so the rows are the steps that updated.
  REQUIRE(!skips.empty());
  CHECK(skips.back() + static_cast<double>(scale.size()) <= 63);  // (the last steps may be skips too)
  // The first steps overflow: each halves the scale and counts a skip, until the scaled gradients fit in fp16
  // (measured: 18 skips, 2^40 → 2^22, then 8M overflows every time it grows to it: 30 skips in all).
  CHECK(skips.front() >= 10);
  CHECK(scale.front() < 0x1p30);
  CHECK(skips.back() > skips.front());
  // Growth after 3 finite steps: somewhere the scale doubles from one row to the next, and it backs off again later.
  bool grew = false, backed_off_after_growth = false;
  for (size_t i = 1; i < scale.size(); ++i) {
    if (scale[i] == 2 * scale[i - 1]) grew = true;
    if (grew && scale[i] == scale[i - 1] / 2) backed_off_after_growth = true;
  }
  CHECK(grew);
  CHECK(backed_off_after_growth);
  // Skipped steps did not count against train.nonfinite (abort): the run completed, and still learned.
  for (double l : loss) CHECK(std::isfinite(l));
  CHECK(loss.back() < 0.5 * loss.front());
  const std::string summary = read_text(dir / "full/summary.json");
  CHECK(json_string(summary, "exit_reason") == "completed");
  const std::string last = read_text(dir / "full/checkpoints/step-63/state.json");
  CHECK(json_number(summary, "overflow_skips") == 63 - static_cast<double>(scale.size()));
  CHECK(json_number(summary, "overflow_skips") == json_number(last, "overflow_skips"));
  CHECK(json_number(summary, "loss_scale") == json_number(last, "scale"));

  // A checkpoint mid-way through a growth interval: the scaler's tracker is 1 or 2 there, and a run resumed from it
  // ends bit-identical to the uninterrupted one.
  int64_t cut = -1;
  for (int64_t s = 5; s < 62 && cut < 0; s += 5) {
    const std::string state = read_text(dir / ("full/checkpoints/step-" + std::to_string(s) + "/state.json"));
    const auto tracker = json_number(state, "growth_tracker");
    REQUIRE(tracker);
    if (*tracker == 1 || *tracker == 2) cut = s;
  }
  REQUIRE(cut > 0);
  const std::string run = dir / "cut";
  std::filesystem::copy(dir / "full", run, std::filesystem::copy_options::recursive);
  for (const auto& e : std::filesystem::directory_iterator(run + "/checkpoints"))
    if (const std::string n = e.path().filename().string(); n.rfind("step-", 0) == 0 && std::stoll(n.substr(5)) > cut)
      std::filesystem::remove_all(e.path());
  std::filesystem::remove(run + "/model.safetensors");
  const auto r = run_gputrain("train " + (dir / "fp16.yaml") + " --threads 2 --no-progress --resume auto --out " + run);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("step-" + std::to_string(cut)) != std::string::npos);
  CHECK(read_text(run + "/model.safetensors") == read_text(dir / "full/model.safetensors"));
  CHECK(field(read_text(run + "/metrics.jsonl"), "loss") == loss);
  CHECK(field(read_text(run + "/metrics.jsonl"), "loss_scale") == scale);
  CHECK(field(read_text(run + "/metrics.jsonl"), "overflow_skips") == skips);
}
