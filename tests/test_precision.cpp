// train.precision on the CPU: bf16/fp16 products by conversion (ops/precision.h) — dense layers, convolutions and
// attention — equal products of the rounded operands and differ from plain fp32 ones; weights are rounded once per
// scope; a bf16 or fp16 run trains to within a margin of fp32; the flag, the
// warning and the CUDA refusal.
#include "core/half.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "helpers.h"
#include "ops/attention.h"
#include "ops/conv2d.h"
#include "ops/math.h"
#include "ops/matmul.h"
#include "ops/optim.h"
#include "ops/precision.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <limits>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
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
  // The conversion path (a bf16 product on a CPU without avx512_bf16, or with GPUTRAIN_CPU_BF16=convert); the native
  // one is tested in test_bf16_kernels.cpp.
  const ForcedBf16Path conversion(cpu::CpuBf16Path::conversion);
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

// The unit roundoff of a half format: half an ulp at 1 (bf16 keeps 8 significant bits, fp16 11).
double unit_roundoff(HalfFormat f) { return f == HalfFormat::bf16 ? 0x1p-8 : 0x1p-11; }

std::vector<double> as_doubles(const Tensor& t) {
  return std::vector<double>(t.data<float>(), t.data<float>() + t.numel());
}
std::vector<double> rounded_doubles(const Tensor& t, HalfFormat f) { return as_doubles(rounded(t, f)); }
double round_half(double v, HalfFormat f) {
  float x = static_cast<float>(v);
  round_to_half(f, &x, &x, 1);
  return x;
}

// A product's exact value in double from the operands it was given, and Σ|terms|, its rounding errors' scale.
// `a_scale`: the size of the sums an operand a was made from (in f32 by the op), when a is a difference of them whose
// f32 rounding can be large next to a itself (attention's dS = P·(dP − D)/√d); slack = Σ a_scale·|b|.
struct RefValue {
  double value = 0, magnitude = 0, largest = 0, slack = 0;  // largest: max |term|
  void add(double a, double b, double a_scale = 0) {
    value += a * b;
    magnitude += std::fabs(a * b);
    largest = std::max(largest, std::fabs(a * b));
    slack += a_scale * std::fabs(b);
  }
};

// How an op's result under a half precision compares with a reference that rounded the operands itself and with the
// plain fp32 op, element by element: `tight` is the tolerance of the match with the reference, per element.
struct Comparison {
  double worst_ref = 0;   // max |half − ref| / tight
  double worst_fp32 = 0;  // max |half − fp32| / loose
  double beyond = 0;      // max |half − fp32| / tight: > 1 shows the rounding happened
};
template <class Tight, class Loose>
Comparison compare(const Tensor& half, const Tensor& fp32, const std::vector<RefValue>& ref, Tight&& tight,
                   Loose&& loose) {
  REQUIRE(static_cast<size_t>(half.numel()) == ref.size());
  Comparison c;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double h = half.data<float>()[i], f = fp32.data<float>()[i];
    c.worst_ref = std::max(c.worst_ref, std::fabs(h - ref[i].value) / tight(ref[i]));
    c.worst_fp32 = std::max(c.worst_fp32, std::fabs(h - f) / loose(ref[i]));
    c.beyond = std::max(c.beyond, std::fabs(h - f) / tight(ref[i]));
  }
  return c;
}

// A convolution's forward and backward (dx, dw, db) in the calling thread's precision.
struct ConvResults {
  Tensor y, dx, dw, db;
};
ConvResults conv_products(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy, const Window2d& win) {
  ConvResults r{Tensor::empty(dy.shape(), DType::f32), Tensor::empty(x.shape(), DType::f32),
                Tensor::empty(w.shape(), DType::f32), Tensor::empty(b.shape(), DType::f32)};
  ops::conv2d_forward(x, w, b, win, 1, r.y);
  ops::conv2d_backward(x, w, dy, win, 1, r.dx, r.dw, r.db, 0.0);
  return r;
}

}  // namespace

