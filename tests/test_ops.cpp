// CPU kernels against plain reference loops and hand-computed numbers.
#include "core/parallel.h"
#include "core/rng.h"
#include "helpers.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/batchnorm.h"
#include "ops/conv2d.h"
#include "ops/cpu/isa.h"
#include "ops/dropout.h"
#include "ops/embedding.h"
#include "ops/families.h"
#include "ops/layernorm.h"
#include "ops/loss.h"
#include "ops/math.h"
#include "ops/matmul.h"
#include "ops/optim.h"
#include "ops/pool2d.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

using namespace gt;

namespace {

Tensor filled(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::f32);
  Rng rng(seed, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
  return t;
}

// An f32 tensor of uniform values in [lo, hi) and an f64 one holding the same numbers, for f32-against-f64 tests.
std::pair<Tensor, Tensor> f32_f64_pair(const Shape& s, Rng& rng, double lo, double hi) {
  Tensor f = Tensor::empty(s, DType::f32), g = Tensor::empty(s, DType::f64);
  for (int64_t i = 0; i < f.numel(); ++i)
    g.data<double>()[i] = f.data<float>()[i] = static_cast<float>(rng.uniform(lo, hi));
  return {f, g};
}

// The largest difference between an f32 tensor and its f64 reference, relative to the reference where that is
// above 1.
double worst_rel(const Tensor& f, const Tensor& g) {
  double w = 0;
  for (int64_t i = 0; i < f.numel(); ++i)
    w = std::max(w, std::abs(f.data<float>()[i] - g.data<double>()[i]) / std::max(1.0, std::abs(g.data<double>()[i])));
  return w;
}

// The largest |f − g| / (rtol·|g| + atol) over the elements of an f32 tensor f and an f64 g: ≤ 1 when every element is
// within the tolerance.
double worst_excess(const Tensor& f, const Tensor& g, double rtol, double atol) {
  double w = 0;
  for (int64_t i = 0; i < f.numel(); ++i) {
    const double want = g.data<double>()[i];
    w = std::max(w, std::abs(f.data<float>()[i] - want) / (rtol * std::abs(want) + atol));
  }
  return w;
}

}  // namespace

TEST_CASE("matmul matches a reference loop for every transpose and split", "[cpu]") {
  // Large shapes make the kernel split C across threads by rows or by columns; small ones do not.
  struct Dims {
    int64_t m, n, k;
  };
  const Dims dims[] = {{3, 5, 4}, {128, 512, 96}, {520, 40, 300}, {33, 700, 65}};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Dims& d : dims)
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (double beta : {0.0, 1.0}) {
            const Tensor a = filled(ta ? Shape{d.k, d.m} : Shape{d.m, d.k}, 1);
            const Tensor b = filled(tb ? Shape{d.n, d.k} : Shape{d.k, d.n}, 2);
            Tensor c = filled(Shape{d.m, d.n}, 3);
            const Tensor c0 = c.clone();
            ops::matmul(a, ta, b, tb, c, beta);
            double worst = 0;
            const float *pa = a.data<float>(), *pb = b.data<float>(), *pc0 = c0.data<float>(), *pc = c.data<float>();
            for (int64_t i = 0; i < d.m; ++i)
              for (int64_t j = 0; j < d.n; ++j) {
                double ref = beta * pc0[i * d.n + j];
                for (int64_t p = 0; p < d.k; ++p) {
                  const float av = ta ? pa[p * d.m + i] : pa[i * d.k + p];
                  const float bv = tb ? pb[j * d.k + p] : pb[p * d.n + j];
                  ref += static_cast<double>(av) * bv;
                }
                worst = std::max(worst, std::abs(ref - pc[i * d.n + j]));
              }
            INFO("threads " << threads << " m " << d.m << " n " << d.n << " k " << d.k << " ta " << ta << " tb " << tb
                            << " beta " << beta);
            // f32 accumulation over k ≤ 300 terms of magnitude ≤ 1: 1e-4 leaves a wide margin over rounding.
            CHECK(worst < 1e-4);
          }
  }
  set_num_threads(2);
}

// linear_forward puts the bias into C before the product when k is small (OpenBLAS then adds the whole product to it)
// and after it otherwise: either way the bits of matmul then add_row_bias, for both splits of C over threads, odd
// sizes, f32 and f64, and without a bias the bits of matmul alone.
TEST_CASE("linear_forward gives the bits of matmul then add_row_bias", "[cpu]") {
  struct Dims {
    int64_t m, n, k;
  };
  // Bias first (k ≤ 128) and after (k > 128); rows split (m ≥ n) and columns split; one thread's worth.
  const Dims dims[] = {{1024, 512, 128}, {1001, 129, 127}, {67, 901, 128},
                       {1024, 128, 512}, {77, 1203, 129},  {5, 7, 3}};
  for (DType dtype : {DType::f32, DType::f64})
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (const Dims& d : dims) {
        Rng rng(d.m * 31 + d.n, 1);
        auto random = [&](const Shape& s) {
          Tensor t = Tensor::empty(s, dtype);
          for (int64_t i = 0; i < t.numel(); ++i)
            if (dtype == DType::f32)
              t.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
            else
              t.data<double>()[i] = rng.uniform(-1, 1);
          return t;
        };
        const Tensor x = random(Shape{d.m, d.k}), w = random(Shape{d.n, d.k}), bias = random(Shape{d.n});
        Tensor want = random(Shape{d.m, d.n}), got = random(Shape{d.m, d.n});
        ops::matmul(x, false, w, true, want, 0.0);
        Tensor plain = want.clone();
        ops::add_row_bias(want, bias);
        ops::linear_forward(x, w, bias, got);
        INFO(dtype_name(dtype) << " threads " << threads << " m " << d.m << " n " << d.n << " k " << d.k);
        CHECK(std::memcmp(got.raw(), want.raw(), got.bytes()) == 0);
        ops::linear_forward(x, w, Tensor(), got);
        CHECK(std::memcmp(got.raw(), plain.raw(), got.bytes()) == 0);
      }
    }
  set_num_threads(2);
  const Tensor x = filled(Shape{4, 3}, 1), w = filled(Shape{5, 3}, 2), short_bias = filled(Shape{4}, 3);
  Tensor y = Tensor::empty(Shape{4, 5}, DType::f32);
  CHECK_THROWS_WITH(ops::linear_forward(x, w, short_bias, y), Catch::Contains("bias [4] for [4, 5]"));
}

TEST_CASE("sgd follows torch.optim.SGD's update rule", "[cpu]") {
  // References computed by hand from the update rule in the PyTorch documentation (torch.optim.SGD).
  // The fused group step the optimizer runs, on a group of one row, with a finite step and no clipping.
  auto run = [](float momentum, float dampening, float wd, bool nesterov) {
    Tensor p = Tensor::empty(Shape{1}, DType::f32), g = Tensor::empty(Shape{1}, DType::f32);
    Tensor buf = momentum != 0 ? Tensor::zeros(Shape{1}, DType::f32) : Tensor();
    p.data<float>()[0] = 1.0f;
    g.data<float>()[0] = 0.5f;
    ops::TensorGroup group;
    group.rows.push_back({p, g, buf});
    const Tensor stats = Tensor::zeros(Shape{kStepStats}, DType::f64);
    std::vector<float> trace;
    for (int step = 0; step < 2; ++step) {
      ops::sgd_step_group({0.1f, momentum, dampening, wd, nesterov, step == 0}, group, stats, 0);
      trace.push_back(p.data<float>()[0]);
    }
    return trace;
  };
  SECTION("plain") {
    const auto t = run(0, 0, 0, false);  // p −= 0.1 · 0.5 twice
    CHECK(t[0] == Approx(0.95));
    CHECK(t[1] == Approx(0.90));
  }
  SECTION("momentum with dampening") {
    // step 1: buf = g = 0.5 (no dampening on the first step), p = 0.95
    // step 2: buf = 0.9 · 0.5 + (1 − 0.1) · 0.5 = 0.9, p = 0.95 − 0.09 = 0.86
    const auto t = run(0.9f, 0.1f, 0, false);
    CHECK(t[0] == Approx(0.95));
    CHECK(t[1] == Approx(0.86));
  }
  SECTION("nesterov with weight decay") {
    // step 1: g = 0.5 + 0.01 · 1 = 0.51, buf = 0.51, g = 0.51 + 0.9 · 0.51 = 0.969, p = 0.9031
    // step 2: g = 0.5 + 0.01 · 0.9031 = 0.509031, buf = 0.9 · 0.51 + 0.509031 = 0.968031,
    //         g = 0.509031 + 0.9 · 0.968031 = 1.3802589, p = 0.9031 − 0.13802589 = 0.76507411
    const auto t = run(0.9f, 0, 0.01f, true);
    CHECK(t[0] == Approx(0.9031));
    CHECK(t[1] == Approx(0.76507411));
  }
}

