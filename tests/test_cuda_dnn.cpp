// The cuBLASLt and cuDNN ops against the CPU on the same seeded inputs: matmul, conv2d, pool2d and batch norm
// (ops/cuda/matmul.cu, conv2d.cpp, pool2d.cpp, batchnorm.cu), forward and backward, f32 and f64, with sentinels around
// every output. Without a usable GPU every case exits with ctest's skip code (77) after printing why.
//
// Tolerances. Where an output is a sum of K products (matmul, convolution, the batch-norm reductions) the two sides
// add the same terms in different orders (OpenBLAS/im2col against cuBLASLt's or cuDNN's tiling, split-K, Winograd or
// FFT), and each rounding of an f32 sum costs at most u·|partial sum| with u = 6e-8. The tolerance
//   |Δ| ≤ 1e-5 · K · max|a| · max|b|
// is ≥ 10× the error such sums show in practice (≈ √K·u·Σ|a·b|) for the K ≤ 1000 used here, and far below what
// a wrong, missing or misplaced term costs (up to max|a|·max|b|, about 1/3 of it on average). In f64 the factor is
// 1e-13 (u = 1.1e-16).
#include "cuda_helpers.h"
#include "ops/batchnorm.h"
#include "ops/conv2d.h"
#include "ops/cuda/dnn_common.h"
#include "ops/cuda/half_scratch.h"
#include "ops/matmul.h"
#include "ops/pool2d.h"
#include "ops/precision.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

template <class T>
using GuardedOf = GuardedT<T>;
template <class T>
constexpr DType kDType = std::is_same_v<T, float> ? DType::f32 : DType::f64;
/// The per-term factor of the dot-product tolerance (file comment), f32 or f64.
template <class T>
constexpr double kDot = std::is_same_v<T, float> ? 1e-5 : 1e-13;

template <class T>
Tensor seeded_as(const Shape& shape, uint64_t seed, double lo = -4, double hi = 4) {
  return as<T>(seeded(shape, seed, lo, hi));
}

double max_abs(const Tensor& host) {
  double m = 0;
  for (int64_t i = 0; i < host.numel(); ++i)
    m = std::max(m, std::abs(host.dtype() == DType::f64 ? host.data<double>()[i] : host.data<float>()[i]));
  return m;
}

/// Pairwise distinct values evenly spread over [lo, hi) in a seeded order: max pooling then has no tied maxima
/// (which maximum takes the gradient on a tie is each backend's own choice; the CPU gives it to the first).
Tensor distinct(const Shape& shape, uint64_t seed, double lo, double hi) {
  const int64_t n = shape.numel();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed, 0);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(rng.next_u32() % static_cast<uint32_t>(i + 1))]);
  Tensor t = Tensor::empty(shape, DType::f32);
  for (int64_t i = 0; i < n; ++i)
    t.data<float>()[i] = static_cast<float>(
        lo + (hi - lo) * (static_cast<double>(order[static_cast<size_t>(i)]) + 0.5) / static_cast<double>(n));
  return t;
}

// ---------------------------------------------------------------------------------------------------------------
// matmul

template <class T>
void check_matmul(int64_t m, int64_t n, int64_t k, bool ta, bool tb, double beta, uint64_t seed) {
  INFO("matmul m " << m << " n " << n << " k " << k << (ta ? " aᵀ" : "") << (tb ? " bᵀ" : "") << " beta " << beta
                   << (std::is_same_v<T, double> ? " f64" : " f32"));
  const Tensor a = seeded_as<T>(ta ? Shape{k, m} : Shape{m, k}, seed);
  const Tensor b = seeded_as<T>(tb ? Shape{n, k} : Shape{k, n}, seed + 1);
  const Tensor c0 = seeded_as<T>(Shape{m, n}, seed + 2);
  Tensor c_cpu = c0.clone();
  ops::matmul(a, ta, b, tb, c_cpu, beta);
  // With beta = 0 the old c must not be read: it starts as NaN.
  GuardedOf<T> c(Shape{m, n}, beta == 0 ? kNaN : 0.0);
  if (beta != 0) c.inner.copy_from(c0);
  ops::matmul(to_cuda(a), ta, to_cuda(b), tb, c.inner, beta);
  // K = k products of |a|, |b| ≤ 4 (file comment); beta·c adds one rounding of |c| ≤ 4, far inside it.
  check_close(c.host_checked(), c_cpu, kDot<T> * static_cast<double>(k) * 16, 0);
}

}  // namespace