TEST_CASE("precision: convolutions in bf16/fp16 multiply rounded operands with f32 sums, db from the unrounded dy",
          "[cpu]") {
  // x (2, 8, 9, 9), w (6, 8, 3, 3), stride 2, padding 1 → y (2, 6, 5, 5): 72 terms per output, padded taps included.
  const Window2d win{3, 3, 2, 2, 1, 1};
  const int64_t nb = 2, cin = 8, h = 9, cout = 6, k = 3, oh = 5;
  const Tensor x = random_tensor(Shape{nb, cin, h, h}, 11), w = random_tensor(Shape{cout, cin, k, k}, 12),
               b = random_tensor(Shape{cout}, 13), dy = random_tensor(Shape{nb, cout, oh, oh}, 14);
  const ConvResults fp32 = conv_products(x, w, b, dy, win);
  // bf16 on both CPU paths (native where the CPU has avx512_bf16: the same bounds hold, only the order of the f32
  // sums differs), fp16 by conversion.
  for (auto [p, path] :
       {std::pair{Precision::bf16, cpu::CpuBf16Path::conversion}, std::pair{Precision::bf16, cpu::CpuBf16Path::native},
        std::pair{Precision::fp16, cpu::CpuBf16Path::conversion}}) {
    if (path == cpu::CpuBf16Path::native && !cpu::cpu_has_native_bf16()) {
      WARN("skipped: the native bf16 convolution (this CPU has no avx512_bf16)");
      continue;
    }
    const ForcedBf16Path forced(path);
    const HalfFormat f = *half_format(p);
    const double u = unit_roundoff(f);
    INFO(to_string(p) << " " << cpu::describe(path));
    ConvResults half;
    {
      const ProductPrecisionScope autocast(p);
      half = conv_products(x, w, b, dy, win);
    }
    // The reference: the operands rounded here, the sums in double, the bias and db from fp32 values.
    const auto xr = rounded_doubles(x, f), wr = rounded_doubles(w, f), dyr = rounded_doubles(dy, f);
    std::vector<RefValue> ry(static_cast<size_t>(dy.numel())), rdx(static_cast<size_t>(x.numel())),
        rdw(static_cast<size_t>(w.numel())), rdb(static_cast<size_t>(cout));
    for (int64_t n = 0; n < nb; ++n)
      for (int64_t o = 0; o < cout; ++o)
        for (int64_t oy = 0; oy < oh; ++oy)
          for (int64_t ox = 0; ox < oh; ++ox) {
            const int64_t yi = ((n * cout + o) * oh + oy) * oh + ox;
            ry[static_cast<size_t>(yi)].add(b.data<float>()[o], 1.0);
            rdb[static_cast<size_t>(o)].add(dy.data<float>()[yi], 1.0);
            for (int64_t c = 0; c < cin; ++c)
              for (int64_t ky = 0; ky < k; ++ky)
                for (int64_t kx = 0; kx < k; ++kx) {
                  const int64_t iy = oy * 2 - 1 + ky, ix = ox * 2 - 1 + kx;
                  if (iy < 0 || iy >= h || ix < 0 || ix >= h) continue;
                  const auto xi = static_cast<size_t>(((n * cin + c) * h + iy) * h + ix);
                  const auto wi = static_cast<size_t>(((o * cin + c) * k + ky) * k + kx);
                  ry[static_cast<size_t>(yi)].add(wr[wi], xr[xi]);
                  rdx[xi].add(wr[wi], dyr[static_cast<size_t>(yi)]);
                  rdw[wi].add(dyr[static_cast<size_t>(yi)], xr[xi]);
                }
          }
    // Tight: f32 sums of at most 100 terms, ≤ 100·2^-24 of Σ|terms| (plus the f32 bias); loose, against the fp32
    // op: each product of two rounded operands is off by ≤ 2u + u² relative, so ≤ (2u + u²)·Σ|terms| + the sums'.
    const auto tight = [](const RefValue& r) { return 100 * 0x1p-24 * r.magnitude + 1e-30; };
    const auto loose = [&](const RefValue& r) { return (2 * u + u * u + 200 * 0x1p-24) * r.magnitude + 1e-30; };
    for (auto [name, got, ref32, ref] :
         {std::tuple{"y", &half.y, &fp32.y, &ry}, std::tuple{"dx", &half.dx, &fp32.dx, &rdx},
          std::tuple{"dw", &half.dw, &fp32.dw, &rdw}}) {
      INFO(name);
      const Comparison c = compare(*got, *ref32, *ref, tight, loose);
      CHECK(c.worst_ref <= 1);
      CHECK(c.worst_fp32 <= 1);
      CHECK(c.beyond > 10);  // not the fp32 result: rounding skipped would leave it within the tight tolerance
    }
    // db sums dy as it is: equal to the fp32 op's, bit for bit.
    CHECK(max_abs_diff(half.db, fp32.db) == 0);
  }
  // fp32 and tf32 scopes leave convolutions fp32, bit for bit.
  for (Precision p : {Precision::fp32, Precision::tf32}) {
    const ProductPrecisionScope autocast(p);
    const ConvResults same = conv_products(x, w, b, dy, win);
    CHECK(max_abs_diff(same.y, fp32.y) == 0);
    CHECK(max_abs_diff(same.dx, fp32.dx) == 0);
    CHECK(max_abs_diff(same.dw, fp32.dw) == 0);
  }
}