TEST_CASE("activations match their definitions", "[cpu]") {
  Tensor x = Tensor::empty(Shape{4}, DType::f64), y = Tensor::empty(Shape{4}, DType::f64);
  const double xs[] = {-2.0, -0.5, 0.5, 3.0};
  std::copy(xs, xs + 4, x.data<double>());
  ops::activation_forward(Activation::gelu, x, y);
  for (int i = 0; i < 4; ++i) CHECK(y.data<double>()[i] == Approx(xs[i] * 0.5 * std::erfc(-xs[i] / std::sqrt(2.0))));
  // PyTorch's F.gelu(x, approximate='tanh') in float64 (torch 1.13), the GELU of GPT-2 and llm.c.
  const double gelu_tanh[] = {-0.045402305912224938, -0.15428599017485606, 0.34571400982514394, 2.9963626079182268};
  ops::activation_forward(Activation::gelu_tanh, x, y);
  for (int i = 0; i < 4; ++i) CHECK(y.data<double>()[i] == Approx(gelu_tanh[i]).epsilon(1e-14));
  ops::activation_forward(Activation::sigmoid, x, y);
  for (int i = 0; i < 4; ++i) CHECK(y.data<double>()[i] == Approx(1 / (1 + std::exp(-xs[i]))));
  ops::activation_forward(Activation::relu, x, y);
  CHECK(y.data<double>()[0] == 0.0);
  CHECK(y.data<double>()[3] == 3.0);
}

TEST_CASE("philox streams are reproducible and distinct", "[cpu]") {
  Rng a(5, 1), b(5, 1), c(5, 2);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint32_t va = a.next_u32();
    CHECK(va == b.next_u32());
    differs |= va != c.next_u32();
  }
  CHECK(differs);
  // Uniform draws stay in [0, 1) and average near 1/2.
  Rng u(1, 0);
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double v = u.uniform();
    REQUIRE(v >= 0.0);
    REQUIRE(v < 1.0);
    sum += v;
  }
  CHECK(sum / 10000 == Approx(0.5).margin(0.02));
}

TEST_CASE("batch norm keeps PyTorch's running statistics and uses them in evaluation", "[cpu]") {
  // One channel, batch [1, 2, 3, 4]: mean 2.5, biased variance 1.25, unbiased 5/3 (computed by hand).
  Tensor x = Tensor::empty(Shape{4, 1}, DType::f64), y = Tensor::empty(Shape{4, 1}, DType::f64);
  for (int i = 0; i < 4; ++i) x.data<double>()[i] = i + 1;
  Tensor gamma = Tensor::empty(Shape{1}, DType::f64), beta = Tensor::zeros(Shape{1}, DType::f64);
  gamma.data<double>()[0] = 1;
  Tensor rm = Tensor::zeros(Shape{1}, DType::f64), rv = Tensor::empty(Shape{1}, DType::f64);
  rv.data<double>()[0] = 1;
  Tensor sm = Tensor::empty(Shape{1}, DType::f64), si = Tensor::empty(Shape{1}, DType::f64);
  ops::batchnorm_forward(x, gamma, beta, rm, rv, 0.1, 1e-5, true, sm, si, y);
  CHECK(rm.data<double>()[0] == Approx(0.25));
  CHECK(rv.data<double>()[0] == Approx(0.9 + 0.1 * 5.0 / 3.0));
  CHECK(y.data<double>()[0] == Approx(-1.5 / std::sqrt(1.25 + 1e-5)));
  ops::batchnorm_forward(x, gamma, beta, rm, rv, 0.1, 1e-5, false, sm, si, y);
  CHECK(y.data<double>()[0] == Approx((1 - 0.25) / std::sqrt(0.9 + 0.1 * 5.0 / 3.0 + 1e-5)));
  CHECK(rm.data<double>()[0] == Approx(0.25));  // evaluation leaves the statistics alone
}

TEST_CASE("dropout drops about p of the elements, scales the rest, and repeats its mask per step", "[cpu]") {
  const int64_t n = 100000;
  Tensor x = Tensor::empty(Shape{n}, DType::f32), y = Tensor::empty(Shape{n}, DType::f32);
  Tensor y2 = Tensor::empty(Shape{n}, DType::f32), y3 = Tensor::empty(Shape{n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = 1.0f;
  ops::dropout(x, 0.25, 77, 3, y);
  ops::dropout(x, 0.25, 77, 3, y2);
  ops::dropout(x, 0.25, 77, 4, y3);
  int64_t kept = 0, same = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = y.data<float>()[i];
    REQUIRE((v == 0.0f || v == Approx(1 / 0.75)));
    kept += v != 0;
    REQUIRE(v == y2.data<float>()[i]);
    same += v == y3.data<float>()[i];
  }
  CHECK(static_cast<double>(kept) / n == Approx(0.75).margin(0.01));
  CHECK(same < n * 0.7);  // another step draws another mask
}

TEST_CASE("cross entropy without smoothing ignores a -inf logit away from the label, as PyTorch does", "[cpu]") {
  // (1 − ε)(lse − x_y) + ε(lse − Σx/k) with ε = 0 must not compute 0 · ∞; with ε > 0 the loss is +∞ (PyTorch's too).
  Tensor logits = Tensor::empty(Shape{1, 3}, DType::f32), labels = Tensor::empty(Shape{1}, DType::i32);
  logits.data<float>()[0] = 1.0f;
  logits.data<float>()[1] = 2.0f;
  logits.data<float>()[2] = -INFINITY;
  labels.data<int32_t>()[0] = 1;
  Tensor stats = Tensor::zeros(Shape{2}, DType::f64), none;
  ops::cross_entropy(logits, labels, 0.0, 1.0, none, stats);
  CHECK(stats.data<double>()[0] == Approx(std::log(1 + std::exp(-1.0))));
  CHECK(stats.data<double>()[1] == 1);
  Tensor smoothed = Tensor::zeros(Shape{2}, DType::f64);
  ops::cross_entropy(logits, labels, 0.1, 1.0, none, smoothed);
  CHECK(std::isinf(smoothed.data<double>()[0]));
}

TEST_CASE("embedding indices are integers within 1e-3 of a row, and the backward pass honours beta", "[cpu]") {
  CHECK(embedding_row(3.0004f, 10) == 3);
  CHECK(embedding_row(2.9996f, 10) == 3);
  CHECK(embedding_row(0.0f, 10) == 0);
  CHECK(embedding_row(9.0f, 10) == 9);
  CHECK(embedding_row(3.4f, 10) == -1);
  CHECK(embedding_row(10.0f, 10) == -1);
  CHECK(embedding_row(-1.0f, 10) == -1);
  CHECK(embedding_row(-0.0004f, 10) == 0);
  CHECK(embedding_row(NAN, 10) == -1);
  CHECK(embedding_row(1e30, 10) == -1);

  Tensor idx = Tensor::empty(Shape{3}, DType::f32), dy = Tensor::empty(Shape{3, 2}, DType::f32);
  const float ids[] = {1, 0, 1}, grads[] = {1, 2, 3, 4, 5, 6};
  for (int i = 0; i < 3; ++i) idx.data<float>()[i] = ids[i];
  for (int i = 0; i < 6; ++i) dy.data<float>()[i] = grads[i];
  Tensor dw = Tensor::empty(Shape{2, 2}, DType::f32);
  for (int i = 0; i < 4; ++i) dw.data<float>()[i] = 10;
  ops::embedding_backward(idx, dy, dw, 0.5);  // dw ← 0.5·dw + Σ rows
  CHECK(dw.data<float>()[0] == 5 + 3);
  CHECK(dw.data<float>()[1] == 5 + 4);
  CHECK(dw.data<float>()[2] == 5 + 1 + 5);
  CHECK(dw.data<float>()[3] == 5 + 2 + 6);
}

// Causal attention against the textbook definition: the full [T, T] score matrix, −∞ above the diagonal, a softmax
// per row, times v. Then a change to a later token must not reach an earlier output (causality).
// T = 150 spans three query tiles of the blocked CPU kernel (64 rows each), the last one partial.
// d = 3 goes through the kernels' zero-padded copies, d = 16 reads q, k and v in place.
TEST_CASE("causal attention matches softmax(q·kᵀ/√d + mask)·v and never looks ahead", "[cpu]") {
  const int64_t t = GENERATE(5, 150);
  const int64_t d = GENERATE(3, 16);
  const int64_t nb = 2, heads = 2, c = heads * d;
  Tensor qkv = Tensor::empty(Shape{nb, t, 3 * c}, DType::f64);
  Rng rng(11, 0);
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.data<double>()[i] = rng.uniform(-2, 2);
  Tensor out = Tensor::empty(Shape{nb, t, c}, DType::f64), lse = Tensor::empty(Shape{nb, heads, t}, DType::f64);
  ops::attention_forward(qkv, heads, {}, out, lse);
  const double* x = qkv.data<double>();
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> s(t);
        for (int64_t j = 0; j < t; ++j) {
          double dot = 0;
          const double* q = x + (b * t + i) * 3 * c + h * d;
          const double* k = x + (b * t + j) * 3 * c + c + h * d;
          for (int64_t e = 0; e < d; ++e) dot += q[e] * k[e];
          s[j] = j <= i ? dot / std::sqrt(double(d)) : -INFINITY;
        }
        double z = 0;
        for (int64_t j = 0; j < t; ++j) z += std::exp(s[j]);
        CHECK(lse.data<double>()[(b * heads + h) * t + i] == Approx(std::log(z)).epsilon(1e-12));
        for (int64_t e = 0; e < d; ++e) {
          double want = 0;
          for (int64_t j = 0; j < t; ++j) want += std::exp(s[j]) / z * x[(b * t + j) * 3 * c + 2 * c + h * d + e];
          CHECK(out.data<double>()[(b * t + i) * c + h * d + e] == Approx(want).epsilon(1e-12).margin(1e-14));
        }
      }
  // Changing the last token's q, k and v leaves every earlier position's output as it was.
  Tensor later = qkv.clone();
  for (int64_t e = 0; e < 3 * c; ++e) later.data<double>()[(t - 1) * 3 * c + e] += 1.5;
  Tensor out2 = Tensor::empty(out.shape(), DType::f64);
  ops::attention_forward(later, heads, {}, out2, lse);
  for (int64_t i = 0; i < (t - 1) * c; ++i) CHECK(out2.data<double>()[i] == out.data<double>()[i]);
  CHECK(out2.data<double>()[(t - 1) * c] != out.data<double>()[(t - 1) * c]);
  // Without lse (an evaluation's forward): the same outputs bit for bit, f64 and f32.
  for (const DType dtype : {DType::f64, DType::f32}) {
    Tensor x2 = qkv;
    if (dtype == DType::f32) {
      x2 = Tensor::empty(qkv.shape(), DType::f32);
      for (int64_t i = 0; i < qkv.numel(); ++i) x2.data<float>()[i] = static_cast<float>(qkv.data<double>()[i]);
    }
    Tensor with = Tensor::empty(out.shape(), dtype), without = Tensor::empty(out.shape(), dtype),
           l = Tensor::empty(lse.shape(), dtype), none;
    ops::attention_forward(x2, heads, {}, with, l);
    ops::attention_forward(x2, heads, {}, without, none);
    CHECK(std::memcmp(with.raw(), without.raw(), with.bytes()) == 0);
  }
}