TEST_CASE("CUDA matmul (cuBLASLt) matches the CPU for every transpose and beta 0 and 1", "[cuda]") {
  require_gpu();
  struct Dims {
    int64_t m, n, k;
  };
  uint64_t seed = 1000;
  for (const Dims d :
       {Dims{1, 1, 1}, Dims{7, 5, 3}, Dims{33, 17, 65}, Dims{128, 64, 256}, Dims{3, 1000, 10}, Dims{257, 3, 129}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (double beta : {0.0, 1.0}) check_matmul<float>(d.m, d.n, d.k, ta, tb, beta, seed += 3);
}

TEST_CASE("CUDA matmul in f64 matches the CPU", "[cuda]") {
  require_gpu();
  uint64_t seed = 2000;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_matmul<double>(37, 29, 71, ta, tb, ta ? 1.0 : 0.0, seed += 3);
}

namespace {

// `t` with each element replaced by the nearest value of `f` (nearest even), then moved up by `rel` of itself (exactly:
// the product has at most 24 significant bits). With rel half the format's smallest relative spacing (2^-8 for bf16,
// 2^-11 for fp16) each element stays less than half a spacing above its half value: the half product rounds it back,
// an fp32 product keeps the excess.
Tensor nudged_off_half(const Tensor& t, HalfFormat f, double rel) {
  Tensor r = Tensor::empty(t.shape(), DType::f32);
  round_to_half(f, t.data<float>(), r.data<float>(), static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < r.numel(); ++i) r.data<float>()[i] *= static_cast<float>(1 + rel);
  return r;
}

}  // namespace

TEST_CASE("CUDA matmul in bf16 and fp16 equals the CPU's half product and differs from fp32, for every transpose",
          "[cuda]") {
  require_gpu();
  const int64_t m = 45, n = 37, k = 256;
  // The CPU's half product and cuBLASLt's (16-bit A and B, f32 compute and C) multiply the same rounded operands
  // exactly and differ only in the order of the f32 sums: the file's tolerance, 1e-5·K·max|a|·max|b|.
  const double tol = kDot<float> * static_cast<double>(k) * 16;
  uint64_t seed = 3000;
  for (const Precision p : {Precision::bf16, Precision::fp16}) {
    const HalfFormat f = *half_format(p);
    const double rel = p == Precision::bf16 ? 0x1p-9 : 0x1p-12;
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool nudged : {false, true}) {
          INFO(to_string(p) << (ta ? " aᵀ" : "") << (tb ? " bᵀ" : "") << (nudged ? " nudged" : " plain"));
          // plain: seeded in [-4, 4); nudged: in [0.25, 4), each element a half value moved up by `rel`, so every
          // product of the fp32 sum is larger by about 2·rel and the terms do not cancel.
          Tensor a = seeded(ta ? Shape{k, m} : Shape{m, k}, seed += 3),
                 b = seeded(tb ? Shape{n, k} : Shape{k, n}, seed + 1);
          if (nudged) {
            a = nudged_off_half(seeded(a.shape(), seed, 0.25, 4), f, rel);
            b = nudged_off_half(seeded(b.shape(), seed + 1, 0.25, 4), f, rel);
          }
          Tensor cpu_fp32 = Tensor::empty(Shape{m, n}, DType::f32), cpu_half = Tensor::empty(Shape{m, n}, DType::f32);
          ops::matmul(a, ta, b, tb, cpu_fp32, 0.0);
          Guarded c(Shape{m, n}, kNaN);
          const Tensor ad = to_cuda(a), bd = to_cuda(b);
          {
            const ProductPrecisionScope autocast(p);
            ops::matmul(a, ta, b, tb, cpu_half, 0.0);
            ops::matmul(ad, ta, bd, tb, c.inner, 0.0);
          }
          const Tensor got = c.host_checked();
          check_close(got, cpu_half, tol, 0);
          if (nudged) {
            // The sums are ~256 · 2.1² ≈ 1150 (the smallest of these 1665 about 950), so fp32's excess is ≈ 2·rel·sum:
            // ≈ 4.5 (bf16) and ≈ 0.56 (fp16), at least ≈ 3.7 and ≈ 0.46, where the tolerance is 0.041. The CUDA
            // result must sit at the half product's, not fp32's.
            double least = 1e300;
            for (int64_t i = 0; i < got.numel(); ++i)
              least = std::min(least, static_cast<double>(cpu_fp32.data<float>()[i]) - got.data<float>()[i]);
            CHECK(least > 5 * tol);
          }
        }
  }
  // Outside the scope the same shapes multiply in fp32 again (a half plan is its own plan): on bf16-nudged operands,
  // where a bf16 product would be ≈ 3.7 or more below fp32's.
  const Tensor a = nudged_off_half(seeded(Shape{m, k}, 3100, 0.25, 4), HalfFormat::bf16, 0x1p-9);
  const Tensor b = nudged_off_half(seeded(Shape{k, n}, 3101, 0.25, 4), HalfFormat::bf16, 0x1p-9);
  Tensor cpu = Tensor::empty(Shape{m, n}, DType::f32);
  ops::matmul(a, false, b, false, cpu, 0.0);
  Guarded c(Shape{m, n}, kNaN);
  ops::matmul(to_cuda(a), false, to_cuda(b), false, c.inner, 0.0);
  check_close(c.host_checked(), cpu, tol, 0);
}

TEST_CASE(
    "CUDA converts a weight to 16 bits once per scope: its forward makes the copy, dx = dy·W and a second "
    "micro-batch read it, the next scope converts the updated values",
    "[cuda]") {
  require_gpu();
  const int64_t m = 32, n = 24, k = 40;
  const Tensor x = seeded(Shape{m, k}, 3200), dy = seeded(Shape{m, n}, 3201), none{};
  Tensor w = seeded(Shape{n, k}, 3202);
  const Tensor xd = to_cuda(x), dyd = to_cuda(dy);
  Tensor wd = to_cuda(w);
  auto stats = [] { return cuda::half_weight_cache_stats(); };
  const double tol = kDot<float> * static_cast<double>(k) * 16;
  // y = x·wᵀ and dx = dy·W on both devices in one scope, twice (two micro-batches); CUDA's against the CPU's.
  auto step = [&](Precision p, uint64_t want_roundings, uint64_t want_reuses) {
    Tensor cpu_y = Tensor::empty(Shape{m, n}, DType::f32), cpu_dx = Tensor::empty(Shape{m, k}, DType::f32);
    Guarded y(Shape{m, n}, kNaN), dx(Shape{m, k}, kNaN);
    const ProductPrecisionScope autocast(p);
    const HalfWeightCacheStats before = stats();
    for (int micro = 0; micro < 2; ++micro) {
      ops::linear_forward(xd, wd, none, y.inner);
      ops::matmul(dyd, false, wd, false, dx.inner, 0.0);
    }
    CHECK(stats().roundings - before.roundings == want_roundings);
    CHECK(stats().reuses - before.reuses == want_reuses);
    CHECK(stats().bytes >= static_cast<size_t>(w.numel()) * 2);
    ops::linear_forward(x, w, none, cpu_y);
    ops::matmul(dy, false, w, false, cpu_dx, 0.0);
    check_close(y.host_checked(), cpu_y, tol, 0);
    check_close(dx.host_checked(), cpu_dx, tol, 0);
  };
  step(Precision::bf16, 1, 3);  // made by the first forward, read by its dx, the second forward and its dx
  // The optimizer changes w between steps: the next scope converts the new values, in fp16 too.
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] += 0.25f;
  wd.copy_from(w);
  step(Precision::bf16, 1, 3);
  step(Precision::fp16, 1, 3);
  // A weight no product read in the last scope gives its block back when the next one reads anything.
  { const ProductPrecisionScope idle(Precision::bf16); }
  {
    const ProductPrecisionScope next(Precision::bf16);
    CHECK(stats().entries == 0);
  }
}