TEST_CASE("precision: a weight is rounded once per scope, read by the step's products, and again in the next scope",
          "[cpu]") {
  // Rounded copies are the conversion path's on OpenBLAS: the native bf16 kernel and our f32 kernels round as they
  // pack and keep none.
  const ForcedBf16Path conversion(cpu::CpuBf16Path::conversion);
  const ForcedSgemmPath openblas(cpu::CpuSgemmPath::openblas);
  const Tensor x = random_tensor(Shape{32, 40}, 31), dy = random_tensor(Shape{32, 24}, 32), bias{};
  Tensor w = random_tensor(Shape{24, 40}, 33);
  auto roundings = [] { return half_weight_cache_stats().roundings; };
  auto reuses = [] { return half_weight_cache_stats().reuses; };
  LinearProducts first;
  {
    const ProductPrecisionScope autocast(Precision::bf16);
    const uint64_t before = roundings(), reused = reuses();
    first = linear_products(x, w, bias, dy);  // y = x·wᵀ makes the copy; dx = dy·W reads it
    CHECK(roundings() == before + 1);
    CHECK(reuses() == reused + 1);
    const LinearProducts again = linear_products(x, w, bias, dy);  // a second micro-batch: no new rounding
    CHECK(roundings() == before + 1);
    CHECK(reuses() == reused + 3);
    CHECK(max_abs_diff(again.dx, first.dx) == 0);
    // The copy is f32 values (what the CPU's GEMM multiplies): 4 bytes per element of w.
    CHECK(half_weight_cache_stats().bytes >= static_cast<size_t>(w.numel()) * sizeof(float));
  }
  const HalfFormat bf = HalfFormat::bf16;
  const LinearProducts reference = linear_products(rounded(x, bf), rounded(w, bf), bias, rounded(dy, bf));
  CHECK(max_abs_diff(first.y, reference.y) == 0);
  CHECK(max_abs_diff(first.dx, reference.dx) == 0);
  // The optimizer changes w between steps: the next scope rounds the new values, not the last step's copy.
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] += 0.25f;
  {
    const ProductPrecisionScope autocast(Precision::bf16);
    const uint64_t before = roundings();
    const LinearProducts next = linear_products(x, w, bias, dy);
    CHECK(roundings() == before + 1);
    const LinearProducts want = linear_products(rounded(x, bf), rounded(w, bf), bias, rounded(dy, bf));
    CHECK(max_abs_diff(next.y, want.y) == 0);
    CHECK(max_abs_diff(next.dx, want.dx) == 0);
    // An inner scope in another format rounds its own copy, and the outer one's is made again after it.
    {
      const ProductPrecisionScope inner(Precision::fp16);
      const HalfFormat fp = HalfFormat::fp16;
      const LinearProducts in16 = linear_products(x, w, bias, dy);
      const LinearProducts want16 = linear_products(rounded(x, fp), rounded(w, fp), bias, rounded(dy, fp));
      CHECK(max_abs_diff(in16.y, want16.y) == 0);
      CHECK(max_abs_diff(in16.dx, want16.dx) == 0);
    }
    const LinearProducts after = linear_products(x, w, bias, dy);
    CHECK(max_abs_diff(after.y, want.y) == 0);
    CHECK(max_abs_diff(after.dx, want.dx) == 0);
  }
  // A convolution's weight: one rounding for its forward and its backward's dx product.
  {
    const Window2d win{3, 3, 1, 1, 1, 1};
    const Tensor cx = random_tensor(Shape{2, 4, 6, 6}, 34), cw = random_tensor(Shape{5, 4, 3, 3}, 35),
                 cb = random_tensor(Shape{5}, 36), cdy = random_tensor(Shape{2, 5, 6, 6}, 37);
    const ProductPrecisionScope autocast(Precision::fp16);
    const uint64_t before = roundings(), reused = reuses();
    conv_products(cx, cw, cb, cdy, win);
    conv_products(cx, cw, cb, cdy, win);
    CHECK(roundings() == before + 1);
    CHECK(reuses() == reused + 3);
  }
  // A weight no product read in the last scope gives its copy back when the next one starts.
  { const ProductPrecisionScope idle(Precision::bf16); }
  {
    const ProductPrecisionScope next(Precision::bf16);
    CHECK(half_weight_cache_stats().entries == 0);
  }
}