// The f32 kernels (8 × 8 register transposes of k and v, the vectorised row maximum) against the f64 ones, which take
// the scalar paths: head sizes with and without a remainder past a multiple of 8, sequence lengths with and without
// one, and scores far beyond exp's range (q, k in ±10: the scores of a row differ by ~100), so that a wrong row
// maximum overflows the exponentials instead of cancelling in the softmax. Tolerances: f32 rounding of scores of
// magnitude ~100 (1e-5 relative) carried through sums of 64 terms.
TEST_CASE("f32 causal attention agrees with f64 on transposed blocks, remainders and large scores", "[cpu]") {
  const int64_t d = GENERATE(8, 12, 32);
  const int64_t t = GENERATE(13, 64);
  const int64_t nb = 2, heads = 2, c = heads * d;
  Rng rng(17, 0);
  auto convert = [](const Tensor& x, DType dt) {  // f32 ↔ f64, element by element
    Tensor y = Tensor::empty(x.shape(), dt);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = x.dtype() == DType::f64 ? x.data<double>()[i] : x.data<float>()[i];
      if (dt == DType::f64)
        y.data<double>()[i] = v;
      else
        y.data<float>()[i] = static_cast<float>(v);
    }
    return y;
  };
  Tensor q64 = Tensor::empty(Shape{nb, t, 3 * c}, DType::f64), g64 = Tensor::empty(Shape{nb, t, c}, DType::f64);
  for (int64_t i = 0; i < q64.numel(); ++i) q64.data<double>()[i] = static_cast<float>(rng.uniform(-10, 10));
  for (int64_t i = 0; i < g64.numel(); ++i) g64.data<double>()[i] = static_cast<float>(rng.uniform(-1, 1));
  const Tensor q32 = convert(q64, DType::f32), g32 = convert(g64, DType::f32);
  struct Result {
    Tensor out, lse, dqkv;
  };
  auto run = [&](const Tensor& qkv, const Tensor& dout) {
    const DType dt = qkv.dtype();
    Result r{Tensor::empty(Shape{nb, t, c}, dt), Tensor::empty(Shape{nb, heads, t}, dt),
             Tensor::empty(qkv.shape(), dt)};
    Tensor delta = Tensor::empty(Shape{nb, heads, t}, dt);
    ops::attention_forward(qkv, heads, {}, r.out, r.lse);
    ops::attention_backward(qkv, r.out, r.lse, dout, heads, {}, delta, r.dqkv);
    return Result{convert(r.out, DType::f64), convert(r.lse, DType::f64), convert(r.dqkv, DType::f64)};
  };
  const Result want = run(q64, g64), got = run(q32, g32);
  auto worst = [](const Tensor& a, const Tensor& b) {
    double w = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double x = a.data<double>()[i], y = b.data<double>()[i];
      w = std::max(w, std::isfinite(y) ? std::abs(x - y) / (1 + std::abs(x)) : INFINITY);
    }
    return w;
  };
  INFO("d " << d << ", t " << t);
  CHECK(worst(want.lse, got.lse) < 1e-5);
  CHECK(worst(want.out, got.out) < 1e-4);
  CHECK(worst(want.dqkv, got.dqkv) < 1e-3);
}

// The backward against central differences of L = Σ out ⊙ w in double, over three query tiles (T = 150), on 300
// seeded elements of q, k and v (every element would take minutes).
TEST_CASE("causal attention's backward matches finite differences across query tiles", "[cpu]") {
  const int64_t d = GENERATE(4, 16);  // padded copies, and in place
  const int64_t nb = 1, t = 150, heads = 2, c = heads * d;
  Rng rng(12, 0);
  Tensor qkv = Tensor::empty(Shape{nb, t, 3 * c}, DType::f64), w = Tensor::empty(Shape{nb, t, c}, DType::f64);
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.data<double>()[i] = rng.uniform(-1, 1);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<double>()[i] = rng.uniform(-1, 1);
  Tensor out = Tensor::empty(Shape{nb, t, c}, DType::f64), lse = Tensor::empty(Shape{nb, heads, t}, DType::f64);
  auto loss = [&](const Tensor& x) {
    ops::attention_forward(x, heads, {}, out, lse);
    double s = 0;
    for (int64_t i = 0; i < out.numel(); ++i) s += out.data<double>()[i] * w.data<double>()[i];
    return s;
  };
  loss(qkv);
  Tensor delta = Tensor::empty(Shape{nb, heads, t}, DType::f64), dqkv = Tensor::empty(qkv.shape(), DType::f64);
  const Tensor out0 = out.clone(), lse0 = lse.clone();
  ops::attention_backward(qkv, out0, lse0, w, heads, {}, delta, dqkv);
  for (int k = 0; k < 300; ++k) {
    const int64_t i = static_cast<int64_t>(rng.uniform(0, 1) * static_cast<double>(qkv.numel())) % qkv.numel();
    Tensor x = qkv.clone();
    const double h = 1e-5;
    x.data<double>()[i] += h;
    const double up = loss(x);
    x.data<double>()[i] -= 2 * h;
    const double down = loss(x);
    INFO("element " << i);
    CHECK(dqkv.data<double>()[i] == Approx((up - down) / (2 * h)).margin(1e-7));
  }
}