TEST_CASE("CUDA matmul on views that start off cuBLASLt's preferred 256-byte alignment", "[cuda]") {
  require_gpu();
  // Rows 1.. of tensors with an odd row length: the views start 4·(row length) bytes in, 4-byte aligned only, as a
  // slice of a batch can. The plan must be chosen for that alignment.
  const int64_t m = 9, n = 11, k = 13;
  const Tensor a_big = seeded(Shape{m + 1, k}, 31), b_big = seeded(Shape{k + 1, n}, 32);
  const Tensor a = a_big.slice0(1, m), b = b_big.slice0(1, k);
  Tensor c_cpu = Tensor::empty(Shape{m, n}, DType::f32);
  ops::matmul(a, false, b, false, c_cpu, 0.0);
  const Tensor ad = to_cuda(a_big), bd = to_cuda(b_big);
  Guarded c_big(Shape{m + 1, n}, 0.0f);
  Tensor c = c_big.inner.slice0(1, m);
  ops::matmul(ad.slice0(1, m), false, bd.slice0(1, k), false, c, 0.0);
  const Tensor got = c_big.host_checked().slice0(1, m);
  check_close(got, c_cpu, 1e-5 * k * 16, 0);               // K = k products of |a|, |b| ≤ 4 (file comment)
  REQUIRE(c_big.host_checked().data<float>()[0] == 0.0f);  // row 0 is outside the view: untouched
}

// ---------------------------------------------------------------------------------------------------------------
// conv2d

