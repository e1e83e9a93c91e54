// train.precision on the CPU: bf16/fp16 products by conversion (ops/precision.h) equal fp32 products of the rounded
// operands and differ from plain fp32 ones; a bf16 or fp16 run trains to within a margin of fp32; the flag, the
// warning and the CUDA refusal.
#include "core/half.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "helpers.h"
#include "ops/matmul.h"
#include "ops/precision.h"

#include <catch2/catch.hpp>

#include <cmath>
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
    // (measured: ≤ 0.27% for bf16, ≤ 0.29% for fp16); not equal, or the mode did nothing.
    CHECK(got.back() < 0.5 * got.front());
    bool differs = false;
    for (size_t i = 0; i < ref.size(); ++i) {
      CHECK(std::fabs(got[i] - ref[i]) <= 0.02 * ref[i]);
      differs = differs || got[i] != ref[i];
    }
    CHECK(differs);
  }
}

TEST_CASE("precision: an unknown train.precision exits 2 naming the choices; tf32 on the CPU is fp32", "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);
  const auto bad = run_gputrain("train " + (dir / "tiny.yaml") + " --precision fp8 --out " + (dir / "bad"));
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("train.precision") != std::string::npos);
  CHECK(bad.output.find("bf16") != std::string::npos);
  const std::string common = "train " + (dir / "tiny.yaml") + " --threads 2 --no-progress --out ";
  REQUIRE(run_gputrain(common + (dir / "fp32")).exit_code == 0);
  const auto tf32 = run_gputrain(common + (dir / "tf32") + " --precision tf32");
  REQUIRE(tf32.exit_code == 0);
  CHECK(tf32.output.find("precision tf32: fp32 on the CPU") != std::string::npos);
  CHECK(losses(read_text(dir / "fp32/metrics.jsonl")) == losses(read_text(dir / "tf32/metrics.jsonl")));
}