// Attention dropout against a naive reference: the [T, T] probabilities materialised, the mask spelled out from
// dropout_keep at ((b·H + h)·T + i)·T + j, and the backward from the softmax's Jacobian (Σ_k P_ik dP_ik, not the
// kernel's dout·out shortcut). T = 70 spans two query tiles of the CPU kernel; f64 and f32; head sizes 3 and 16.
TEST_CASE("causal attention with dropout matches a reference with the mask spelled out", "[cpu]") {
  const DType dtype = GENERATE(DType::f64, DType::f32);
  const int64_t d = GENERATE(3, 16);  // through padded copies, and in place
  const int64_t nb = 2, t = 70, heads = 2, c = heads * d;
  const double p = 0.3;
  const ops::AttentionDropout drop{p, 0x5eed, 9};
  Rng rng(13, 0);
  auto make = [&](const Shape& s, std::vector<double>& vals) {
    Tensor x = Tensor::empty(s, dtype);
    vals.resize(static_cast<size_t>(x.numel()));
    for (int64_t i = 0; i < x.numel(); ++i) {
      // Values exact in f32, so both dtypes start from the same numbers.
      vals[i] = static_cast<float>(rng.uniform(-2, 2));
      if (dtype == DType::f64)
        x.data<double>()[i] = vals[i];
      else
        x.data<float>()[i] = static_cast<float>(vals[i]);
    }
    return x;
  };
  auto at = [](const Tensor& x, int64_t i) {
    return x.dtype() == DType::f64 ? x.data<double>()[i] : double(x.data<float>()[i]);
  };
  std::vector<double> x, g;
  const Tensor qkv = make(Shape{nb, t, 3 * c}, x), dout = make(Shape{nb, t, c}, g);
  Tensor out = Tensor::empty(Shape{nb, t, c}, dtype), lse = Tensor::empty(Shape{nb, heads, t}, dtype);
  Tensor delta = Tensor::empty(lse.shape(), dtype), dqkv = Tensor::empty(qkv.shape(), dtype);
  ops::attention_forward(qkv, heads, drop, out, lse);
  ops::attention_backward(qkv, out, lse, dout, heads, drop, delta, dqkv);

  std::vector<double> want_out(static_cast<size_t>(out.numel())), want_dx(static_cast<size_t>(qkv.numel()), 0.0);
  int64_t kept = 0, pairs = 0;
  const double scale = 1 / std::sqrt(double(d));
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      auto q = [&](int64_t i, int64_t e) { return (b * t + i) * 3 * c + h * d + e; };  // index of q_i[e] in qkv
      auto k = [&](int64_t j, int64_t e) { return q(j, e) + c; };
      auto v = [&](int64_t j, int64_t e) { return q(j, e) + 2 * c; };
      auto o = [&](int64_t i, int64_t e) { return (b * t + i) * c + h * d + e; };
      std::vector<double> pm(t * t, 0.0), mask(t * t, 0.0);  // P and keep/(1 − p), row i, column j ≤ i
      for (int64_t i = 0; i < t; ++i) {
        double mx = -INFINITY, z = 0;
        std::vector<double> s(i + 1);
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < d; ++e) s[j] += x[q(i, e)] * x[k(j, e)] * scale;
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j <= i; ++j) z += std::exp(s[j] - mx);
        CHECK(at(lse, (b * heads + h) * t + i) == Approx(mx + std::log(z)).epsilon(1e-5));
        for (int64_t j = 0; j <= i; ++j) {
          pm[i * t + j] = std::exp(s[j] - mx) / z;
          const uint64_t index = static_cast<uint64_t>(((b * heads + h) * t + i) * t + j);
          const bool keep = dropout_keep(drop.key, drop.step, index, p);
          mask[i * t + j] = keep ? 1 / (1 - p) : 0;
          kept += keep;
          ++pairs;
        }
        for (int64_t e = 0; e < d; ++e)
          for (int64_t j = 0; j <= i; ++j) want_out[o(i, e)] += mask[i * t + j] * pm[i * t + j] * x[v(j, e)];
      }
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> dp(i + 1, 0.0);  // dL/dP_ij = m_ij dout_i·v_j
        double sum_pdp = 0;
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < d; ++e) dp[j] += mask[i * t + j] * g[o(i, e)] * x[v(j, e)];
          sum_pdp += pm[i * t + j] * dp[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = pm[i * t + j] * (dp[j] - sum_pdp) * scale;  // dL/d(q_i·k_j)
          for (int64_t e = 0; e < d; ++e) {
            want_dx[q(i, e)] += ds * x[k(j, e)];
            want_dx[k(j, e)] += ds * x[q(i, e)];
            want_dx[v(j, e)] += mask[i * t + j] * pm[i * t + j] * g[o(i, e)];
          }
        }
      }
    }
  // The mask really drops about p of the pairs (4970 of them: 0.3 ± 0.02 is over 3 standard deviations).
  CHECK(double(kept) / double(pairs) == Approx(1 - p).margin(0.02));
  // f32: P rounded to f32 before it is scaled and multiplied, sums of ≤ 70 terms of magnitude ≤ ~3.
  const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
  INFO("dtype " << (dtype == DType::f64 ? "f64" : "f32"));
  for (int64_t i = 0; i < out.numel(); ++i) {
    INFO("out[" << i << "]");
    REQUIRE(at(out, i) == Approx(want_out[i]).margin(tol));
  }
  for (int64_t i = 0; i < dqkv.numel(); ++i) {
    INFO("dqkv[" << i << "]");
    REQUIRE(at(dqkv, i) == Approx(want_dx[i]).margin(tol));
  }
  // Another step draws another mask; p = 0 is the attention without dropout, bit for bit.
  Tensor other = Tensor::empty(out.shape(), dtype), plain = Tensor::empty(out.shape(), dtype);
  ops::attention_forward(qkv, heads, {p, drop.key, drop.step + 1}, other, lse);
  int64_t differ = 0;
  for (int64_t i = 0; i < out.numel(); ++i) differ += at(other, i) != at(out, i);
  CHECK(differ > out.numel() / 2);
  ops::attention_forward(qkv, heads, {}, plain, lse);
  ops::attention_forward(qkv, heads, {0.0, drop.key, drop.step}, other, lse);
  for (int64_t i = 0; i < out.numel(); ++i) REQUIRE(at(other, i) == at(plain, i));
  CHECK_THROWS_WITH(ops::attention_forward(qkv, heads, {1.0, 1, 1}, other, lse), Catch::Contains("[0, 1)"));
}

// Decoding computes the forward's rows for the new positions only, from a cache whose rows past them are not read.
TEST_CASE("attention decoding gives the forward rows of the new positions, bit for bit", "[cpu]") {
  const int64_t nb = 2, t = 7, heads = 3, d = 2, c = heads * d;
  Tensor qkv = Tensor::empty(Shape{nb, t, 3 * c}, DType::f32);
  Rng rng(12, 0);
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.data<float>()[i] = static_cast<float>(rng.uniform(-2, 2));
  Tensor out = Tensor::empty(Shape{nb, t, c}, DType::f32), lse = Tensor::empty(Shape{nb, heads, t}, DType::f32);
  ops::attention_forward(qkv, heads, {}, out, lse);
  for (const auto& [first, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 7}, {0, 1}, {3, 1}, {2, 4}, {6, 1}}) {
    INFO("rows [" << first << ", " << first + n << ")");
    Tensor cache = qkv.clone();  // rows past the new ones are garbage a decoder has not written yet
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t e = (first + n) * 3 * c; e < t * 3 * c; ++e) cache.data<float>()[b * t * 3 * c + e] = NAN;
    Tensor rows = Tensor::empty(Shape{nb, n, c}, DType::f32);
    ops::attention_decode(cache, heads, first, rows);
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t i = 0; i < n * c; ++i)
        REQUIRE(rows.data<float>()[b * n * c + i] == out.data<float>()[(b * t + first) * c + i]);
  }
  Tensor too_far = Tensor::empty(Shape{nb, 2, c}, DType::f32);
  CHECK_THROWS_WITH(ops::attention_decode(qkv, heads, 6, too_far), Catch::Contains("do not fit"));
}

// The f32 GELU (tanh) has its own vectorised loop with its own exp: forward and backward against the f64 path over
// [−30, 30] (where the exp's argument reaches the clamp at both ends), NaN and ±Inf included.
TEST_CASE("f32 gelu tanh matches the f64 formula to a few ulp, forward and backward", "[cpu]") {
  const int64_t n = 60001;
  Tensor x = Tensor::empty(Shape{n + 3}, DType::f32), xd = Tensor::empty(Shape{n + 3}, DType::f64);
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = static_cast<float>(-30.0 + 60.0 * i / (n - 1));
  x.data<float>()[n] = NAN;
  x.data<float>()[n + 1] = INFINITY;
  x.data<float>()[n + 2] = 0.0f;
  for (int64_t i = 0; i < n + 3; ++i) xd.data<double>()[i] = x.data<float>()[i];
  Tensor y = Tensor::empty(x.shape(), DType::f32), yd = Tensor::empty(x.shape(), DType::f64);
  ops::activation_forward(Activation::gelu_tanh, x, y);
  ops::activation_forward(Activation::gelu_tanh, xd, yd);
  Tensor dy = Tensor::empty(x.shape(), DType::f32), dyd = Tensor::empty(x.shape(), DType::f64);
  for (int64_t i = 0; i < n + 3; ++i) dyd.data<double>()[i] = dy.data<float>()[i] = 1.0f + 0.001f * (i % 7);
  Tensor dx = Tensor::empty(x.shape(), DType::f32), dxd = Tensor::empty(x.shape(), DType::f64);
  ops::activation_backward(Activation::gelu_tanh, x, y, dy, dx);
  ops::activation_backward(Activation::gelu_tanh, xd, yd, dyd, dxd);
  double worst_y = 0, worst_dx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = yd.data<double>()[i], wantdx = dxd.data<double>()[i];
    // Relative to the value, or to 1e-3 below it: for x < −4 the output is a sliver of e^−(the cubic) whose f32
    // argument alone carries ~1e-5 relative rounding (std::exp in f32 does no better); its absolute error is tiny.
    worst_y = std::max(worst_y, std::abs(y.data<float>()[i] - want) / std::max(std::abs(want), 1e-3));
    worst_dx = std::max(worst_dx, std::abs(dx.data<float>()[i] - wantdx) / std::max(std::abs(wantdx), 1e-3));
  }
  INFO("worst relative error: forward " << worst_y << ", backward " << worst_dx);
  CHECK(worst_y < 2e-6);
  // dx crosses zero near x = −0.75, where s and 2xs(1−s)u' cancel: the f32 formula with std::exp loses 3.4e-5 there
  // (measured), so this bounds the same.
  CHECK(worst_dx < 5e-5);
  CHECK(std::isnan(y.data<float>()[n]));
  CHECK(std::isnan(dx.data<float>()[n]));
  CHECK(y.data<float>()[n + 1] == INFINITY);
  CHECK(y.data<float>()[n + 2] == 0.0f);
}