namespace {

struct ConvCase {
  int64_t batch, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  bool bias;
};

// fp32 by default; under a bf16/fp16 precision both sides run in `p` (ops/precision.h): they multiply the same
// rounded operands, and cuDNN's legacy API hands y, dx and dw back rounded to 16 bits once more (ops/cuda/conv2d.cpp),
// which the CPU does not: `rel` of each value (and of dw's beta·dw0 with |dw0| < 4) on top of the sums' tolerance.
template <class T>
void check_conv(const ConvCase& cc, uint64_t seed, Precision p = Precision::fp32) {
  const double rel = p == Precision::bf16 ? 0x1p-8 : p == Precision::fp16 ? 0x1p-11 : 0.0;
  const ProductPrecisionScope autocast(p);
  const Window2d win{cc.kh, cc.kw, cc.sh, cc.sw, cc.ph, cc.pw, cc.dh, cc.dw};
  const int64_t oh = window_out(cc.h, cc.kh, cc.sh, cc.ph, cc.dh), ow = window_out(cc.w, cc.kw, cc.sw, cc.pw, cc.dw);
  INFO("conv x (" << cc.batch << ", " << cc.cin << ", " << cc.h << ", " << cc.w << ") → " << cc.cout << " channels, "
                  << cc.kh << "×" << cc.kw << " stride " << cc.sh << "×" << cc.sw << " padding " << cc.ph << "×"
                  << cc.pw << " dilation " << cc.dh << "×" << cc.dw << " groups " << cc.groups
                  << (cc.bias ? " bias" : "") << (std::is_same_v<T, double> ? " f64" : " f32") << " " << to_string(p));
  const Shape xs{cc.batch, cc.cin, cc.h, cc.w}, ws{cc.cout, cc.cin / cc.groups, cc.kh, cc.kw},
      ys{cc.batch, cc.cout, oh, ow};
  const Tensor x = seeded_as<T>(xs, seed), w = seeded_as<T>(ws, seed + 1), dy = seeded_as<T>(ys, seed + 3);
  const Tensor b = cc.bias ? seeded_as<T>(Shape{cc.cout}, seed + 2) : Tensor();
  const Tensor xd = to_cuda(x), wd = to_cuda(w), dyd = to_cuda(dy), bd = cc.bias ? to_cuda(b) : Tensor();

  Tensor y_cpu = Tensor::empty(ys, kDType<T>);
  ops::conv2d_forward(x, w, b, win, cc.groups, y_cpu);
  GuardedOf<T> y(ys, kNaN);  // every output is written: NaN would survive a skipped one
  ops::conv2d_forward(xd, wd, bd, win, cc.groups, y.inner);
  // y: K = (C/groups)·kh·kw products of |x|, |w| ≤ 4; the bias adds one rounding of |b| ≤ 4. A half plan rounds the
  // product to 16 bits before the f32 bias is added (conv2d.cpp), so its relative error is of the product's size,
  // |y − b|, which exceeds |y| where the bias cancels part of it (seen on an H200: 0.0121 apart at y = −0.74).
  const double k_fwd = static_cast<double>(cc.cin / cc.groups * cc.kh * cc.kw);
  if (rel > 0 && cc.bias) {
    const Tensor got = y.host_checked();
    const int64_t plane = oh * ow;
    for (int64_t i = 0; i < y_cpu.numel(); ++i) {
      const double a = got.data<T>()[i], want = y_cpu.data<T>()[i];
      const double product = want - static_cast<double>(b.data<T>()[(i / plane) % cc.cout]);
      INFO("element " << i << ": cuda " << a << " cpu " << want << " (product " << product << ")");
      REQUIRE(std::abs(a - want) <= kDot<T> * k_fwd * 16 + rel * std::abs(product));
    }
  } else {
    check_close(y.host_checked(), y_cpu, kDot<T> * k_fwd * 16, rel);
  }

  // beta = 0 with dx (dw and db start as NaN: they must not be read); beta = 1 without dx, accumulating.
  for (const double beta : {0.0, 1.0}) {
    INFO("backward beta " << beta);
    const bool want_dx = beta == 0;
    const Tensor dw0 = seeded_as<T>(ws, seed + 4), db0 = seeded_as<T>(Shape{cc.cout}, seed + 5);
    Tensor dx_cpu = want_dx ? Tensor::empty(xs, kDType<T>) : Tensor();
    Tensor dw_cpu = dw0.clone(), db_cpu = cc.bias ? db0.clone() : Tensor();
    ops::conv2d_backward(x, w, dy, win, cc.groups, dx_cpu, dw_cpu, db_cpu, beta);

    GuardedOf<T> dx(xs, kNaN), dw(ws, kNaN), db(Shape{cc.cout}, kNaN);
    if (beta != 0) {
      dw.inner.copy_from(dw0);
      db.inner.copy_from(db0);
    }
    Tensor no_dx, no_db;
    ops::conv2d_backward(xd, wd, dyd, win, cc.groups, want_dx ? dx.inner : no_dx, dw.inner, cc.bias ? db.inner : no_db,
                         beta);
    // dx: each element sums (O/groups)·kh·kw products of |dy|, |w| ≤ 4 at most.
    if (want_dx)
      check_close(dx.host_checked(), dx_cpu, kDot<T> * static_cast<double>(cc.cout / cc.groups * cc.kh * cc.kw) * 16,
                  rel);
    // dw: B·oh·ow products of |dy|, |x| ≤ 4, plus beta·dw0; db: B·oh·ow values of |dy| ≤ 4.
    const double k_w = static_cast<double>(cc.batch * oh * ow);
    check_close(dw.host_checked(), dw_cpu, kDot<T> * k_w * 16 + rel * 8, rel);
    if (cc.bias)
      check_close(db.host_checked(), db_cpu, kDot<T> * k_w * 4, 0);
    else
      db.host_checked(true);  // untouched, sentinels included
  }
}

}  // namespace

TEST_CASE("CUDA conv2d (cuDNN) matches the CPU, forward and backward", "[cuda]") {
  require_gpu();
  const ConvCase cases[] = {
      {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},      // the common 3×3 "same" convolution
      {1, 4, 7, 9, 6, 3, 2, 2, 2, 1, 0, 1, 1, 2, true},      // batch 1, odd non-square, stride 2, groups 2
      {3, 6, 10, 11, 6, 3, 3, 1, 2, 2, 2, 2, 2, 3, false},   // dilation 2, groups 3, uneven strides, no bias
      {2, 8, 5, 5, 16, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},     // 1×1
      {2, 4, 9, 9, 4, 3, 3, 2, 2, 1, 1, 1, 1, 4, true},      // depthwise
      {2, 16, 12, 12, 32, 5, 5, 1, 1, 2, 2, 1, 1, 1, true},  // K = 400
      {4, 3, 6, 5, 2, 2, 4, 3, 1, 0, 2, 1, 2, 1, true},      // stride 3 × 1, padding on one axis, dilated width
  };
  uint64_t seed = 3000;
  for (const ConvCase& cc : cases) check_conv<float>(cc, seed += 10);
}