TEST_CASE("precision: scope copies (the CPU's and CUDA's weight copies) are valid in the scope that made them only",
          "[cpu]") {
  // The bookkeeping both devices' weight copies share, with a copy that records what made it.
  struct Copy {
    int made = 0;
    uint64_t scope = 0;
  };
  ScopeCopies<Copy> copies;
  int a = 0, b = 0;  // two "weights": only their addresses are keys
  int makes = 0;
  auto get = [&](const void* key, int64_t numel, HalfFormat f) -> const Copy& {
    return copies.get(key, numel, f, [&](Copy& c) {
      ++c.made;
      c.scope = product_scope();
      ++makes;
    });
  };
  {
    const ProductPrecisionScope outer(Precision::bf16);
    const uint64_t s1 = product_scope();
    CHECK(copies.find(&a, 4, HalfFormat::bf16) == nullptr);  // nothing made yet
    CHECK(get(&a, 4, HalfFormat::bf16).scope == s1);
    CHECK(get(&a, 4, HalfFormat::bf16).made == 1);  // reused
    CHECK(copies.find(&a, 4, HalfFormat::bf16) != nullptr);
    CHECK(copies.find(&a, 5, HalfFormat::bf16) == nullptr);  // another size: not this copy
    CHECK(copies.find(&a, 4, HalfFormat::fp16) == nullptr);  // another format
    CHECK(get(&a, 4, HalfFormat::fp16).made == 2);           // remade in place, in the entry's buffer
    CHECK(get(&a, 4, HalfFormat::bf16).made == 3);
    {
      const ProductPrecisionScope inner(Precision::fp16);
      CHECK(copies.find(&a, 4, HalfFormat::bf16) == nullptr);  // the outer scope's copy is not the inner's
      CHECK(get(&a, 4, HalfFormat::bf16).scope == product_scope());
    }
    CHECK(get(&a, 4, HalfFormat::bf16).scope == s1);  // the inner scope's copy is not the outer's: made again
    CHECK(copies.makes() == 5);
    // A copy whose making throws is not valid: the next read makes it again.
    CHECK_THROWS(copies.get(&b, 4, HalfFormat::bf16, [](Copy&) { throw std::runtime_error("out of memory"); }));
    CHECK(copies.find(&b, 4, HalfFormat::bf16) == nullptr);
    CHECK(get(&b, 4, HalfFormat::bf16).made == 1);
    CHECK(copies.size() == 2);
  }
  CHECK(copies.find(&a, 4, HalfFormat::bf16) == nullptr);  // outside any scope nothing is valid
  {
    // The scope started last before this one is the inner one, where neither was read: both entries are freed.
    const ProductPrecisionScope next(Precision::bf16);
    CHECK(copies.size() == 0);
    CHECK(get(&a, 4, HalfFormat::bf16).made == 1);
    get(&b, 4, HalfFormat::bf16);
  }
  {
    const ProductPrecisionScope later(Precision::bf16);
    CHECK(copies.size() == 2);                      // both read in the last scope: kept
    CHECK(get(&a, 4, HalfFormat::bf16).made == 2);  // made again, in the entry it kept
  }
  {
    const ProductPrecisionScope last(Precision::bf16);
    CHECK(copies.size() == 1);  // b was not read in the last scope: freed
  }
  CHECK(makes == 9);
  CHECK(copies.makes() == 9);
  CHECK(copies.reuses() == 2);
}