// The f32 GELU loops run two vectors at a time and the last few elements one by one: an element must come out with
// the same bits whichever part of the loop computes it (a 1-element call takes the scalar part), in place, and on 1
// or 2 threads (2 split the odd length off the vector grid), so results never depend on where a tensor starts.
TEST_CASE("f32 gelu tanh gives an element the same bits in its vector loop, its scalar tail and in place", "[cpu]") {
  const int64_t n = 100003;
  Tensor x = Tensor::empty(Shape{n}, DType::f32), dy = Tensor::empty(Shape{n}, DType::f32);
  Rng rng(7, 1);
  for (int64_t i = 0; i < n; ++i) {
    x.data<float>()[i] = static_cast<float>(rng.uniform(-12, 12));
    dy.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
  }
  const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-30f, -87.5f, 88.5f, -200.0f, 200.0f};
  for (size_t k = 0; k < std::size(special); ++k) x.data<float>()[100 + 37 * static_cast<int64_t>(k)] = special[k];
  auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
  Tensor y1, dx1;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor y = Tensor::empty(x.shape(), DType::f32), dx = Tensor::empty(x.shape(), DType::f32);
    ops::activation_forward(Activation::gelu_tanh, x, y);
    ops::activation_backward(Activation::gelu_tanh, x, y, dy, dx);
    Tensor in_place = x.clone(), d_in_place = dy.clone();
    ops::activation_forward(Activation::gelu_tanh, in_place, in_place);
    ops::activation_backward(Activation::gelu_tanh, x, y, d_in_place, d_in_place);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i)
      differ += bits(in_place.data<float>()[i]) != bits(y.data<float>()[i]) ||
                bits(d_in_place.data<float>()[i]) != bits(dx.data<float>()[i]);
    INFO("threads " << threads);
    CHECK(differ == 0);
    if (threads == 1) {
      y1 = y;
      dx1 = dx;
      continue;
    }
    differ = 0;
    for (int64_t i = 0; i < n; ++i)
      differ += bits(y.data<float>()[i]) != bits(y1.data<float>()[i]) ||
                bits(dx.data<float>()[i]) != bits(dx1.data<float>()[i]);
    CHECK(differ == 0);
  }
  // Every 7th element (and every special value) alone, through the scalar tail.
  Tensor one = Tensor::empty(Shape{1}, DType::f32), one_y = Tensor::empty(Shape{1}, DType::f32),
         one_dy = Tensor::empty(Shape{1}, DType::f32), one_dx = Tensor::empty(Shape{1}, DType::f32);
  int64_t differ = 0, checked = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 7 != 0 && !(i >= 100 && i < 100 + 37 * 10 && (i - 100) % 37 == 0)) continue;
    one.data<float>()[0] = x.data<float>()[i];
    one_dy.data<float>()[0] = dy.data<float>()[i];
    ops::activation_forward(Activation::gelu_tanh, one, one_y);
    ops::activation_backward(Activation::gelu_tanh, one, one_y, one_dy, one_dx);
    differ += bits(one_y.data<float>()[0]) != bits(y1.data<float>()[i]) ||
              bits(one_dx.data<float>()[0]) != bits(dx1.data<float>()[i]);
    ++checked;
  }
  INFO(checked << " elements alone");
  CHECK(differ == 0);
  CHECK(checked > n / 7);
}

// The f32 cross-entropy computes each row's exponentials once in f32 (vectorised); against the f64 path on random
// logits, and a NaN or infinite logit still makes its row's loss NaN.
TEST_CASE("f32 cross_entropy matches f64 and keeps NaN and infinite logits NaN", "[cpu]") {
  const int64_t b = 37, k = 300;
  Rng rng(21, 0);
  Tensor x = Tensor::empty(Shape{b, k}, DType::f32), xd = Tensor::empty(Shape{b, k}, DType::f64);
  Tensor y = Tensor::empty(Shape{b}, DType::i32);
  for (int64_t i = 0; i < b * k; ++i)
    xd.data<double>()[i] = x.data<float>()[i] = static_cast<float>(rng.uniform(-8, 8));
  for (int64_t i = 0; i < b; ++i) y.data<int32_t>()[i] = static_cast<int32_t>(rng.below(k));
  for (const double eps : {0.0, 0.1}) {
    Tensor d = Tensor::empty(x.shape(), DType::f32), dd = Tensor::empty(x.shape(), DType::f64);
    Tensor s = Tensor::zeros(Shape{2}, DType::f64), sd = Tensor::zeros(Shape{2}, DType::f64);
    ops::cross_entropy(x, y, eps, 1.0 / b, d, s);
    ops::cross_entropy(xd, y, eps, 1.0 / b, dd, sd);
    CHECK(s.data<double>()[0] == Approx(sd.data<double>()[0]).epsilon(1e-6));
    CHECK(s.data<double>()[1] == sd.data<double>()[1]);
    double worst = 0;
    for (int64_t i = 0; i < b * k; ++i) worst = std::max(worst, std::abs(d.data<float>()[i] - dd.data<double>()[i]));
    CHECK(worst < 1e-7);
  }
  for (const float bad : {NAN, INFINITY}) {
    Tensor z = x.clone();
    z.data<float>()[5 * k + 7] = bad;
    Tensor d = Tensor::empty(x.shape(), DType::f32), s = Tensor::zeros(Shape{2}, DType::f64);
    ops::cross_entropy(z, y, 0.0, 1.0 / b, d, s);
    CHECK(std::isnan(s.data<double>()[0]));
  }
  // The prediction (a hit when it is the label): the first position of the largest logit, as a loop keeping x[j] when
  // x[j] > the running maximum finds it (the f64 path's loop; the f32 path compares in sixteen lanes): ties, −0 against
  // +0, NaN skipped — or, when x[0] is NaN, position 0 — on a row of 40 (two blocks of 16 and a tail).
  const int64_t kr = 40;
  const std::vector<std::vector<std::pair<int64_t, float>>> rows = {
      {{3, 2.0f}, {20, 2.0f}, {39, 2.0f}},  // a three-way tie: 3
      {{17, 5.0f}, {1, 5.0f}},              // a tie across blocks: 1
      {{0, -0.0f}, {9, 0.0f}},              // −0 first, +0 later: 0
      {{5, NAN}, {30, 1.0f}},               // NaN skipped: 30
      {{0, NAN}, {30, 1.0f}},               // NaN first: 0
      {{39, 3.0f}},                         // in the tail: 39
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    Tensor z = Tensor::empty(Shape{1, kr}, DType::f32), zd = Tensor::empty(Shape{1, kr}, DType::f64);
    for (int64_t j = 0; j < kr; ++j) zd.data<double>()[j] = z.data<float>()[j] = -1.0f;  // the others: below all
    for (const auto& [j, v] : rows[r]) zd.data<double>()[j] = z.data<float>()[j] = v;
    for (int64_t label = 0; label < kr; ++label) {
      INFO("row " << r << " label " << label);
      Tensor yl = Tensor::empty(Shape{1}, DType::i32), none;
      yl.data<int32_t>()[0] = static_cast<int32_t>(label);
      Tensor s = Tensor::zeros(Shape{2}, DType::f64), sd = Tensor::zeros(Shape{2}, DType::f64);
      ops::cross_entropy(z, yl, 0.0, 1.0, none, s);
      ops::cross_entropy(zd, yl, 0.0, 1.0, none, sd);
      CHECK(s.data<double>()[1] == sd.data<double>()[1]);
    }
  }
}