TEST_CASE("CUDA conv2d in f64 matches the CPU", "[cuda]") {
  require_gpu();
  check_conv<double>({2, 4, 7, 6, 6, 3, 3, 2, 1, 1, 1, 1, 1, 2, true}, 3500);
}

TEST_CASE("CUDA conv2d in bf16, fp16 and tf32 matches the CPU's product in that precision", "[cuda]") {
  require_gpu();
  const ConvCase cases[] = {
      {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},      // 3×3 "same"
      {1, 4, 7, 9, 6, 3, 2, 2, 2, 1, 0, 1, 1, 2, true},      // odd sides, stride 2, groups 2
      {2, 16, 12, 12, 32, 5, 5, 1, 1, 2, 2, 1, 1, 1, false}  // K = 400, no bias
  };
  uint64_t seed = 3600;
  for (const Precision p : {Precision::bf16, Precision::fp16})
    for (const ConvCase& cc : cases) check_conv<float>(cc, seed += 10, p);
  // tf32: the CPU multiplies in fp32 and the tensor cores round both operands to 10 mantissa bits first, so the
  // CPU's tf32 product (fp32) and the device's differ by up to 2·2⁻¹¹ of each term: checked against that bound.
  const ConvCase cc{2, 8, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true};
  const Window2d win{cc.kh, cc.kw, cc.sh, cc.sw, cc.ph, cc.pw, cc.dh, cc.dw};
  const Tensor x = seeded(Shape{2, 8, 6, 6}, 3700), w = seeded(Shape{8, 8, 3, 3}, 3701), b = seeded(Shape{8}, 3702);
  Tensor y_cpu = Tensor::empty(Shape{2, 8, 6, 6}, DType::f32);
  ops::conv2d_forward(x, w, b, win, 1, y_cpu);
  Guarded y(y_cpu.shape(), kNaN);
  {
    const ProductPrecisionScope autocast(Precision::tf32);
    ops::conv2d_forward(to_cuda(x), to_cuda(w), to_cuda(b), win, 1, y.inner);
  }
  check_close(y.host_checked(), y_cpu, 72 * 16 * 0x1p-10, 0);  // K = 72 terms of |x·w| ≤ 16
}

// ---------------------------------------------------------------------------------------------------------------
// pool2d

namespace {

struct PoolCase {
  int64_t batch, ch, h, w, kh, kw, sh, sw, ph, pw;
};

template <class T>
void check_pool(PoolKind kind, const PoolCase& pc, double lo, double hi, uint64_t seed) {
  const Window2d win{pc.kh, pc.kw, pc.sh, pc.sw, pc.ph, pc.pw};
  const int64_t oh = window_out(pc.h, pc.kh, pc.sh, pc.ph, 1), ow = window_out(pc.w, pc.kw, pc.sw, pc.pw, 1);
  INFO((kind == PoolKind::max ? "max" : "avg")
       << " pool (" << pc.batch << ", " << pc.ch << ", " << pc.h << ", " << pc.w << ") window " << pc.kh << "×" << pc.kw
       << " stride " << pc.sh << "×" << pc.sw << " padding " << pc.ph << "×" << pc.pw << " inputs in [" << lo << ", "
       << hi << ")" << (std::is_same_v<T, double> ? " f64" : " f32"));
  const Shape xs{pc.batch, pc.ch, pc.h, pc.w}, ys{pc.batch, pc.ch, oh, ow};
  const Tensor x = as<T>(distinct(xs, seed, lo, hi)), dy = seeded_as<T>(ys, seed + 1);
  Tensor y_cpu = Tensor::empty(ys, kDType<T>), dx_cpu = Tensor::empty(xs, kDType<T>);
  ops::pool2d_forward(kind, x, win, y_cpu);
  ops::pool2d_backward(kind, x, dy, win, dx_cpu);

  const Tensor xd = to_cuda(x), dyd = to_cuda(dy);
  GuardedOf<T> y(ys, kNaN), dx(xs, kNaN);
  ops::pool2d_forward(kind, xd, win, y.inner);
  ops::pool2d_backward(kind, xd, dyd, win, dx.inner);
  const double area = static_cast<double>(pc.kh * pc.kw), eps = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  if (kind == PoolKind::max) {
    // A maximum is one of the inputs, exactly; padding never wins (all-negative inputs check that it is not a 0).
    check_close(y.host_checked(), y_cpu, 0, 0);
    // An input collects dy from each of the ≤ kh·kw windows it is the maximum of, summed in any order.
    check_close(dx.host_checked(), dx_cpu, eps * area * max_abs(dy), 0);
  } else {
    // A sum of kh·kw terms x/(kh·kw) (padding counts in the divisor): rounding ≤ kh·kw·u·max|x|, with u ≤ 6e-8 < 1e-6.
    check_close(y.host_checked(), y_cpu, eps * area * max_abs(x), 0);
    check_close(dx.host_checked(), dx_cpu, eps * area * max_abs(dy), 0);
  }
}

}  // namespace