namespace {

struct AttentionResults {
  Tensor out, lse, delta, dqkv;
};
AttentionResults attention_products(const Tensor& qkv, const Tensor& dout, int64_t heads) {
  const int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3;
  AttentionResults r{Tensor::empty(Shape{nb, t, c}, DType::f32), Tensor::empty(Shape{nb, heads, t}, DType::f32),
                     Tensor::empty(Shape{nb, heads, t}, DType::f32), Tensor::empty(qkv.shape(), DType::f32)};
  ops::attention_forward(qkv, heads, {}, r.out, r.lse);
  ops::attention_backward(qkv, r.out, r.lse, dout, heads, {}, r.delta, r.dqkv);
  return r;
}

}  // namespace

TEST_CASE("precision: attention's four products in bf16/fp16 multiply rounded q, k, v, dout, P and dS, softmax f32",
          "[cpu]") {
  // B 2, T 24, 2 heads of d 16. q and k have std 3, so that scores (std ~3) move P by more when their operands are
  // rounded than the last-bit differences of f32 and double exps move it.
  const int64_t nb = 2, t = 24, heads = 2, d = 16, c = heads * d;
  Tensor qkv = random_tensor(Shape{nb, t, 3 * c}, 21);
  for (int64_t i = 0; i < qkv.numel(); ++i)
    if (i % (3 * c) < 2 * c) qkv.data<float>()[i] *= 3;
  const Tensor dout = random_tensor(Shape{nb, t, c}, 22);
  const AttentionResults fp32 = attention_products(qkv, dout, heads);
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    const HalfFormat f = *half_format(p);
    const double u = unit_roundoff(f);
    INFO(to_string(p));
    AttentionResults half;
    {
      const ProductPrecisionScope autocast(p);
      half = attention_products(qkv, dout, heads);
    }
    // The reference, in double from operands rounded here: scores from rounded q, k; softmax in double; P and dS
    // rounded before their products; delta from the unrounded dout and the op's own out (what it is given).
    const auto xr = rounded_doubles(qkv, f), gr = rounded_doubles(dout, f);
    const auto g = as_doubles(dout), o = as_doubles(half.out);
    std::vector<RefValue> rout(static_cast<size_t>(nb * t * c)), rdx(static_cast<size_t>(qkv.numel()));
    std::vector<double> rlse(static_cast<size_t>(nb * heads * t));
    auto at = [&](int64_t n, int64_t i, int64_t part, int64_t h, int64_t e) {  // index into qkv
      return static_cast<size_t>((n * t + i) * 3 * c + part * c + h * d + e);
    };
    auto ot = [&](int64_t n, int64_t i, int64_t h, int64_t e) {
      return static_cast<size_t>((n * t + i) * c + h * d + e);
    };
    for (int64_t n = 0; n < nb; ++n)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < t; ++i) {
          std::vector<double> s(static_cast<size_t>(i + 1)), dp(static_cast<size_t>(i + 1)),
              dp_size(static_cast<size_t>(i + 1));
          double mx = -1e300, sum = 0, delta = 0, delta_size = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0, dpj = 0, dpj_size = 0;
            for (int64_t e = 0; e < d; ++e) {
              dot += xr[at(n, i, 0, h, e)] * xr[at(n, j, 1, h, e)];
              dpj += gr[ot(n, i, h, e)] * xr[at(n, j, 2, h, e)];
              dpj_size += std::fabs(gr[ot(n, i, h, e)] * xr[at(n, j, 2, h, e)]);
            }
            s[static_cast<size_t>(j)] = dot * scale;
            dp[static_cast<size_t>(j)] = dpj;
            dp_size[static_cast<size_t>(j)] = dpj_size;
            mx = std::max(mx, dot * scale);
          }
          for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[static_cast<size_t>(j)] - mx);
          rlse[static_cast<size_t>((n * heads + h) * t + i)] = mx + std::log(sum);
          for (int64_t e = 0; e < d; ++e) {
            delta += g[ot(n, i, h, e)] * o[ot(n, i, h, e)];
            delta_size += std::fabs(g[ot(n, i, h, e)] * o[ot(n, i, h, e)]);
          }
          for (int64_t j = 0; j <= i; ++j) {
            const double pij = std::exp(s[static_cast<size_t>(j)] - mx) / sum;
            const double ph = round_half(pij, f),
                         dsh = round_half(pij * (dp[static_cast<size_t>(j)] - delta) * scale, f);
            const double ds_size = pij * (dp_size[static_cast<size_t>(j)] + delta_size) * scale;
            for (int64_t e = 0; e < d; ++e) {
              rout[ot(n, i, h, e)].add(ph, xr[at(n, j, 2, h, e)]);
              rdx[at(n, i, 0, h, e)].add(dsh, xr[at(n, j, 1, h, e)], ds_size);  // dq_i = Σ_j dS_ij k_j
              rdx[at(n, j, 1, h, e)].add(dsh, xr[at(n, i, 0, h, e)], ds_size);  // dk_j = Σ_i dS_ij q_i
              rdx[at(n, j, 2, h, e)].add(ph, gr[ot(n, i, h, e)]);               // dv_j = Σ_i P_ij dout_i
            }
          }
        }
    // Tight: 2^-16 of Σ|terms| (f32 sums, and P and dS made in f32 with a vectorised exp: ~1e-6 relative), plus one
    // half ulp of the largest term, since P or dS made in f32 and in double may round to neighbouring half values
    // when they lie within ~1e-7 of a midpoint, plus 2^-18 of the sums dS is the difference of (dP and D, each
    // ~1e-7 off in f32: where they nearly cancel, dS's f32 rounding is large next to dS). Loose, against the fp32
    // op: rounded q and k move a score by up to 2u·Σ|q||k|/√d (≤ ~2u·25 here), which scales P by e^that, the rounded
    // P, dS, v, dout add ~3u, and dP moves by up to 2u of its size (the rounded dout; D, from the unrounded dout,
    // does not), which dS carries even where it is ~0 in fp32.
    const auto tight = [&](const RefValue& r) {
      return 0x1p-16 * r.magnitude + u * r.largest + 0x1p-18 * r.slack + 1e-30;
    };
    const auto loose = [&](const RefValue& r) { return 60 * u * r.magnitude + 4 * u * r.slack + 1e-6; };
    for (auto [name, got, ref32, ref] :
         {std::tuple{"out", &half.out, &fp32.out, &rout}, std::tuple{"dqkv", &half.dqkv, &fp32.dqkv, &rdx}}) {
      INFO(name);
      const Comparison cmp = compare(*got, *ref32, *ref, tight, loose);
      CHECK(cmp.worst_ref <= 1);
      CHECK(cmp.worst_fp32 <= 1);
      CHECK(cmp.beyond > 3);
    }
    // The softmax statistics are f32 sums of the half-operand scores: lse matches the reference's to f32's rounding.
    double worst_lse = 0;
    for (size_t i = 0; i < rlse.size(); ++i)
      worst_lse = std::max(worst_lse, std::fabs(half.lse.data<float>()[i] - rlse[i]) / (1 + std::fabs(rlse[i])));
    CHECK(worst_lse < 1e-5);
  }
  for (Precision p : {Precision::fp32, Precision::tf32}) {
    const ProductPrecisionScope autocast(p);
    const AttentionResults same = attention_products(qkv, dout, heads);
    CHECK(max_abs_diff(same.out, fp32.out) == 0);
    CHECK(max_abs_diff(same.dqkv, fp32.dqkv) == 0);
  }
}