// A label outside [0, K) that is not ignore_index (ops/loss.h): its row's loss is NaN, it counts no hit and its
// gradient is the softmax alone, in f32 and f64 — no read or write outside the row (the sanitizer build checks).
TEST_CASE("cross_entropy makes a label out of range a NaN loss without a hit or a target term", "[cpu]") {
  const int64_t b = 4, k = 19;
  Rng rng(23, 0);
  Tensor x = Tensor::empty(Shape{b, k}, DType::f32), xd = Tensor::empty(Shape{b, k}, DType::f64);
  for (int64_t i = 0; i < b * k; ++i)
    xd.data<double>()[i] = x.data<float>()[i] = static_cast<float>(rng.uniform(-3, 3));
  Tensor y = Tensor::empty(Shape{b}, DType::i32);
  for (int64_t i = 0; i < b; ++i) {  // every row's label is its argmax: a hit when in range
    int64_t arg = 0;
    for (int64_t j = 1; j < k; ++j) arg = x.data<float>()[i * k + j] > x.data<float>()[i * k + arg] ? j : arg;
    y.data<int32_t>()[i] = static_cast<int32_t>(arg);
  }
  y.data<int32_t>()[0] = -1;
  y.data<int32_t>()[3] = static_cast<int32_t>(k);
  for (const bool f64 : {false, true}) {
    INFO((f64 ? "f64" : "f32"));
    const Tensor& in = f64 ? xd : x;
    Tensor d = Tensor::empty(in.shape(), in.dtype()), s = Tensor::zeros(Shape{2}, DType::f64);
    ops::cross_entropy(in, y, 0.0, 0.5, d, s, {.group = 1, .ignore_index = -100});
    CHECK(std::isnan(s.data<double>()[0]));
    CHECK(s.data<double>()[1] == 2);  // rows 1 and 2
    for (const int64_t row : {int64_t{0}, int64_t{3}}) {
      double sum = 0, lo = 1;
      for (int64_t j = 0; j < k; ++j) {
        const double g = f64 ? d.data<double>()[row * k + j] : d.data<float>()[row * k + j];
        sum += g, lo = std::min(lo, g);
      }
      CHECK(sum == Approx(0.5).epsilon(1e-6));  // 0.5 · Σ softmax, no −0.5 at a label
      CHECK(lo > 0);
    }
  }
}

// The f32 layer norm (row sums as eight interleaved partial sums, loops compiled per instruction set) against the f64
// path, with row lengths below, at and past one vector, rows split over two threads, offset and scaled rows (the
// variance from x − mean, not E[x²] − mean²), and the parameter gradients both written and accumulated (beta).
TEST_CASE("f32 layernorm matches f64 forward and backward, written and accumulated", "[cpu]") {
  set_num_threads(2);
  // Rows shorter than one vector (7: the f32 kernel's tails alone), of exactly one (16) and of vectors plus a tail.
  const int64_t rows = 203, d = GENERATE(7, 16, 45);
  CAPTURE(d);
  Rng rng(5, 0);
  auto pair = [&](const Shape& s, double lo, double hi) { return f32_f64_pair(s, rng, lo, hi); };
  auto [x, xd] = pair(Shape{rows, d}, -1, 1);
  for (int64_t i = 0; i < rows * d; ++i)  // rows centred far from zero, at different scales
    xd.data<double>()[i] = x.data<float>()[i] = x.data<float>()[i] * static_cast<float>(1 + i / d % 5) + 30.0f;
  auto [gamma, gammad] = pair(Shape{d}, 0.5, 1.5);
  auto [beta, betad] = pair(Shape{d}, -0.2, 0.2);
  auto [dy, dyd] = pair(Shape{rows, d}, -1, 1);
  auto [dg, dgd] = pair(Shape{d}, -1, 1);
  auto [db, dbd] = pair(Shape{d}, -1, 1);
  Tensor y = Tensor::empty(x.shape(), DType::f32), yd = Tensor::empty(x.shape(), DType::f64);
  Tensor m = Tensor::empty(Shape{rows}, DType::f32), md = Tensor::empty(Shape{rows}, DType::f64);
  Tensor v = Tensor::empty(Shape{rows}, DType::f32), vd = Tensor::empty(Shape{rows}, DType::f64);
  ops::layernorm_forward(x, gamma, beta, 1e-5, m, v, y);
  ops::layernorm_forward(xd, gammad, betad, 1e-5, md, vd, yd);
  // The f32 kernel's element-wise arithmetic is f32 (its sums are f64): y within a few ulp of the f64 formula rounded
  // once — the tolerance test_cuda_ops.cpp allows between the CUDA kernel (all f64) and this one.
  CHECK(worst_excess(y, yd, 1e-6, 1e-6) <= 1);
  CHECK(worst_rel(m, md) < 1e-6);
  double worst_def = 0;  // the f64 path against the definition, written out
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = xd.data<double>() + r * d;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += row[i] / d;
    for (int64_t i = 0; i < d; ++i) var += (row[i] - mean) * (row[i] - mean) / d;
    for (int64_t i = 0; i < d; ++i) {
      const double want = (row[i] - mean) / std::sqrt(var + 1e-5) * gammad.data<double>()[i] + betad.data<double>()[i];
      worst_def = std::max(worst_def, std::abs(yd.data<double>()[r * d + i] - want));
    }
  }
  CHECK(worst_def < 1e-12);
  Tensor dx = Tensor::empty(x.shape(), DType::f32), dxd = Tensor::empty(x.shape(), DType::f64);
  ops::layernorm_backward(x, gamma, m, v, dy, dx, dg, db, 1.0);  // accumulate onto the random dγ, dβ
  ops::layernorm_backward(xd, gammad, md, vd, dyd, dxd, dgd, dbd, 1.0);
  CHECK(worst_rel(dx, dxd) < 2e-5);
  {  // against f64 from the f32 kernel's own saved statistics, as the CUDA test compares dx: rtol and atol 1e-5
    Tensor m64 = Tensor::empty(Shape{rows}, DType::f64), v64 = Tensor::empty(Shape{rows}, DType::f64);
    for (int64_t r = 0; r < rows; ++r) {
      m64.data<double>()[r] = m.data<float>()[r];
      v64.data<double>()[r] = v.data<float>()[r];
    }
    Tensor dx64 = Tensor::empty(x.shape(), DType::f64), dg64 = dgd.clone(), db64 = dbd.clone();
    ops::layernorm_backward(xd, gammad, m64, v64, dyd, dx64, dg64, db64, 0.0);
    CHECK(worst_excess(dx, dx64, 1e-5, 1e-5) <= 1);
  }
  CHECK(worst_rel(dg, dgd) < 2e-5);
  CHECK(worst_rel(db, dbd) < 2e-5);
  Tensor none;
  ops::layernorm_backward(x, gamma, m, v, dy, none, dg, db, 0.0);  // overwrite, no dx
  ops::layernorm_backward(xd, gammad, md, vd, dyd, none, dgd, dbd, 0.0);
  CHECK(worst_rel(dg, dgd) < 2e-5);
  CHECK(worst_rel(db, dbd) < 2e-5);
}

// The f32 attention (its loops compiled per instruction set, exp_f32) against the f64 path, forward and backward,
// with the head size padded (d = 24) and read in place (d = 32), over two query tiles; with AVX2's register blocks
// and, where the CPU runs them, AVX-512's (8 rows of 64-byte vectors).
TEST_CASE("f32 causal attention matches f64, forward and backward", "[cpu]") {
  const int64_t d = GENERATE(24, 32);
  const bool narrow = GENERATE(false, true);
  CAPTURE(d, narrow);
  cpu::force_attention_narrow(narrow);
  struct Reset {
    ~Reset() { cpu::force_attention_narrow(false); }
  } reset;
  const int64_t nb = 2, t = 100, heads = 2, c = heads * d;
  Rng rng(31, 0);
  auto pair = [&](const Shape& s) { return f32_f64_pair(s, rng, -1.5, 1.5); };
  auto [qkv, qkvd] = pair(Shape{nb, t, 3 * c});
  auto [dout, doutd] = pair(Shape{nb, t, c});
  Tensor out = Tensor::empty(Shape{nb, t, c}, DType::f32), outd = Tensor::empty(Shape{nb, t, c}, DType::f64);
  Tensor lse = Tensor::empty(Shape{nb, heads, t}, DType::f32), lsed = Tensor::empty(Shape{nb, heads, t}, DType::f64);
  ops::attention_forward(qkv, heads, {}, out, lse);
  ops::attention_forward(qkvd, heads, {}, outd, lsed);
  CHECK(worst_rel(out, outd) < 1e-5);
  CHECK(worst_rel(lse, lsed) < 1e-5);
  Tensor delta = Tensor::empty(lse.shape(), DType::f32), deltad = Tensor::empty(lse.shape(), DType::f64);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::f32), dqkvd = Tensor::empty(qkv.shape(), DType::f64);
  ops::attention_backward(qkv, out, lse, dout, heads, {}, delta, dqkv);
  ops::attention_backward(qkvd, outd, lsed, doutd, heads, {}, deltad, dqkvd);
  CHECK(worst_rel(dqkv, dqkvd) < 1e-4);
}