TEST_CASE("CUDA pool2d (cuDNN) matches the CPU, max and average, forward and backward", "[cuda]") {
  require_gpu();
  const PoolCase cases[] = {
      {2, 3, 8, 8, 2, 2, 2, 2, 0, 0},  // the 2×2 window of most CNNs
      {1, 2, 7, 9, 3, 3, 2, 2, 1, 1},  // batch 1, odd sizes, padding
      {2, 2, 6, 7, 3, 2, 1, 2, 1, 0},  // overlapping windows (stride 1 down the rows), non-square
      {2, 3, 5, 5, 2, 2, 2, 2, 0, 0},  // odd input: the last row and column fall out (floor mode)
      {2, 4, 6, 5, 6, 5, 1, 1, 0, 0},  // the whole plane (global_avgpool's window)
  };
  uint64_t seed = 4000;
  for (const PoolCase& pc : cases)
    for (PoolKind kind : {PoolKind::max, PoolKind::avg}) {
      check_pool<float>(kind, pc, -4, 4, seed += 2);
      if (pc.ph > 0) check_pool<float>(kind, pc, -5, -1, seed += 2);  // padding must not act as a 0 maximum
    }
}

TEST_CASE("CUDA pool2d in f64 matches the CPU", "[cuda]") {
  require_gpu();
  for (PoolKind kind : {PoolKind::max, PoolKind::avg})
    check_pool<double>(kind, {2, 3, 7, 6, 3, 3, 2, 2, 1, 1}, -3, -1, 4500);
}

// ---------------------------------------------------------------------------------------------------------------
// batchnorm