namespace {

const std::string kMlp =
    "name: mlp\nseed: 11\ndevice: cpu\n" +
    synthetic_mlp({.samples = 4000, .test_samples = 1000, .features = 20, .classes = 4, .batch = 64, .hidden = 64}) +
    R"(optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 3, log_every: 20}
)";

}  // namespace

TEST_CASE("precision: bf16 and fp16 runs of an MLP train to within 2% of fp32's losses, and say how they ran",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "mlp.yaml", kMlp);
  const std::string common = "train " + (dir / "mlp.yaml") + " --threads 2 --no-progress --out ";
  const auto fp32 = run_gputrain(common + (dir / "fp32"));
  REQUIRE(fp32.exit_code == 0);
  CHECK(fp32.output.find("by conversion") == std::string::npos);
  const std::vector<double> ref = train_losses(read_text(dir / "fp32/metrics.jsonl"));
  REQUIRE(ref.size() >= 8);
  // bf16 as this CPU runs it (natively where it has avx512_bf16), bf16 forced onto the conversion path, and fp16.
  for (auto [p, env] : {std::pair{"bf16", ""}, std::pair{"bf16", "GPUTRAIN_CPU_BF16=convert"}, std::pair{"fp16", ""}}) {
    INFO(p << " " << env);
    const std::string out = dir / (std::string(p) + (*env ? "_convert" : ""));
    const auto r = run_gputrain(common + out + " --precision " + p, env);
    REQUIRE(r.exit_code == 0);
    const bool bf16_auto = std::string(p) == "bf16" && !*env && cpu::cpu_has_native_bf16();
    const bool native = bf16_auto && cpu::cpu_native_bf16_pays();
    // Natively: one line saying so, and no warning; on a CPU with AVX-512 BF16 where it does not pay, one line saying
    // why not; otherwise, by conversion: one warning, naming the instruction set this CPU lacks (or that it has it and
    // the conversion path was asked for).
    const std::regex warning("precision \\w+: matrix products round their operands .*by conversion.*(no|has) AVX");
    const std::regex info("precision bf16: matrix products .* on the CPU's AVX-512 BF16");
    const std::regex info_not("precision bf16: .* by conversion .*vdpbf16ps runs no faster");
    const auto n = std::distance(std::sregex_iterator(r.output.begin(), r.output.end(), warning), {});
    const auto n_native = std::distance(std::sregex_iterator(r.output.begin(), r.output.end(), info), {});
    const auto n_not = std::distance(std::sregex_iterator(r.output.begin(), r.output.end(), info_not), {});
    CHECK(n == (bf16_auto ? 0 : 1));
    CHECK(n_native == (native ? 1 : 0));
    CHECK(n_not == (bf16_auto && !native ? 1 : 0));
    CHECK(read_text(out + "/overrides.json").find(std::string("train.precision=") + p) != std::string::npos);
    CHECK(read_text(out + "/config.resolved.yaml").find(std::string("precision: ") + p) != std::string::npos);
    const std::vector<double> got = train_losses(read_text(out + "/metrics.jsonl"));
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
  CHECK(train_losses(read_text(dir / "fp32/metrics.jsonl")) == train_losses(read_text(dir / "tf32/metrics.jsonl")));
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
  std::filesystem::remove(run + "/summary.json");  // cut short there: no summary (a finished run is not resumed)
  const auto r = run_gputrain("train " + (dir / "fp16.yaml") + " --threads 2 --no-progress --resume auto --out " + run);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("step-" + std::to_string(cut)) != std::string::npos);
  CHECK(read_text(run + "/model.safetensors") == read_text(dir / "full/model.safetensors"));
  CHECK(field(read_text(run + "/metrics.jsonl"), "loss") == loss);
  CHECK(field(read_text(run + "/metrics.jsonl"), "loss_scale") == scale);
  CHECK(field(read_text(run + "/metrics.jsonl"), "overflow_skips") == skips);
}