// WorkPile deals each thread the share parallel_for would give it and lets a thread with none left take another's
// last item: one thread playing both parts shows the order, a team of threads that no item is lost or done twice.
TEST_CASE("WorkPile: a thread takes its own items from the front, then others' from the back, each item once",
          "[cpu]") {
  WorkPile pile(2);
  pile.deal(0, 2, 10);  // [0, 5)
  pile.deal(1, 2, 10);  // [5, 10)
  std::vector<int64_t> taken;
  for (int i = 0; i < 6; ++i) taken.push_back(pile.take(0));
  CHECK(taken == std::vector<int64_t>{0, 1, 2, 3, 4, 9});
  taken.clear();
  for (int i = 0; i < 5; ++i) taken.push_back(pile.take(1));
  CHECK(taken == std::vector<int64_t>{5, 6, 7, 8, -1});
  CHECK(pile.take(0) == -1);

  for (const int threads : {1, 2, 3, 4})
    for (const int64_t n : {0, 1, 3, 7, 1000}) {
      CAPTURE(threads, n);
      std::vector<int> count(static_cast<size_t>(n), 0);
      WorkPile team_pile(threads);
#pragma omp parallel num_threads(threads)
      {
        const int t = omp_get_thread_num(), size = omp_get_num_threads();
        team_pile.deal(t, size, n);
#pragma omp barrier
        for (int64_t i = team_pile.take(t); i >= 0; i = team_pile.take(t)) {
#pragma omp atomic
          ++count[static_cast<size_t>(i)];
        }
      }
      CHECK(std::count(count.begin(), count.end(), 1) == n);  // each taken once
    }
}

// Threads take (batch, head) tasks from their own share, then from others' (parallel_for_stealing): each task writes
// only its own rows, so 1, 2 and 3 threads give the same bits, forward and backward.
TEST_CASE("f32 causal attention gives the same bits on any number of threads", "[cpu]") {
  const int64_t nb = 5, t = 70, heads = 3, d = 16, c = heads * d;
  Rng rng(41, 0);
  auto [qkv, unused_q] = f32_f64_pair(Shape{nb, t, 3 * c}, rng, -1.5, 1.5);
  auto [dout, unused_d] = f32_f64_pair(Shape{nb, t, c}, rng, -1, 1);
  std::vector<std::vector<float>> results;
  for (const int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor out = Tensor::empty(Shape{nb, t, c}, DType::f32), lse = Tensor::empty(Shape{nb, heads, t}, DType::f32);
    Tensor delta = Tensor::empty(lse.shape(), DType::f32), dqkv = Tensor::empty(qkv.shape(), DType::f32);
    ops::attention_forward(qkv, heads, {}, out, lse);
    ops::attention_backward(qkv, out, lse, dout, heads, {}, delta, dqkv);
    std::vector<float> all(out.data<float>(), out.data<float>() + out.numel());
    all.insert(all.end(), dqkv.data<float>(), dqkv.data<float>() + dqkv.numel());
    results.push_back(std::move(all));
  }
  set_num_threads(2);
  for (size_t k = 1; k < results.size(); ++k) CHECK(test::bit_differences(results[0], results[k]) == 0);
}

// Batch norm's f32 loops (row sums as sixteen lanes, compiled per instruction set) against the f64 path, over rows
// shorter than a vector, with a remainder and long, on data centred far from zero: training and evaluation, dx written
// and the parameter gradients accumulated or overwritten.
TEST_CASE("f32 batch norm matches f64 forward and backward for every row length", "[cpu]") {
  set_num_threads(2);
  Rng rng(11, 0);
  auto pair = [&](const Shape& s, double lo, double hi) { return f32_f64_pair(s, rng, lo, hi); };
  for (int64_t sp : {1, 7, 16, 49, 197}) {
    CAPTURE(sp);
    const int64_t batch = 37, ch = 5;
    auto [x, xd] = pair(Shape{batch, ch, sp}, -1, 1);
    for (int64_t i = 0; i < x.numel(); ++i)  // channels at different scales, centred at 20
      xd.data<double>()[i] = x.data<float>()[i] = x.data<float>()[i] * static_cast<float>(1 + i / sp % ch) + 20.0f;
    auto [gamma, gammad] = pair(Shape{ch}, 0.5, 1.5);
    auto [beta, betad] = pair(Shape{ch}, -0.2, 0.2);
    auto [rm, rmd] = pair(Shape{ch}, 19, 21);
    auto [rv, rvd] = pair(Shape{ch}, 0.5, 2);
    auto [dy, dyd] = pair(x.shape(), -1, 1);
    auto [dg, dgd] = pair(Shape{ch}, -1, 1);
    auto [db, dbd] = pair(Shape{ch}, -1, 1);
    Tensor y = Tensor::empty(x.shape(), DType::f32), yd = Tensor::empty(x.shape(), DType::f64);
    Tensor m = Tensor::empty(Shape{ch}, DType::f32), md = Tensor::empty(Shape{ch}, DType::f64);
    Tensor v = Tensor::empty(Shape{ch}, DType::f32), vd = Tensor::empty(Shape{ch}, DType::f64);
    for (bool training : {true, false}) {
      CAPTURE(training);
      ops::batchnorm_forward(x, gamma, beta, rm, rv, 0.1, 1e-5, training, m, v, y);
      ops::batchnorm_forward(xd, gammad, betad, rmd, rvd, 0.1, 1e-5, training, md, vd, yd);
      CHECK(worst_rel(y, yd) < 1e-5);
      CHECK(worst_rel(rm, rmd) < 1e-6);
      CHECK(worst_rel(rv, rvd) < 1e-5);
      CHECK(worst_rel(m, md) < 1e-6);
      CHECK(worst_rel(v, vd) < 1e-5);
      Tensor dx = Tensor::empty(x.shape(), DType::f32), dxd = Tensor::empty(x.shape(), DType::f64);
      ops::batchnorm_backward(x, gamma, m, v, dy, training, dx, dg, db, 1.0);  // accumulate onto dγ, dβ
      ops::batchnorm_backward(xd, gammad, md, vd, dyd, training, dxd, dgd, dbd, 1.0);
      CHECK(worst_rel(dx, dxd) < 1e-4);
      CHECK(worst_rel(dg, dgd) < 1e-4);
      CHECK(worst_rel(db, dbd) < 1e-5);
      Tensor none;
      ops::batchnorm_backward(x, gamma, m, v, dy, training, none, dg, db, 0.0);  // overwrite, no dx
      ops::batchnorm_backward(xd, gammad, md, vd, dyd, training, none, dgd, dbd, 0.0);
      CHECK(worst_rel(dg, dgd) < 1e-4);
      CHECK(worst_rel(db, dbd) < 1e-5);
    }
    // the f64 path against the definition: per channel, over the batch and the spatial positions
    ops::batchnorm_forward(xd, gammad, betad, rmd, rvd, 0.1, 1e-5, true, md, vd, yd);
    double worst_def = 0;
    for (int64_t c = 0; c < ch; ++c) {
      double mean = 0, var = 0;
      const double n = static_cast<double>(batch * sp);
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < sp; ++i) mean += xd.data<double>()[(b * ch + c) * sp + i] / n;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < sp; ++i) {
          const double d = xd.data<double>()[(b * ch + c) * sp + i] - mean;
          var += d * d / n;
        }
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < sp; ++i) {
          const int64_t at = (b * ch + c) * sp + i;
          const double want = (xd.data<double>()[at] - mean) / std::sqrt(var + 1e-5) * gammad.data<double>()[c] +
                              betad.data<double>()[c];
          worst_def = std::max(worst_def, std::abs(yd.data<double>()[at] - want));
        }
    }
    CHECK(worst_def < 1e-10);
  }
}

// 2×2 max pooling, f32 (vector loops) and f64 (scalar loops), against the rule written out: the window's first
// maximum in reading order takes the gradient, a window holding a NaN gives it to its last tap, inputs in no window
// (odd sides) get zero. Values from a few levels so that windows tie.
TEST_CASE("2x2 max pooling, f32 and f64, gives the reference's bits with ties, NaN and odd sides", "[cpu]") {
  set_num_threads(2);
  Rng rng(12, 0);
  const Window2d win{2, 2, 2, 2, 0, 0};
  struct Hw {
    int64_t h, w;
  };
  for (const Hw s : {Hw{28, 28}, Hw{14, 14}, Hw{7, 7}, Hw{5, 6}, Hw{2, 18}, Hw{6, 35}, Hw{4, 64}, Hw{3, 4}}) {
    CAPTURE(s.h, s.w);
    const int64_t planes = 2 * 3, oh = s.h / 2, ow = s.w / 2;
    Tensor x = Tensor::empty(Shape{2, 3, s.h, s.w}, DType::f32), dy = Tensor::empty(Shape{2, 3, oh, ow}, DType::f32);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(std::floor(rng.uniform(0, 3)));
    for (int64_t i = 0; i < x.numel(); i += 37) x.data<float>()[i] = std::nanf("");
    for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
    Tensor want_y = Tensor::empty(dy.shape(), DType::f32), want_dx = Tensor::zeros(x.shape(), DType::f32);
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          int64_t at[4];
          for (int t = 0; t < 4; ++t) at[t] = (p * s.h + 2 * oy + t / 2) * s.w + 2 * ox + t % 2;
          const float* px = x.data<float>();
          const float m = std::max(std::max(px[at[0]], px[at[1]]), std::max(px[at[2]], px[at[3]]));
          int which = 3;
          for (int t = 2; t >= 0; --t)
            if (px[at[t]] == m) which = t;
          want_y.data<float>()[(p * oh + oy) * ow + ox] = m;
          want_dx.data<float>()[at[which]] = dy.data<float>()[(p * oh + oy) * ow + ox];
        }
    auto same_bits = [](const Tensor& got, const Tensor& want) {
      for (int64_t i = 0; i < got.numel(); ++i) {
        const double g = got.dtype() == DType::f32 ? got.data<float>()[i] : got.data<double>()[i];
        const float w = want.data<float>()[i];
        if (!(g == w || (std::isnan(g) && std::isnan(w)))) return false;
      }
      return true;
    };
    Tensor xd = Tensor::empty(x.shape(), DType::f64), dyd = Tensor::empty(dy.shape(), DType::f64);
    for (int64_t i = 0; i < x.numel(); ++i) xd.data<double>()[i] = x.data<float>()[i];
    for (int64_t i = 0; i < dy.numel(); ++i) dyd.data<double>()[i] = dy.data<float>()[i];
    for (DType dt : {DType::f32, DType::f64})
      for (const cpu::CpuIsa isa : {cpu::CpuIsa::avx512, cpu::CpuIsa::avx2, cpu::CpuIsa::baseline}) {
        const test::ForcedCpuIsa forced(isa);  // the f32 backward's vectors of 16, 8 and 4 lanes on each path
        if (!forced.ok()) continue;
        CAPTURE(dtype_name(dt), cpu::to_string(isa));
        const Tensor& xi = dt == DType::f32 ? x : xd;
        const Tensor& gi = dt == DType::f32 ? dy : dyd;
        Tensor y = Tensor::empty(dy.shape(), dt), dx = Tensor::empty(x.shape(), dt);
        for (int64_t i = 0; i < dx.numel(); ++i)  // garbage that every element must overwrite
          dt == DType::f32 ? void(dx.data<float>()[i] = 9.f) : void(dx.data<double>()[i] = 9.0);
        ops::pool2d_forward(PoolKind::max, xi, win, y);
        ops::pool2d_backward(PoolKind::max, xi, gi, win, dx);
        CHECK(same_bits(y, want_y));
        CHECK(same_bits(dx, want_dx));
      }
  }
}