namespace {

// Tolerances of the statistics. Per channel they are sums of N = B·S ≤ 100 terms of inputs in [-1, 3): the mean is
// within N·u·max|x| ≤ 1e-5·max|x|, and the variance (cuDNN may form it as E[x²] − E[x]², losing E[x²]/Var ≈ 2×
// more) within 1e-4 relative. Everything derived from them (y, the running statistics, the gradients) inherits
// those relative errors on top of its own sums.
template <class T>
constexpr double kStatRel = std::is_same_v<T, float> ? 1e-4 : 1e-11;

template <class T>
void check_batchnorm(const Shape& xs, uint64_t seed) {
  INFO("batchnorm x " << xs.str() << (std::is_same_v<T, double> ? " f64" : " f32"));
  const int64_t ch = xs[1], n = xs.numel() / ch;  // n = B·S values per channel
  const Shape cs{ch};
  const double momentum = 0.1, eps = 1e-5;
  const Tensor x1 = seeded_as<T>(xs, seed, -1, 3), x2 = seeded_as<T>(xs, seed + 1, -1, 3);
  const Tensor gamma = seeded_as<T>(cs, seed + 2, 0.5, 1.5), beta = seeded_as<T>(cs, seed + 3, -1, 1);
  const Tensor rm0 = seeded_as<T>(cs, seed + 4, -0.5, 0.5), rv0 = seeded_as<T>(cs, seed + 5, 0.5, 1.5);
  const Tensor dy = seeded_as<T>(xs, seed + 6);
  const double mx = 3, mdy = max_abs(dy);

  // The CPU: two training steps (the running statistics blend twice), the backward pass of the second with beta 0
  // and then 1, then evaluation forward and backward.
  Tensor rm_cpu = rm0.clone(), rv_cpu = rv0.clone(), sm_cpu = Tensor::empty(cs, kDType<T>),
         si_cpu = Tensor::empty(cs, kDType<T>), y_cpu = Tensor::empty(xs, kDType<T>);
  const Tensor dg0 = seeded_as<T>(cs, seed + 7), db0 = seeded_as<T>(cs, seed + 8);
  ops::batchnorm_forward(x1, gamma, beta, rm_cpu, rv_cpu, momentum, eps, true, sm_cpu, si_cpu, y_cpu);
  ops::batchnorm_forward(x2, gamma, beta, rm_cpu, rv_cpu, momentum, eps, true, sm_cpu, si_cpu, y_cpu);
  Tensor dx_cpu = Tensor::empty(xs, kDType<T>), dg_cpu = Tensor::empty(cs, kDType<T>),
         db_cpu = Tensor::empty(cs, kDType<T>);
  ops::batchnorm_backward(x2, gamma, sm_cpu, si_cpu, dy, true, dx_cpu, dg_cpu, db_cpu, 0.0);
  Tensor dg1_cpu = dg0.clone(), db1_cpu = db0.clone(), no_dx_cpu;
  ops::batchnorm_backward(x2, gamma, sm_cpu, si_cpu, dy, true, no_dx_cpu, dg1_cpu, db1_cpu, 1.0);

  // The GPU, the same sequence.
  const Tensor x1d = to_cuda(x1), x2d = to_cuda(x2), gd = to_cuda(gamma), bd = to_cuda(beta), dyd = to_cuda(dy);
  GuardedOf<T> rm(cs), rv(cs), sm(cs, kNaN), si(cs, kNaN), y(xs, kNaN);
  rm.inner.copy_from(rm0);
  rv.inner.copy_from(rv0);
  ops::batchnorm_forward(x1d, gd, bd, rm.inner, rv.inner, momentum, eps, true, sm.inner, si.inner, y.inner);
  ops::batchnorm_forward(x2d, gd, bd, rm.inner, rv.inner, momentum, eps, true, sm.inner, si.inner, y.inner);
  check_close(sm.host_checked(), sm_cpu, kStatRel<T> * 0.1 * mx, 0);
  check_close(si.host_checked(), si_cpu, 0, kStatRel<T>);
  check_close(rm.host_checked(), rm_cpu, kStatRel<T> * 0.1 * mx, 0);
  check_close(rv.host_checked(), rv_cpu, 0, kStatRel<T>);  // unbiased, as PyTorch keeps it
  // y = γ·(x − mean)·invstd + β with |γ| ≤ 1.5, |x − mean|·invstd ≲ 3: the statistics' errors, scaled.
  check_close(y.host_checked(), y_cpu, kStatRel<T> * 1.5 * 3 * 2, 0);

  GuardedOf<T> dx(xs, kNaN), dg(cs, kNaN), db(cs, kNaN);
  Tensor no_dx;
  ops::batchnorm_backward(x2d, gd, sm.inner, si.inner, dyd, true, dx.inner, dg.inner, db.inner, 0.0);
  // dgamma = Σ dy·x̂ over n terms (|x̂| ≲ 3), dbeta = Σ dy; both sides also use their own statistics (kStatRel).
  const double nn = static_cast<double>(n);
  check_close(dg.host_checked(), dg_cpu, kDot<T> * nn * mdy * 3, kStatRel<T>);
  check_close(db.host_checked(), db_cpu, kDot<T> * nn * mdy, 0);
  // dx = γ·invstd·(dy − mean(dy) − x̂·mean(dy·x̂)): three terms of the size of max|dx|, each accurate to kStatRel.
  check_close(dx.host_checked(), dx_cpu, kStatRel<T> * 3 * max_abs(dx_cpu), 0);
  dg.inner.copy_from(dg0);
  db.inner.copy_from(db0);
  ops::batchnorm_backward(x2d, gd, sm.inner, si.inner, dyd, true, no_dx, dg.inner, db.inner, 1.0);
  check_close(dg.host_checked(), dg1_cpu, kDot<T> * nn * mdy * 3, kStatRel<T>);
  check_close(db.host_checked(), db1_cpu, kDot<T> * nn * mdy, 0);

  // Evaluation: the running statistics normalise; save_mean/save_invstd hold them for the backward pass.
  Tensor esm_cpu = Tensor::empty(cs, kDType<T>), esi_cpu = Tensor::empty(cs, kDType<T>),
         ey_cpu = Tensor::empty(xs, kDType<T>);
  ops::batchnorm_forward(x1, gamma, beta, rm_cpu, rv_cpu, momentum, eps, false, esm_cpu, esi_cpu, ey_cpu);
  Tensor edx_cpu = Tensor::empty(xs, kDType<T>), edg_cpu = dg0.clone(), edb_cpu = db0.clone();
  ops::batchnorm_backward(x1, gamma, esm_cpu, esi_cpu, dy, false, edx_cpu, edg_cpu, edb_cpu, 1.0);
  // The GPU starts from the CPU's running statistics, so only this pass's arithmetic differs.
  rm.inner.copy_from(rm_cpu);
  rv.inner.copy_from(rv_cpu);
  GuardedOf<T> ey(xs, kNaN), edx(xs, kNaN);
  ops::batchnorm_forward(x1d, gd, bd, rm.inner, rv.inner, momentum, eps, false, sm.inner, si.inner, ey.inner);
  const double fine = std::is_same_v<T, float> ? 1e-6 : 1e-14;  // a few roundings of one expression
  check_close(rm.host_checked(), rm_cpu, 0, 0);                 // evaluation leaves the running statistics alone
  check_close(rv.host_checked(), rv_cpu, 0, 0);
  check_close(sm.host_checked(), esm_cpu, 0, 0);     // a copy of the running mean
  check_close(si.host_checked(), esi_cpu, 0, fine);  // 1/√(var + eps) in double on both sides
  check_close(ey.host_checked(), ey_cpu, fine * 10, fine * 10);
  dg.inner.copy_from(dg0);
  db.inner.copy_from(db0);
  ops::batchnorm_backward(x1d, gd, sm.inner, si.inner, dyd, false, edx.inner, dg.inner, db.inner, 1.0);
  check_close(edx.host_checked(), edx_cpu, 0, fine);  // γ·invstd·dy, one product
  // With the running statistics |x̂| ≤ 3.5/√0.4 < 6 (running variance ≥ 0.81·0.5 after two blends).
  check_close(dg.host_checked(), edg_cpu, kDot<T> * nn * mdy * 6, 0);
  check_close(db.host_checked(), edb_cpu, kDot<T> * nn * mdy, 0);
}

}  // namespace

TEST_CASE("CUDA batchnorm (cuDNN) matches the CPU in training and evaluation, forward and backward", "[cuda]") {
  require_gpu();
  uint64_t seed = 5000;
  for (const Shape& xs : {Shape{2, 3, 4, 5}, Shape{1, 4, 3, 3}, Shape{8, 5}, Shape{16, 7}, Shape{3, 2, 7}})
    check_batchnorm<float>(xs, seed += 10);
}

TEST_CASE("CUDA batchnorm in f64 matches the CPU", "[cuda]") {
  require_gpu();
  check_batchnorm<double>(Shape{4, 3, 5, 5}, 5500);
}

TEST_CASE("CUDA batchnorm refuses an eps below cuDNN's minimum", "[cuda]") {
  require_gpu();
  const Shape xs{4, 2, 3, 3}, cs{2};
  const Tensor x = to_cuda(seeded(xs, 1)), g = to_cuda(seeded(cs, 2)), b = to_cuda(seeded(cs, 3));
  Tensor rm = Tensor::zeros(cs, DType::f32, Device::cuda(0)), rv = Tensor::zeros(cs, DType::f32, Device::cuda(0));
  Tensor sm = Tensor::zeros(cs, DType::f32, Device::cuda(0)), si = Tensor::zeros(cs, DType::f32, Device::cuda(0));
  Tensor y = Tensor::empty(xs, DType::f32, Device::cuda(0));
  REQUIRE_THROWS_WITH(ops::batchnorm_forward(x, g, b, rm, rv, 0.1, -1e-3, true, sm, si, y), Catch::Contains("eps"));
}

// ---------------------------------------------------------------------------------------------------------------
// plans

TEST_CASE("CUDA dnn ops make one plan per shape and reuse it", "[cuda]") {
  require_gpu();
  // Shapes no other test uses, so the first call here is a miss whatever ran before.
  const Tensor a = to_cuda(seeded(Shape{19, 23}, 1)), b = to_cuda(seeded(Shape{23, 29}, 2));
  Tensor c = Tensor::empty(Shape{19, 29}, DType::f32, Device::cuda(0));
  const cuda::DnnPlanCounts p0 = cuda::dnn_plan_counts();
  ops::matmul(a, false, b, false, c, 0.0);
  ops::matmul(a, false, b, false, c, 1.0);  // beta ≠ 0 is its own plan
  ops::matmul(a, false, b, false, c, 1.0);
  ops::matmul(a, false, b, false, c, 0.0);
  REQUIRE(cuda::dnn_plan_counts().matmul - p0.matmul == 2);

  const Window2d win{3, 3, 1, 1, 1, 1};
  const Tensor x = to_cuda(seeded(Shape{3, 5, 11, 13}, 3)), w = to_cuda(seeded(Shape{7, 5, 3, 3}, 4));
  const Tensor bias = to_cuda(seeded(Shape{7}, 5)), dy = to_cuda(seeded(Shape{3, 7, 11, 13}, 6));
  Tensor y = Tensor::empty(Shape{3, 7, 11, 13}, DType::f32, Device::cuda(0));
  Tensor dx = Tensor::empty(x.shape(), DType::f32, Device::cuda(0)),
         dw = Tensor::empty(w.shape(), DType::f32, Device::cuda(0));
  Tensor db = Tensor::empty(Shape{7}, DType::f32, Device::cuda(0));
  for (int step = 0; step < 3; ++step) {  // forward and backward share the plan of their shape
    ops::conv2d_forward(x, w, bias, win, 1, y);
    ops::conv2d_backward(x, w, dy, win, 1, dx, dw, db, step == 0 ? 0.0 : 1.0);
  }
  REQUIRE(cuda::dnn_plan_counts().conv - p0.conv == 1);

  const Window2d pw{3, 3, 2, 2, 1, 1};
  Tensor py = Tensor::empty(Shape{3, 7, 6, 7}, DType::f32, Device::cuda(0));
  Tensor dy_in = Tensor::empty(y.shape(), DType::f32, Device::cuda(0));  // a gradient w.r.t. y, the pool's input
  for (int step = 0; step < 3; ++step) {
    ops::pool2d_forward(PoolKind::max, y, pw, py);
    ops::pool2d_backward(PoolKind::max, y, py, pw, dy_in);
  }
  REQUIRE(cuda::dnn_plan_counts().pool - p0.pool == 1);

  const Shape cs{7};
  Tensor g = to_cuda(seeded(cs, 7, 0.5, 1.5)), be = to_cuda(seeded(cs, 8)),
         rm = Tensor::zeros(cs, DType::f32, Device::cuda(0));
  Tensor rv = to_cuda(seeded(cs, 9, 0.5, 1.5)), sm = Tensor::empty(cs, DType::f32, Device::cuda(0)),
         si = Tensor::empty(cs, DType::f32, Device::cuda(0)), dg = Tensor::empty(cs, DType::f32, Device::cuda(0)),
         dbe = Tensor::empty(cs, DType::f32, Device::cuda(0)),
         yn = Tensor::empty(y.shape(), DType::f32, Device::cuda(0));
  for (int step = 0; step < 3; ++step) {
    ops::batchnorm_forward(y, g, be, rm, rv, 0.1, 1e-5, true, sm, si, yn);
    ops::batchnorm_backward(y, g, sm, si, dy, true, dy_in, dg, dbe, 0.0);
  }
  REQUIRE(cuda::dnn_plan_counts().batchnorm - p0.batchnorm == 1);
}