// The convolution's three im2col paths (stride 1 with ow = w: one shifted run per tap; any other window: row by row;
// 1×1: none) in f32 and f64 against the definition written as loops in double: odd sides, paddings wider than the
// kernel's reach, dilation, groups, strides, images one pixel wide.
TEST_CASE("conv2d forward and backward match direct loops on every im2col path", "[cpu]") {
  set_num_threads(2);
  struct Case {
    int64_t c, o, h, w, groups;
    Window2d win;
  };
  const Case cases[] = {
      {3, 4, 7, 9, 1, {3, 3, 1, 1, 1, 1}},        // aligned: same padding
      {2, 3, 6, 5, 1, {5, 5, 1, 1, 2, 2}},        // aligned, taps two columns out
      {2, 2, 5, 6, 1, {3, 3, 1, 1, 2, 2, 2, 2}},  // aligned with dilation 2
      {2, 3, 4, 2, 1, {3, 3, 1, 1, 3, 3, 3, 3}},  // aligned, the shift wider than the image
      {4, 4, 5, 7, 2, {2, 3, 1, 1, 0, 1}},        // aligned, groups, oh = h − 1
      {1, 2, 1, 1, 1, {3, 3, 1, 1, 1, 1}},        // aligned, one pixel
      {2, 3, 7, 8, 1, {3, 3, 2, 2, 1, 1}},        // row by row: stride 2
      {2, 2, 6, 6, 1, {3, 3, 1, 1, 0, 0}},        // row by row: valid padding
      {3, 2, 4, 5, 1, {1, 1, 1, 1, 0, 0}},        // 1×1
  };
  Rng rng(13, 0);
  for (const Case& cs : cases) {
    const Window2d& k = cs.win;
    CAPTURE(cs.c, cs.o, cs.h, cs.w, cs.groups, k.kh, k.kw, k.sh, k.ph, k.pw, k.dh);
    const int64_t batch = 3, cg = cs.c / cs.groups, og = cs.o / cs.groups;
    const int64_t oh = window_out(cs.h, k.kh, k.sh, k.ph, k.dh), ow = window_out(cs.w, k.kw, k.sw, k.pw, k.dw);
    auto [x, xd] = f32_f64_pair(Shape{batch, cs.c, cs.h, cs.w}, rng, -1, 1);
    auto [w, wd] = f32_f64_pair(Shape{cs.o, cg, k.kh, k.kw}, rng, -1, 1);
    auto [b, bd] = f32_f64_pair(Shape{cs.o}, rng, -1, 1);
    auto [dy, dyd] = f32_f64_pair(Shape{batch, cs.o, oh, ow}, rng, -1, 1);
    // the definition, in double
    Tensor want_y = Tensor::zeros(dy.shape(), DType::f64), want_dx = Tensor::zeros(x.shape(), DType::f64);
    Tensor want_dw = Tensor::zeros(w.shape(), DType::f64), want_db = Tensor::zeros(b.shape(), DType::f64);
    const double *X = xd.data<double>(), *W = wd.data<double>(), *G = dyd.data<double>();
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t o = 0; o < cs.o; ++o)
        for (int64_t oy = 0; oy < oh; ++oy)
          for (int64_t ox = 0; ox < ow; ++ox) {
            const int64_t yi = ((n * cs.o + o) * oh + oy) * ow + ox;
            double acc = bd.data<double>()[o];
            want_db.data<double>()[o] += G[yi];
            for (int64_t ci = 0; ci < cg; ++ci)
              for (int64_t ky = 0; ky < k.kh; ++ky)
                for (int64_t kx = 0; kx < k.kw; ++kx) {
                  const int64_t iy = oy * k.sh - k.ph + ky * k.dh, ix = ox * k.sw - k.pw + kx * k.dw;
                  if (iy < 0 || iy >= cs.h || ix < 0 || ix >= cs.w) continue;
                  const int64_t xi = ((n * cs.c + o / og * cg + ci) * cs.h + iy) * cs.w + ix;
                  const int64_t wi = ((o * cg + ci) * k.kh + ky) * k.kw + kx;
                  acc += W[wi] * X[xi];
                  want_dx.data<double>()[xi] += W[wi] * G[yi];
                  want_dw.data<double>()[wi] += X[xi] * G[yi];
                }
            want_y.data<double>()[yi] = acc;
          }
    auto worst_abs = [](const Tensor& got, const Tensor& want) {
      double worst = 0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        const double g = got.dtype() == DType::f32 ? got.data<float>()[i] : got.data<double>()[i];
        worst = std::max(worst, std::abs(g - want.data<double>()[i]));
      }
      return worst;
    };
    for (DType dt : {DType::f32, DType::f64}) {
      CAPTURE(dtype_name(dt));
      const bool f = dt == DType::f32;
      const double tol = f ? 2e-5 : 1e-12;  // sums of at most 3·9·2 = 54 products of values in [-1, 1]
      Tensor y = Tensor::empty(dy.shape(), dt), dx = Tensor::empty(x.shape(), dt);
      Tensor dw = Tensor::empty(w.shape(), dt), db = Tensor::empty(b.shape(), dt);
      ops::conv2d_forward(f ? x : xd, f ? w : wd, f ? b : bd, k, cs.groups, y);
      CHECK(worst_abs(y, want_y) < tol);
      ops::conv2d_backward(f ? x : xd, f ? w : wd, f ? dy : dyd, k, cs.groups, dx, dw, db, 0.0);
      CHECK(worst_abs(dx, want_dx) < tol);
      CHECK(worst_abs(dw, want_dw) < 4 * tol);  // summed over the batch too
      CHECK(worst_abs(db, want_db) < 4 * tol);
    }
  }
}

TEST_CASE("ops/families.h lists every op family, and each has its contract, dispatch, CPU and CUDA files", "[cpu]") {
  namespace fs = std::filesystem;
  std::set<std::string> listed;
  std::string previous;
  for (const ops::OpFamily& f : ops::kOpFamilies) {
    const std::string name(f.name);
    INFO("family " << name);
    CHECK(name > previous);  // name order, no repeats
    CHECK(!f.about.empty());
    previous = name;
    listed.insert(name);
    for (const std::string& rel :
         {"lib/ops/" + name + ".h", "lib/ops/" + name + ".cpp", "lib/ops/cpu/" + name + ".cpp"})
      CHECK(fs::exists(test::source_path(rel)));
    CHECK((fs::exists(test::source_path("lib/ops/cuda/" + name + ".cu")) ||
           fs::exists(test::source_path("lib/ops/cuda/" + name + ".cpp"))));
  }
  // A header that declares backend entry points is a family's contract, so it must be listed.
  for (const auto& entry : fs::directory_iterator(test::source_path("lib/ops"))) {
    if (entry.path().extension() != ".h" || entry.path().filename() == "entry_points.h") continue;
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("\nGT_BACKEND_ENTRY_POINTS(") == std::string::npos) continue;
    INFO(entry.path().string() << " declares backend entry points");
    CHECK(listed.count(entry.path().stem().string()) == 1);
  }
}
