// CUDA kernels of the reduction, loss, normalisation, dropout, embedding and optimizer ops against their CPU twins on
// the same seeded inputs. Every case starts with require_gpu(): without a device it exits 77 (skipped).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

#include "cuda_helpers.h"
#include "ops/attention.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/half_storage.h"
#include "ops/layernorm.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/optim.h"
#include "ops/precision.h"
#include "ops/softmax.h"

using namespace gt;
using namespace gt::test;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

/// A guarded f32 CUDA copy of a host tensor.
Guarded guarded_copy(const Tensor& host) {
  Guarded g(host.shape());
  g.inner.copy_from(host);
  return g;
}
Guarded64 guarded_copy64(const Tensor& host) {
  Guarded64 g(host.shape());
  g.inner.copy_from(host);
  return g;
}

double at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::f64 ? t.data<double>()[i] : static_cast<double>(t.data<float>()[i]);
}

Tensor to_f64(const Tensor& f32) {
  Tensor t = Tensor::empty(f32.shape(), DType::f64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = f32.data<float>()[i];
  return t;
}

Tensor host_f64(std::initializer_list<double> values) {
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(values.size())}, DType::f64);
  int64_t i = 0;
  for (double v : values) t.data<double>()[i++] = v;
  return t;
}

/// Like check_close, but a NaN or an infinity on the CPU must be the same on CUDA.
void check_close_nonfinite(const Tensor& cuda_host, const Tensor& cpu, double atol, double rtol) {
  REQUIRE(cuda_host.numel() == cpu.numel());
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double a = at(cuda_host, i), b = at(cpu, i);
    INFO("element " << i << ": cuda " << a << " cpu " << b);
    if (std::isnan(b))
      REQUIRE(std::isnan(a));
    else if (std::isinf(b))
      REQUIRE(a == b);
    else
      REQUIRE(std::abs(a - b) <= atol + rtol * std::abs(b));
  }
}

/// Bit-for-bit equal values (NaN matching NaN): for ops whose CUDA arithmetic is the CPU's, operation for operation.
/// No tolerance leaves |Δ| ≤ 0, so a finite value must be the CPU's as an infinity must.
void check_exact(const Tensor& cuda_host, const Tensor& cpu) { check_close_nonfinite(cuda_host, cpu, 0, 0); }

/// Sums compared element by element: |Δ| ≤ rtol·|cpu| + atol_per_unit·magnitude[i], where magnitude[i] = Σ|terms|
/// of that sum (the scale a reordered or differently rounded sum's error grows with).
void check_sums(const Tensor& cuda_host, const Tensor& cpu, const std::vector<double>& magnitude, double atol_per_unit,
                double rtol) {
  REQUIRE(cuda_host.numel() == cpu.numel());
  REQUIRE(static_cast<int64_t>(magnitude.size()) == cpu.numel());
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double a = at(cuda_host, i), b = at(cpu, i);
    INFO("sum " << i << ": cuda " << a << " cpu " << b << " magnitude " << magnitude[static_cast<size_t>(i)]);
    REQUIRE(std::abs(a - b) <= rtol * std::abs(b) + atol_per_unit * magnitude[static_cast<size_t>(i)]);
  }
}

/// Σ_r |m[r, j]| per column j of a (rows, cols) host tensor, plus |add[j]| when `add` is defined.
std::vector<double> column_magnitude(const Tensor& m, int64_t rows, int64_t cols, const Tensor& add = Tensor{}) {
  std::vector<double> mag(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) mag[static_cast<size_t>(j)] += std::abs(at(m, r * cols + j));
  if (add.defined())
    for (int64_t j = 0; j < cols; ++j) mag[static_cast<size_t>(j)] += std::abs(at(add, j));
  return mag;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Element-wise and block ops: the same single IEEE operation per element on both sides, so bit-for-bit equal.

TEST_CASE("CUDA add_row_bias, add and scale_by equal the CPU bit for bit", "[cuda]") {
  require_gpu();
  const int64_t rows = 129, cols = 301;
  const Tensor y0 = seeded(Shape{rows, cols}, 11), bias = seeded(Shape{cols}, 12),
               other = seeded(Shape{rows, cols}, 13);

  Tensor y_cpu = y0.clone();
  ops::add_row_bias(y_cpu, bias);
  Guarded y = guarded_copy(y0);
  ops::add_row_bias(y.inner, to_cuda(bias));
  check_exact(y.host_checked(), y_cpu);

  Tensor sum_cpu = Tensor::empty(y0.shape(), DType::f32);
  ops::add(y0, other, sum_cpu);
  Guarded sum(y0.shape());
  ops::add(to_cuda(y0), to_cuda(other), sum.inner);
  check_exact(sum.host_checked(), sum_cpu);
  Guarded in_place = guarded_copy(y0);  // y may be one of the inputs
  ops::add(in_place.inner, to_cuda(other), in_place.inner);
  check_exact(in_place.host_checked(), sum_cpu);

  const Tensor k_host = host_f64({0.3125});
  Tensor s_cpu = y0.clone();
  ops::scale_by(s_cpu, k_host);
  Guarded s = guarded_copy(y0);
  ops::scale_by(s.inner, to_cuda(k_host));
  check_exact(s.host_checked(), s_cpu);

  // f64 goes through the other instantiation.
  const Tensor y64 = to_f64(y0), b64 = to_f64(bias);
  Tensor y64_cpu = y64.clone();
  ops::add_row_bias(y64_cpu, b64);
  Guarded64 y64_cuda = guarded_copy64(y64);
  ops::add_row_bias(y64_cuda.inner, to_cuda(b64));
  check_exact(y64_cuda.host_checked(), y64_cpu);
}

TEST_CASE("CUDA copy_blocks and split_blocks move the CPU's elements and no others", "[cuda]") {
  require_gpu();
  const int64_t outer = 37, src_inner = 13, dst_inner = 29, offset = 7;
  for (bool f64 : {false, true}) {
    INFO((f64 ? "f64" : "f32"));
    const Tensor src32 = seeded(Shape{outer, src_inner}, 21), dst32 = seeded(Shape{outer, dst_inner}, 22);
    const Tensor src = f64 ? to_f64(src32) : src32, dst0 = f64 ? to_f64(dst32) : dst32;
    Tensor dst_cpu = dst0.clone();
    ops::copy_blocks(src, dst_cpu, outer, src_inner, dst_inner, offset);
    Tensor part_cpu = Tensor::empty(src.shape(), src.dtype());
    ops::split_blocks(dst_cpu, part_cpu, outer, src_inner, dst_inner, offset);
    check_exact(part_cpu, src);  // the CPU round trip itself

    const Tensor src_d = to_cuda(src);
    if (f64) {
      Guarded64 dst = guarded_copy64(dst0), part(src.shape());
      ops::copy_blocks(src_d, dst.inner, outer, src_inner, dst_inner, offset);
      ops::split_blocks(dst.inner, part.inner, outer, src_inner, dst_inner, offset);
      check_exact(dst.host_checked(), dst_cpu);  // the untouched columns keep their values
      check_exact(part.host_checked(), part_cpu);
    } else {
      Guarded dst = guarded_copy(dst0), part(src.shape());
      ops::copy_blocks(src_d, dst.inner, outer, src_inner, dst_inner, offset);
      ops::split_blocks(dst.inner, part.inner, outer, src_inner, dst_inner, offset);
      check_exact(dst.host_checked(), dst_cpu);
      check_exact(part.host_checked(), part_cpu);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions. The CPU sums columns in T in row order; CUDA sums in double. The CPU's f32 rounding error is at most
// about √rows·u·Σ|terms| in practice (u = 6e-8), far below atol = 1e-6·Σ|terms| for these shapes, while one missing
// or doubled row (|term| ~ 1, Σ|terms| ~ 2000) would be a thousand times over it.

TEST_CASE("CUDA sum_rows matches the CPU, overwriting and accumulating", "[cuda]") {
  require_gpu();
  const int64_t rows = 1037, cols = 301;
  const Tensor dy = seeded(Shape{rows, cols}, 31), db0 = seeded(Shape{cols}, 32);
  for (double beta : {0.0, 1.0, 0.5}) {
    INFO("beta " << beta);
    Tensor db_cpu = db0.clone();
    ops::sum_rows(dy, db_cpu, beta);
    Guarded db = guarded_copy(db0);
    ops::sum_rows(to_cuda(dy), db.inner, beta);
    check_sums(db.host_checked(), db_cpu, column_magnitude(dy, rows, cols, db0), 1e-6, 1e-5);

    // f64: both sides sum in double, in different orders: 1e-13·Σ|terms|.
    const Tensor dy64 = to_f64(dy), db64 = to_f64(db0);
    Tensor db64_cpu = db64.clone();
    ops::sum_rows(dy64, db64_cpu, beta);
    Guarded64 db64_cuda = guarded_copy64(db64);
    ops::sum_rows(to_cuda(dy64), db64_cuda.inner, beta);
    check_sums(db64_cuda.host_checked(), db64_cpu, column_magnitude(dy64, rows, cols, db64), 1e-13, 1e-13);
  }
}

TEST_CASE("CUDA sum_squares adds into its f64 total on the device", "[cuda]") {
  require_gpu();
  const int64_t n = 300007;
  const Tensor g = seeded(Shape{n}, 41);
  Tensor out_cpu = host_f64({1.5});
  ops::sum_squares(g, out_cpu);
  Guarded64 out = guarded_copy64(host_f64({1.5}));
  ops::sum_squares(to_cuda(g), out.inner);
  // Both sum the squares of the same floats in double, in different orders: a relative 1e-12.
  check_close(out.host_checked(), out_cpu, 0, 1e-12);

  Tensor bad = g.clone();  // a NaN gradient makes the total NaN, as on the CPU
  bad.data<float>()[12345] = std::numeric_limits<float>::quiet_NaN();
  Guarded64 out_nan = guarded_copy64(host_f64({0.0}));
  ops::sum_squares(to_cuda(bad), out_nan.inner);
  REQUIRE(std::isnan(out_nan.host_checked(true).data<double>()[0]));
}

// ---------------------------------------------------------------------------------------------------------------
// Losses.

namespace {

Tensor labels_for(int64_t batch, int64_t k, uint64_t seed) {
  Tensor l = Tensor::empty(Shape{batch}, DType::i32);
  Rng rng(seed, 0);
  for (int64_t b = 0; b < batch; ++b) l.data<int32_t>()[b] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(k)));
  return l;
}

// Runs cross_entropy on the CPU and on CUDA (stats starting at {10, 3}, so adding is told apart from writing) and
// compares. In f64 the row losses are computed in double from the same inputs on both sides and differ only by
// device exp/log (1 ulp in double) and the order of the sums: the loss total within a relative 1e-9. In f32 the
// CPU's exponentials e^(x − max) are f32 (exp_f32, a few ulp) where CUDA's are double, so each row's log Σe may
// differ by ~5e-7; random logits' errors cancel, but integer logits repeat the same exponentials and their errors
// add up (the H200 run of 2026-12-04: 1.08e-6 over 257 rows of a total of 707, a relative 1.5e-9): the f32 total
// within 1e-9 relative plus 5e-7 per row (times the rows' weight). The hit count is exact. dlogits: see the bounds
// below. Returns the CPU's loss total, so a caller can pin down what it is (finite, NaN, inf). With `rows` (groups,
// ignore_index) the sums are weighted by samples / counted rows, and the hits, no longer integers, agree to 1e-12.
double compare_cross_entropy(const Tensor& logits, const Tensor& labels, double eps, double scale, bool with_grad,
                             const ops::CrossEntropyRows& rows = {}) {
  const bool f64 = logits.dtype() == DType::f64;
  const int64_t batch = logits.dim(0), k = logits.dim(1);
  INFO("batch " << batch << " k " << k << " eps " << eps << " grad " << with_grad << (f64 ? " f64" : " f32"));
  Tensor stats_cpu = host_f64({10, 3});
  Tensor d_cpu = with_grad ? Tensor::empty(logits.shape(), logits.dtype()) : Tensor{};
  ops::cross_entropy(logits, labels, eps, scale, d_cpu, stats_cpu, rows);

  Guarded64 stats = guarded_copy64(host_f64({10, 3}));
  const Tensor logits_d = to_cuda(logits), labels_d = to_cuda(labels);
  Tensor host_stats, host_d;
  // dlogits into a guarded buffer of the logits' type (Guarded or Guarded64).
  const auto run = [&](const auto& d) {
    Tensor dd = with_grad ? d.inner : Tensor{};
    ops::cross_entropy(logits_d, labels_d, eps, scale, dd, stats.inner, rows);
    host_d = d.host_checked(true);
    if (!with_grad)  // an undefined dlogits: nothing written
      for (int64_t i = 0; i < host_d.numel(); ++i) REQUIRE(at(host_d, i) == kSentinel);
  };
  if (f64)
    run(Guarded64(logits.shape()));
  else
    run(Guarded(logits.shape()));
  host_stats = stats.host_checked(true);
  const double* s = host_stats.data<double>();
  const double* c = stats_cpu.data<double>();
  INFO("loss total: cuda " << s[0] << " cpu " << c[0]);
  if (std::isnan(c[0]))
    REQUIRE(std::isnan(s[0]));
  else if (std::isinf(c[0]))
    REQUIRE(s[0] == c[0]);
  else
    REQUIRE(std::abs(s[0] - c[0]) <=
            1e-9 * std::abs(c[0]) + (f64 ? 0.0 : 5e-7 * static_cast<double>(batch / rows.group)));
  if (rows.group == 1 && rows.ignore_index == ops::kNoIgnore)
    REQUIRE(s[1] == c[1]);
  else
    REQUIRE(std::abs(s[1] - c[1]) <= 1e-12 * std::abs(c[1]));
  // f32: p = e^(x − lse) through CUDA's expf and the CPU's exp_f32, whose errors are a few ulp of the exponent's
  // argument, so p's relative error grows with |x − lse| (~1e-6 for these logits); and at the label, p − target
  // cancels, leaving an absolute error of an ulp or so of |scale| (the largest an element can be). The first GPU runs
  // (2026-12-04, H200) failed the former 2.5e-7 relative, 1e-12·|scale| absolute at elements of 2.1e-6 (5e-6
  // apart) and −1.99e-10 (4.6e-14 apart, scale 1/640): hence 4e-6 relative and 1e-7·|scale| absolute (passed on the
  // third run).
  if (with_grad) check_close_nonfinite(host_d, d_cpu, (f64 ? 1e-12 : 1e-7) * std::abs(scale), f64 ? 1e-12 : 4e-6);
  return c[0];
}

}  // namespace

TEST_CASE("CUDA cross_entropy over sequences with ignore_index matches the CPU", "[cuda]") {
  require_gpu();
  // 40 samples of 16 tokens over a vocabulary of 300; every 7th target is -1 (ignored), then all of them.
  const Tensor logits = seeded(Shape{640, 300}, 31);
  Tensor labels = labels_for(640, 300, 32);
  for (int64_t i = 0; i < 640; i += 7) labels.data<int32_t>()[i] = -1;
  const ops::CrossEntropyRows rows{.group = 16, .ignore_index = -1};
  REQUIRE(std::isfinite(compare_cross_entropy(logits, labels, 0.0, 1.0 / 40, true, rows)));
  compare_cross_entropy(logits, labels, 0.1, 1.0 / 40, true, rows);
  compare_cross_entropy(to_f64(logits), labels, 0.0, 0.5, true, rows);
  for (int64_t i = 0; i < 640; ++i) labels.data<int32_t>()[i] = -1;
  REQUIRE(compare_cross_entropy(logits, labels, 0.0, 1.0 / 40, true, rows) == 10);  // the stats start at 10: + 0
}

TEST_CASE("CUDA cross_entropy matches the CPU loss, hits and gradient", "[cuda]") {
  require_gpu();
  const std::vector<std::pair<int64_t, int64_t>> shapes{{203, 37}, {67, 1000}, {5, 1}, {300, 33}};
  for (auto [batch, k] : shapes) {
    const Tensor logits = seeded(Shape{batch, k}, static_cast<uint64_t>(100 + k));
    const Tensor labels = labels_for(batch, k, static_cast<uint64_t>(200 + k));
    for (double eps : {0.0, 0.1}) {
      REQUIRE(std::isfinite(compare_cross_entropy(logits, labels, eps, 1.0 / static_cast<double>(batch), true)));
      compare_cross_entropy(logits, labels, eps, 1.0, false);
      compare_cross_entropy(to_f64(logits), labels, eps, 0.5, true);
    }
  }
  // Integer logits tie often: the argmax must be the first largest index on both, or the hit counts differ.
  Tensor ties = seeded(Shape{257, 9}, 7);
  for (int64_t i = 0; i < ties.numel(); ++i) ties.data<float>()[i] = std::round(ties.data<float>()[i] / 2);
  REQUIRE(std::isfinite(compare_cross_entropy(ties, labels_for(257, 9, 8), 0.0, 1.0, true)));
}

TEST_CASE("CUDA cross_entropy turns NaN and infinite logits into the CPU's NaN loss", "[cuda]") {
  require_gpu();
  const int64_t batch = 41, k = 19;
  const Tensor labels = labels_for(batch, k, 51);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  SECTION("a NaN in column 0 (the CPU's running max keeps it; the hit counts must still agree)") {
    Tensor logits = seeded(Shape{batch, k}, 52);
    logits.data<float>()[3 * k] = nan;
    REQUIRE(std::isnan(compare_cross_entropy(logits, labels, 0.1, 1.0 / batch, true)));
  }
  SECTION("a NaN in a later column") {
    Tensor logits = seeded(Shape{batch, k}, 53);
    logits.data<float>()[7 * k + 11] = nan;
    REQUIRE(std::isnan(compare_cross_entropy(logits, labels, 0.0, 1.0 / batch, true)));
  }
  SECTION("+inf in a row") {
    Tensor logits = seeded(Shape{batch, k}, 54);
    logits.data<float>()[2 * k + 5] = inf;
    REQUIRE(std::isnan(compare_cross_entropy(logits, labels, 0.0, 1.0 / batch, true)));
  }
  SECTION("-inf away from the labels: finite without smoothing, +inf with it (PyTorch's values)") {
    Tensor logits = seeded(Shape{batch, k}, 55);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t j = (labels.data<int32_t>()[b] + 1) % k;
      logits.data<float>()[b * k + j] = -inf;
    }
    REQUIRE(std::isfinite(compare_cross_entropy(logits, labels, 0.0, 1.0 / batch, true)));
    REQUIRE(compare_cross_entropy(logits, labels, 0.1, 1.0 / batch, true) == kInf);
  }
}

TEST_CASE("CUDA cross_entropy gives a NaN loss and no hit for a label out of range", "[cuda]") {
  require_gpu();  // ops/loss.h's answer on both backends: a NaN loss, no hit, a gradient without the target term
  const int64_t batch = 5, k = 11;
  const Tensor logits = seeded(Shape{batch, k}, 56);
  Tensor labels = labels_for(batch, k, 57);
  labels.data<int32_t>()[batch - 1] = static_cast<int32_t>(k);
  labels.data<int32_t>()[batch - 2] = -1;
  Tensor valid_stats = host_f64({0, 0}), none;
  ops::cross_entropy(logits.narrow0(batch - 2), labels.narrow0(batch - 2), 0.0, 1.0, none, valid_stats);
  Guarded64 stats = guarded_copy64(host_f64({0, 0}));
  Tensor none_d;
  ops::cross_entropy(to_cuda(logits), to_cuda(labels), 0.0, 1.0, none_d, stats.inner);
  const Tensor s = stats.host_checked(true);
  REQUIRE(std::isnan(s.data<double>()[0]));
  REQUIRE(s.data<double>()[1] == valid_stats.data<double>()[1]);               // the last two rows count no hit
  REQUIRE(std::isnan(compare_cross_entropy(logits, labels, 0.1, 0.5, true)));  // the CPU agrees, gradient too
}

TEST_CASE("CUDA cross_entropy and mse write their gradient over their input with the bits of a separate buffer",
          "[cuda]") {
  require_gpu();  // the fused classifier's in-place gradient (ops/loss.h); the label's logit is read by every lane
  const int64_t batch = 300, k = 1000;
  const Tensor logits = seeded(Shape{batch, k}, 71);
  Tensor labels = labels_for(batch, k, 72);
  for (int64_t i = 0; i < batch; i += 5) labels.data<int32_t>()[i] = 3;  // ignored below, and column 3 of other rows
  for (const int64_t ignore : {ops::kNoIgnore, int64_t{3}})
    for (const bool f64 : {false, true}) {
      INFO((f64 ? "f64" : "f32") << ", ignore_index " << ignore);
      const Tensor x = to_cuda(f64 ? to_f64(logits) : logits), y = to_cuda(labels);
      const ops::CrossEntropyRows rows{.group = 10, .ignore_index = ignore};
      Tensor apart = Tensor::empty(x.shape(), x.dtype(), x.device());
      Tensor stats_apart = to_cuda(host_f64({0, 0})), stats_over = to_cuda(host_f64({0, 0}));
      ops::cross_entropy(x, y, 0.1, 1.0 / 30, apart, stats_apart, rows);
      Tensor over = to_cuda(to_host(x));
      ops::cross_entropy(over, y, 0.1, 1.0 / 30, over, stats_over, rows);
      const Tensor a = to_host(apart), o = to_host(over), sa = to_host(stats_apart), so = to_host(stats_over);
      REQUIRE(std::memcmp(a.raw(), o.raw(), static_cast<size_t>(a.bytes())) == 0);
      REQUIRE(std::memcmp(sa.raw(), so.raw(), static_cast<size_t>(sa.bytes())) == 0);
    }
  const Tensor pred = to_cuda(seeded(Shape{64, 33}, 73)), target = to_cuda(seeded(Shape{64, 33}, 74));
  Tensor apart = Tensor::empty(pred.shape(), DType::f32, pred.device()), over = to_cuda(to_host(pred));
  Tensor stats_apart = to_cuda(host_f64({0, 0})), stats_over = to_cuda(host_f64({0, 0}));
  ops::mse(pred, target, 0.5, apart, stats_apart);
  ops::mse(over, target, 0.5, over, stats_over);
  const Tensor a = to_host(apart), o = to_host(over);
  REQUIRE(std::memcmp(a.raw(), o.raw(), static_cast<size_t>(a.bytes())) == 0);
  REQUIRE(to_host(stats_apart).data<double>()[0] == to_host(stats_over).data<double>()[0]);
}

TEST_CASE("CUDA mse matches the CPU loss and gradient", "[cuda]") {
  require_gpu();
  const int64_t batch = 129, d = 77;
  const Tensor pred = seeded(Shape{batch, d}, 61), target = seeded(Shape{batch, d}, 62);
  for (bool f64 : {false, true}) {
    INFO((f64 ? "f64" : "f32"));
    const Tensor p = f64 ? to_f64(pred) : pred, t = f64 ? to_f64(target) : target;
    Tensor stats_cpu = host_f64({2, 0});
    Tensor d_cpu = Tensor::empty(p.shape(), p.dtype());
    ops::mse(p, t, 0.25, d_cpu, stats_cpu);
    Guarded64 stats = guarded_copy64(host_f64({2, 0}));
    Tensor host_d;
    if (f64) {
      Guarded64 dp(p.shape());
      ops::mse(to_cuda(p), to_cuda(t), 0.25, dp.inner, stats.inner);
      host_d = dp.host_checked();
    } else {
      Guarded dp(p.shape());
      ops::mse(to_cuda(p), to_cuda(t), 0.25, dp.inner, stats.inner);
      host_d = dp.host_checked();
    }
    // The gradient is the same double expression rounded once: bit for bit. The loss is Σ diff² in double in
    // another order (and divided by d per block instead of per row): a relative 1e-12.
    check_exact(host_d, d_cpu);
    const Tensor s = stats.host_checked();
    REQUIRE(std::abs(s.data<double>()[0] - stats_cpu.data<double>()[0]) <= 1e-12 * stats_cpu.data<double>()[0]);
    REQUIRE(s.data<double>()[1] == 0);  // mse leaves the hit count alone
  }
  // A NaN prediction makes the loss NaN on both, and only its own gradient element.
  Tensor bad = pred.clone();
  bad.data<float>()[5 * d + 3] = std::numeric_limits<float>::quiet_NaN();
  Tensor stats_cpu = host_f64({0, 0}), d_cpu = Tensor::empty(bad.shape(), DType::f32);
  ops::mse(bad, target, 1.0, d_cpu, stats_cpu);
  Guarded64 stats = guarded_copy64(host_f64({0, 0}));
  Guarded dp(bad.shape());
  Tensor no_grad;
  ops::mse(to_cuda(bad), to_cuda(target), 1.0, dp.inner, stats.inner);
  REQUIRE(std::isnan(stats_cpu.data<double>()[0]));
  REQUIRE(std::isnan(stats.host_checked(true).data<double>()[0]));
  check_exact(dp.host_checked(true), d_cpu);
  Guarded64 stats2 = guarded_copy64(host_f64({0, 0}));  // and without a gradient
  ops::mse(to_cuda(pred), to_cuda(target), 1.0, no_grad, stats2.inner);
  REQUIRE(std::isfinite(stats2.host_checked().data<double>()[0]));
}

// ---------------------------------------------------------------------------------------------------------------
// Normalisation and softmax.

TEST_CASE("CUDA layernorm matches the CPU forward and backward", "[cuda]") {
  require_gpu();
  const std::vector<std::pair<int64_t, int64_t>> shapes{{37, 300}, {9, 1000}, {50, 7}};
  for (auto [rows, d] : shapes) {
    INFO("rows " << rows << " d " << d);
    const Tensor x = seeded(Shape{rows, d}, 71), gamma = seeded(Shape{d}, 72, 0.5, 1.5), beta = seeded(Shape{d}, 73);
    const Tensor dy = seeded(Shape{rows, d}, 74), dg0 = seeded(Shape{d}, 75), db0 = seeded(Shape{d}, 76);
    Tensor y_cpu = Tensor::empty(x.shape(), DType::f32), m_cpu = Tensor::empty(Shape{rows}, DType::f32),
           i_cpu = Tensor::empty(Shape{rows}, DType::f32);
    ops::layernorm_forward(x, gamma, beta, 1e-5, m_cpu, i_cpu, y_cpu);
    const Tensor xd = to_cuda(x), gd = to_cuda(gamma), dyd = to_cuda(dy);
    Guarded y(x.shape()), mean(Shape{rows}), inv(Shape{rows});
    ops::layernorm_forward(xd, gd, to_cuda(beta), 1e-5, mean.inner, inv.inner, y.inner);
    // Mean and variance are double sums in another order; the results are doubles rounded to f32 once, so they
    // differ by at most an ulp or two: rtol 1e-6 (8 ulp), atol 1e-6 for y values near zero.
    check_close(y.host_checked(), y_cpu, 1e-6, 1e-6);
    check_close(mean.host_checked(), m_cpu, 1e-9, 1e-6);
    check_close(inv.host_checked(), i_cpu, 1e-9, 1e-6);

    // Backward from each side's own saved statistics, accumulating into dgamma/dbeta (beta = 1).
    Tensor dx_cpu = Tensor::empty(x.shape(), DType::f32), dg_cpu = dg0.clone(), db_cpu = db0.clone();
    ops::layernorm_backward(x, gamma, m_cpu, i_cpu, dy, dx_cpu, dg_cpu, db_cpu, 1.0);
    Guarded dx(x.shape()), dg = guarded_copy(dg0), db = guarded_copy(db0);
    ops::layernorm_backward(xd, gd, mean.inner, inv.inner, dyd, dx.inner, dg.inner, db.inner, 1.0);
    // dx = (1/σ)(dy·γ − a/d − x̂·b/d) cancels: its error is an ulp of the terms (|dy·γ|/σ ≲ 20), so atol 1e-5 with
    // rtol 1e-5.
    check_close(dx.host_checked(), dx_cpu, 1e-5, 1e-5);
    // Column sums over the rows in double; the saved statistics may differ by an ulp: 1e-6·Σ|terms|.
    Tensor xhat_dy = Tensor::empty(x.shape(), DType::f64);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < d; ++i)
        xhat_dy.data<double>()[r * d + i] = dy.data<float>()[r * d + i] *
                                            (x.data<float>()[r * d + i] - m_cpu.data<float>()[r]) *
                                            i_cpu.data<float>()[r];
    check_sums(dg.host_checked(), dg_cpu, column_magnitude(xhat_dy, rows, d, dg0), 1e-6, 1e-6);
    check_sums(db.host_checked(), db_cpu, column_magnitude(dy, rows, d, db0), 1e-6, 1e-6);

    // Without dx, overwriting (beta = 0): the parameter gradients alone.
    Tensor dg2_cpu = dg0.clone(), db2_cpu = db0.clone(), none;
    ops::layernorm_backward(x, gamma, m_cpu, i_cpu, dy, none, dg2_cpu, db2_cpu, 0.0);
    Guarded dg2 = guarded_copy(dg0), db2 = guarded_copy(db0);
    Tensor none_d;
    ops::layernorm_backward(xd, gd, mean.inner, inv.inner, dyd, none_d, dg2.inner, db2.inner, 0.0);
    check_sums(dg2.host_checked(), dg2_cpu, column_magnitude(xhat_dy, rows, d), 1e-6, 1e-6);
    check_sums(db2.host_checked(), db2_cpu, column_magnitude(dy, rows, d), 1e-6, 1e-6);
  }
}

TEST_CASE("CUDA layernorm in f64 matches the CPU", "[cuda]") {
  require_gpu();
  const int64_t rows = 23, d = 333;
  const Tensor x = to_f64(seeded(Shape{rows, d}, 81)), gamma = to_f64(seeded(Shape{d}, 82, 0.5, 1.5)),
               beta = to_f64(seeded(Shape{d}, 83)), dy = to_f64(seeded(Shape{rows, d}, 84));
  Tensor y_cpu = Tensor::empty(x.shape(), DType::f64), m_cpu = Tensor::empty(Shape{rows}, DType::f64),
         i_cpu = Tensor::empty(Shape{rows}, DType::f64);
  ops::layernorm_forward(x, gamma, beta, 1e-5, m_cpu, i_cpu, y_cpu);
  Guarded64 y(x.shape()), mean(Shape{rows}), inv(Shape{rows});
  const Tensor xd = to_cuda(x), gd = to_cuda(gamma);
  ops::layernorm_forward(xd, gd, to_cuda(beta), 1e-5, mean.inner, inv.inner, y.inner);
  // All in double on both sides, sums in other orders: 1e-12.
  check_close(y.host_checked(), y_cpu, 1e-12, 1e-12);
  check_close(mean.host_checked(), m_cpu, 1e-14, 1e-12);
  check_close(inv.host_checked(), i_cpu, 1e-14, 1e-12);
  Tensor dx_cpu = Tensor::empty(x.shape(), DType::f64), dg_cpu = Tensor::empty(Shape{d}, DType::f64),
         db_cpu = Tensor::empty(Shape{d}, DType::f64);
  ops::layernorm_backward(x, gamma, m_cpu, i_cpu, dy, dx_cpu, dg_cpu, db_cpu, 0.0);
  Guarded64 dx(x.shape()), dg(Shape{d}), db(Shape{d});
  ops::layernorm_backward(xd, gd, mean.inner, inv.inner, to_cuda(dy), dx.inner, dg.inner, db.inner, 0.0);
  check_close(dx.host_checked(), dx_cpu, 1e-11, 1e-11);
  check_close(dg.host_checked(), dg_cpu, 1e-11, 1e-11);
  check_close(db.host_checked(), db_cpu, 1e-11, 1e-11);
}

TEST_CASE("CUDA softmax matches the CPU forward and backward", "[cuda]") {
  require_gpu();
  const std::vector<std::pair<int64_t, int64_t>> shapes{{37, 300}, {101, 10}, {3, 5000}};
  for (auto [rows, d] : shapes) {
    INFO("rows " << rows << " d " << d);
    const Tensor x = seeded(Shape{rows, d}, 91), dy = seeded(Shape{rows, d}, 92);
    Tensor y_cpu = Tensor::empty(x.shape(), DType::f32);
    ops::softmax_forward(x, d, y_cpu);
    Guarded y(x.shape());
    ops::softmax_forward(to_cuda(x), d, y.inner);
    // expf on the device is within 2 ulp, glibc's within 1; then one more rounding by 1/Σ: rtol 1e-6 (8 ulp).
    check_close(y.host_checked(), y_cpu, 1e-12, 1e-6);

    // Backward from the same y on both sides (the CPU's), so only the order of the double Σ y·dy differs: the
    // results round the same doubles to f32 (1 ulp, rtol 2.5e-7), atol 1e-7 where dy ≈ Σ y·dy cancels.
    Tensor dx_cpu = Tensor::empty(x.shape(), DType::f32);
    ops::softmax_backward(y_cpu, dy, d, dx_cpu);
    Guarded dx(x.shape());
    ops::softmax_backward(to_cuda(y_cpu), to_cuda(dy), d, dx.inner);
    check_close(dx.host_checked(), dx_cpu, 1e-7, 2.5e-7);
  }
}

TEST_CASE("CUDA softmax makes the same rows NaN as the CPU", "[cuda]") {
  require_gpu();
  const int64_t rows = 6, d = 45;
  Tensor x = seeded(Shape{rows, d}, 93);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  x.data<float>()[0 * d + 0] = nan;                                      // row 0: NaN first
  x.data<float>()[1 * d + 30] = nan;                                     // row 1: NaN later
  x.data<float>()[2 * d + 7] = inf;                                      // row 2: +inf → inf − inf = NaN
  for (int64_t i = 0; i < d; i += 2) x.data<float>()[3 * d + i] = -inf;  // row 3: -inf entries give zeros
  for (int64_t i = 0; i < d; ++i) x.data<float>()[4 * d + i] = -inf;     // row 4: all -inf → NaN
  Tensor y_cpu = Tensor::empty(x.shape(), DType::f32);
  ops::softmax_forward(x, d, y_cpu);
  Guarded y(x.shape());
  ops::softmax_forward(to_cuda(x), d, y.inner);
  const Tensor y_cuda = y.host_checked(true);
  for (int64_t i = 0; i < d; ++i) {  // the CPU's behaviour this pins down
    REQUIRE(std::isnan(y_cpu.data<float>()[0 * d + i]));
    REQUIRE(std::isnan(y_cpu.data<float>()[2 * d + i]));
    REQUIRE(std::isfinite(y_cpu.data<float>()[3 * d + i]));
  }
  check_close_nonfinite(y_cuda, y_cpu, 1e-12, 1e-6);  // tolerance as in the test above
}

// ---------------------------------------------------------------------------------------------------------------
// Dropout and embedding.

TEST_CASE("CUDA dropout draws exactly the CPU's mask", "[cuda]") {
  require_gpu();
  const int64_t n = 100003;  // not a multiple of 4: the last Philox block is partly used
  Tensor x = seeded(Shape{n}, 101);
  x.data<float>()[17] = std::numeric_limits<float>::quiet_NaN();  // NaN kept is NaN, NaN dropped is 0, on both
  x.data<float>()[18] = std::numeric_limits<float>::quiet_NaN();
  x.data<float>()[19] = std::numeric_limits<float>::quiet_NaN();
  for (double p : {0.0, 0.3, 0.9}) {
    for (uint64_t step : {uint64_t{0}, uint64_t{12345678901}}) {
      INFO("p " << p << " step " << step);
      const uint64_t key = 0x9E3779B97F4A7C15ull;
      Tensor y_cpu = Tensor::empty(x.shape(), DType::f32);
      ops::dropout(x, p, key, step, y_cpu);
      Guarded y(x.shape());
      ops::dropout(to_cuda(x), p, key, step, y.inner);
      // The same Philox words, compared with p in double, times the same f32 scale: bit for bit.
      check_exact(y.host_checked(true), y_cpu);
      Guarded in_place = guarded_copy(x);  // the backward pass may run in place
      ops::dropout(in_place.inner, p, key, step, in_place.inner);
      check_exact(in_place.host_checked(true), y_cpu);
    }
  }
  const Tensor x64 = to_f64(seeded(Shape{1001}, 102));
  Tensor y64_cpu = Tensor::empty(x64.shape(), DType::f64);
  ops::dropout(x64, 0.5, 7, 3, y64_cpu);
  Guarded64 y64(x64.shape());
  ops::dropout(to_cuda(x64), 0.5, 7, 3, y64.inner);
  check_exact(y64.host_checked(), y64_cpu);
}

namespace {

// Indices as the embedding layer gets them: floats holding row numbers, some off by less than 1e-3, with repeats.
Tensor embedding_indices(int64_t n, int64_t vocab, uint64_t seed) {
  Tensor idx = Tensor::empty(Shape{n}, DType::f32);
  Rng rng(seed, 0);
  for (int64_t k = 0; k < n; ++k)
    idx.data<float>()[k] = static_cast<float>(rng.below(static_cast<uint64_t>(vocab))) + (k % 3 == 0 ? 4e-4f : 0.0f);
  return idx;
}

}  // namespace

TEST_CASE("CUDA embedding matches the CPU forward and backward", "[cuda]") {
  require_gpu();
  const int64_t vocab = 53, dim = 37, n = 211;  // about four uses of every row: the backward pass adds repeats
  const Tensor idx = embedding_indices(n, vocab, 111), w = seeded(Shape{vocab, dim}, 112);
  const Tensor dy = seeded(Shape{n, dim}, 113), dw0 = seeded(Shape{vocab, dim}, 114);
  Tensor y_cpu = Tensor::empty(Shape{n, dim}, DType::f32);
  ops::embedding_forward(idx, w, y_cpu);
  Guarded y(Shape{n, dim});
  const Tensor idx_d = to_cuda(idx);
  ops::embedding_forward(idx_d, to_cuda(w), y.inner);
  check_exact(y.host_checked(), y_cpu);  // a copy

  for (double beta : {0.0, 1.0, 0.5}) {
    INFO("beta " << beta);
    Tensor dw_cpu = dw0.clone();
    ops::embedding_backward(idx, dy, dw_cpu, beta);
    Guarded dw = guarded_copy(dw0);
    ops::embedding_backward(idx_d, to_cuda(dy), dw.inner, beta);
    // A row's ~4 repeats are added in token order, as the CPU adds them: bit for bit (and so the same on every run).
    check_exact(dw.host_checked(), dw_cpu);
  }
}

TEST_CASE("CUDA embedding makes an out-of-range index's row NaN and skips it backward", "[cuda]") {
  require_gpu();
  const int64_t vocab = 10, dim = 33, n = 7;
  Tensor idx = embedding_indices(n, vocab, 121);
  idx.data<float>()[2] = 10.0f;  // = vocab
  idx.data<float>()[4] = -1.0f;
  idx.data<float>()[5] = 3.4f;  // not within 1e-3 of a row number
  const Tensor w = seeded(Shape{vocab, dim}, 122), dy = seeded(Shape{n, dim}, 123);
  Tensor y_cpu = Tensor::empty(Shape{n, dim}, DType::f32);
  REQUIRE_THROWS(ops::embedding_forward(idx, w, y_cpu));  // the CPU says so at once
  Guarded y(Shape{n, dim});
  const Tensor idx_d = to_cuda(idx);
  ops::embedding_forward(idx_d, to_cuda(w), y.inner);
  const Tensor yh = y.host_checked(true);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < dim; ++j) {
      const float v = yh.data<float>()[k * dim + j];
      if (k == 2 || k == 4 || k == 5) {
        REQUIRE(std::isnan(v));
      } else {
        const auto row = static_cast<int64_t>(std::lround(idx.data<float>()[k]));
        REQUIRE(v == w.data<float>()[row * dim + j]);
      }
    }
  Tensor dw_cpu = Tensor::empty(Shape{vocab, dim}, DType::f32);
  ops::embedding_backward(idx, dy, dw_cpu, 0.0);  // the CPU's backward skips them too
  Guarded dw(Shape{vocab, dim});
  ops::embedding_backward(idx_d, to_cuda(dy), dw.inner, 0.0);
  check_close(dw.host_checked(), dw_cpu, 1e-6, 1e-6);  // ≤ 2 terms per row here: an ulp of order
}

// ---------------------------------------------------------------------------------------------------------------
// Optimizers: the fused group steps, on one row and on many.

namespace {

AdamHyper adam_hyper(int step, bool decoupled) {
  const double b1 = 0.9, b2 = 0.999;
  return AdamHyper{1e-2, b1, b2, 1e-8, 0.05, 1 - std::pow(b1, step), std::sqrt(1 - std::pow(b2, step)), decoupled};
}

}  // namespace

// The per-element update is ops/math.h's on both sides; nvcc may fuse a multiply and an add into one FMA where the
// host rounds twice, so a few ulp per step: |Δ| ≤ 1e-6 + 1e-5·|cpu| after three steps (as the SGD test). The fused
// group step the optimizer runs, on a group of one row (a finite step, no clipping).
TEST_CASE("CUDA adam_step_group of one row matches the CPU, Adam and AdamW, with and without amsgrad", "[cuda]") {
  require_gpu();
  const int64_t n = 77777;
  for (bool amsgrad : {false, true})
    for (bool decoupled : {false, true}) {
      INFO("amsgrad " << amsgrad << " decoupled " << decoupled);
      Tensor p_cpu = seeded(Shape{n}, 131), m_cpu = Tensor::zeros(Shape{n}, DType::f32),
             v_cpu = Tensor::zeros(Shape{n}, DType::f32), vmax_cpu = Tensor::zeros(Shape{n}, DType::f32);
      Guarded p = guarded_copy(p_cpu), m(Shape{n}, 0.0f), v(Shape{n}, 0.0f), vmax(Shape{n}, 0.0f);
      Tensor none_cpu, none_d;
      // Each step's gradient is copied into the row's gradient tensors: a group's tensors stay put.
      Tensor g_cpu = Tensor::empty(Shape{n}, DType::f32), g_d = to_cuda(g_cpu);
      ops::TensorGroup group_cpu, group_cuda;
      group_cpu.rows.push_back({p_cpu, g_cpu, m_cpu, v_cpu, amsgrad ? vmax_cpu : none_cpu});
      group_cuda.rows.push_back({p.inner, g_d, m.inner, v.inner, amsgrad ? vmax.inner : none_d});
      const Tensor stats_cpu = host_f64({0, 0, 0}), stats_cuda = to_cuda(stats_cpu);
      for (int step = 1; step <= 3; ++step) {
        const Tensor g = seeded(Shape{n}, 140 + static_cast<uint64_t>(step));
        g_cpu.copy_from(g);
        g_d.copy_from(g);
        const AdamHyper h = adam_hyper(step, decoupled);
        ops::adam_step_group(h, amsgrad, group_cpu, stats_cpu, 0);
        ops::adam_step_group(h, amsgrad, group_cuda, stats_cuda, 0);
      }
      check_close(p.host_checked(), p_cpu, 1e-6, 1e-5);
      check_close(m.host_checked(), m_cpu, 1e-6, 1e-5);
      check_close(v.host_checked(), v_cpu, 1e-6, 1e-5);
      if (amsgrad) check_close(vmax.host_checked(), vmax_cpu, 1e-6, 1e-5);
    }
}

namespace {

// Row sizes of the test groups: one element, less than a block, several 2^16-element chunks with a ragged end.
const std::vector<int64_t> kGroupSizes{1, 31, 70001, 65536 + 3, 200000};

struct GroupPair {
  ops::TensorGroup cpu, cuda;
  std::vector<Guarded> guards;  // the CUDA tensors, to check their sentinels
};

// A group of `width` columns per row: column 0 seeded parameters, column 1 seeded gradients, the others zero (or
// undefined when `last_undefined` and it is the last column). The CUDA group holds guarded copies.
GroupPair make_groups(size_t width, bool last_undefined, uint64_t seed) {
  GroupPair g;
  for (size_t r = 0; r < kGroupSizes.size(); ++r) {
    const int64_t n = kGroupSizes[r];
    std::vector<Tensor> cpu_row, cuda_row;
    for (size_t c = 0; c < width; ++c) {
      if (last_undefined && c + 1 == width) {
        cpu_row.emplace_back();
        cuda_row.emplace_back();
        continue;
      }
      Tensor h = c < 2 ? seeded(Shape{n}, seed + 10 * r + c, c == 1 ? -0.5 : -4, c == 1 ? 0.5 : 4)
                       : Tensor::zeros(Shape{n}, DType::f32);
      g.guards.push_back(guarded_copy(h));
      cpu_row.push_back(h);
      cuda_row.push_back(g.guards.back().inner);
    }
    g.cpu.rows.push_back(cpu_row);
    g.cuda.rows.push_back(cuda_row);
  }
  return g;
}

double group_grad_sq(const ops::TensorGroup& g) {
  double s = 0;
  for (const auto& row : g.rows)
    for (int64_t i = 0; i < row[1].numel(); ++i)
      s += static_cast<double>(row[1].data<float>()[i]) * row[1].data<float>()[i];
  return s;
}

// Gradients as training has them: fresh before every step (the CPU's clip scales them in place; CUDA's does not).
void refresh_grads(GroupPair& g, uint64_t seed) {
  for (size_t r = 0; r < g.cpu.rows.size(); ++r) {
    const Tensor fresh = seeded(Shape{kGroupSizes[r]}, seed + 10 * r + 1, -0.5, 0.5);
    g.cpu.rows[r][1].copy_from(fresh);
    g.cuda.rows[r][1].copy_from(fresh);
  }
}

void compare_groups(const GroupPair& g, size_t columns, double atol, double rtol) {
  size_t guard = 0;
  for (size_t r = 0; r < g.cpu.rows.size(); ++r)
    for (size_t c = 0; c < g.cpu.rows[r].size(); ++c) {
      if (!g.cpu.rows[r][c].defined()) continue;
      const Tensor host = g.guards[guard++].host_checked();
      INFO("row " << r << " column " << c);
      if (c < columns) check_close(host, g.cpu.rows[r][c], atol, rtol);
    }
}

}  // namespace

TEST_CASE("CUDA sum_squares_group adds the CPU's total across chunks", "[cuda]") {
  require_gpu();
  GroupPair g = make_groups(3, false, 151);
  for (size_t column : {size_t{0}, size_t{1}}) {
    Tensor out_cpu = host_f64({0.25}), rows_cpu = host_f64({1.0, 2.0, 3.0, 4.0, 5.0});
    ops::sum_squares_group(g.cpu, column, out_cpu, rows_cpu);
    Guarded64 out = guarded_copy64(host_f64({0.25})), rows = guarded_copy64(host_f64({1.0, 2.0, 3.0, 4.0, 5.0}));
    ops::sum_squares_group(g.cuda, column, out.inner, rows.inner);
    // Squares of the same floats summed in double, in another order: a relative 1e-12 (the total and each row's).
    check_close(out.host_checked(), out_cpu, 0, 1e-12);
    check_close(rows.host_checked(), rows_cpu, 0, 1e-12);
    Tensor none;  // without per-row sums
    ops::sum_squares_group(g.cpu, column, out_cpu, none);
    ops::sum_squares_group(g.cuda, column, out.inner, none);
    check_close(out.host_checked(), out_cpu, 0, 1e-12);
  }
  compare_groups(g, 3, 0, 0);  // and nothing written
}

TEST_CASE("CUDA loss and gradient-norm sums give the same bits on every run", "[cuda]") {
  require_gpu();
  // Each sums over hundreds of blocks (1024 for the element-wise sums, every chunk of the groups, rows strided over
  // 1024 blocks for the cross-entropy), which an atomicAdd per block would add in the order they finish: bits that
  // change from run to run, and with them a clip coefficient and the weights (seen on an H200 before the blocks'
  // sums were added in block order). Ten runs of each must give the first run's bits.
  const Tensor g = to_cuda(seeded(Shape{int64_t{5} << 20}, 171));
  const int64_t batch = 50000, k = 10;
  const Tensor logits = to_cuda(seeded(Shape{batch, k}, 172)), labels = to_cuda(labels_for(batch, k, 173));
  const Tensor pred = to_cuda(seeded(Shape{4096, 300}, 174)), target = to_cuda(seeded(Shape{4096, 300}, 175));
  GroupPair groups = make_groups(3, false, 176);
  Tensor dlogits = Tensor::empty(logits.shape(), DType::f32, logits.device()), dpred;
  auto run = [&] {
    Tensor norm = to_cuda(host_f64({0})), rows = to_cuda(host_f64({0, 0, 0, 0, 0}));
    Tensor group_total = to_cuda(host_f64({0})), ce = to_cuda(host_f64({0, 0})), mse = to_cuda(host_f64({0, 0}));
    ops::sum_squares(g, norm);
    ops::sum_squares_group(groups.cuda, 1, group_total, rows);
    ops::cross_entropy(logits, labels, 0.1, 1.0 / batch, dlogits, ce);
    ops::mse(pred, target, 1.0, dpred, mse);
    std::vector<double> out;
    for (const Tensor* t : {&norm, &rows, &group_total, &ce, &mse}) {
      const Tensor h = to_host(*t);
      out.insert(out.end(), h.data<double>(), h.data<double>() + h.numel());
    }
    return out;
  };
  const std::vector<double> first = run();
  for (int i = 0; i < 10; ++i) {
    const std::vector<double> again = run();
    REQUIRE(again.size() == first.size());
    for (size_t j = 0; j < first.size(); ++j) {
      INFO("run " << i + 2 << ", sum " << j << ": " << again[j] << " against " << first[j]);
      REQUIRE(std::memcmp(&again[j], &first[j], sizeof(double)) == 0);
    }
  }
}

TEST_CASE("CUDA sgd_step_group matches the CPU, plain and clipped", "[cuda]") {
  require_gpu();
  for (bool nesterov : {false, true})
    for (double max_norm : {0.0, 1.0, 1e9}) {  // no clipping, clipping (the norm is ~ 100), a coefficient ≥ 1
      INFO("nesterov " << nesterov << " max_norm " << max_norm);
      GroupPair g = make_groups(3, false, 161);
      for (int step = 0; step < 3; ++step) {
        refresh_grads(g, 161 + static_cast<uint64_t>(step) * 1000);
        const Tensor stats_host = host_f64({2.5, 7, group_grad_sq(g.cpu)});
        const Tensor stats_d = to_cuda(stats_host);
        const SgdHyper h{0.1, 0.9, 0.0, 0.01, nesterov, step == 0};
        ops::sgd_step_group(h, g.cpu, stats_host, max_norm);
        ops::sgd_step_group(h, g.cuda, stats_d, max_norm);
      }
      // ops/math.h's update on both; the clip coefficient is the same double expression; FMA as in the one-row test.
      compare_groups(g, 3, 1e-6, 1e-5);
    }
  {  // without momentum: the momentum column undefined
    GroupPair g = make_groups(3, true, 171);
    const Tensor stats_host = host_f64({1, 0, group_grad_sq(g.cpu)});
    const SgdHyper h{0.05, 0.0, 0.0, 0.0, false, true};
    ops::sgd_step_group(h, g.cpu, stats_host, 0);
    ops::sgd_step_group(h, g.cuda, to_cuda(stats_host), 0);
    compare_groups(g, 2, 1e-6, 1e-5);
  }
}

TEST_CASE("CUDA adam_step_group matches the CPU, plain and clipped, with and without amsgrad", "[cuda]") {
  require_gpu();
  for (bool amsgrad : {false, true})
    for (double max_norm : {0.0, 1.0}) {
      INFO("amsgrad " << amsgrad << " max_norm " << max_norm);
      GroupPair g = make_groups(5, !amsgrad, 181);
      for (int step = 1; step <= 3; ++step) {
        refresh_grads(g, 181 + static_cast<uint64_t>(step) * 1000);
        const Tensor stats_host = host_f64({2.5, 7, group_grad_sq(g.cpu)});
        const AdamHyper h = adam_hyper(step, true);
        ops::adam_step_group(h, amsgrad, g.cpu, stats_host, max_norm);
        ops::adam_step_group(h, amsgrad, g.cuda, to_cuda(stats_host), max_norm);
      }
      compare_groups(g, 5, 1e-6, 1e-5);  // tolerance as for the one-row test
    }
}

TEST_CASE("CUDA group steps leave everything untouched when the loss or the gradient norm is not finite", "[cuda]") {
  require_gpu();
  for (const auto& bad : {std::vector<double>{kNaN, 1, 4}, std::vector<double>{1, 1, kInf},
                          std::vector<double>{1, 1, kNaN}, std::vector<double>{-kInf, 1, 4}}) {
    INFO("stats " << bad[0] << " " << bad[1] << " " << bad[2]);
    const Tensor stats_host = host_f64({bad[0], bad[1], bad[2]});
    const Tensor stats_d = to_cuda(stats_host);
    GroupPair sgd = make_groups(3, false, 191), adam = make_groups(5, false, 192);
    const GroupPair sgd_before = make_groups(3, false, 191), adam_before = make_groups(5, false, 192);
    const SgdHyper hs{0.1, 0.9, 0.0, 0.01, false, true};
    for (double max_norm : {0.0, 1.0}) {
      ops::sgd_step_group(hs, sgd.cpu, stats_host, max_norm);
      ops::sgd_step_group(hs, sgd.cuda, stats_d, max_norm);
      ops::adam_step_group(adam_hyper(1, false), true, adam.cpu, stats_host, max_norm);
      ops::adam_step_group(adam_hyper(1, false), true, adam.cuda, stats_d, max_norm);
    }
    compare_groups(sgd, 3, 0, 0);  // the CPU is untouched too, so equal to it means untouched
    compare_groups(adam, 5, 0, 0);
    for (size_t r = 0; r < sgd.cpu.rows.size(); ++r) {
      check_exact(sgd.cpu.rows[r][0], sgd_before.cpu.rows[r][0]);
      check_exact(adam.cpu.rows[r][0], adam_before.cpu.rows[r][0]);
    }
  }
}

TEST_CASE("CUDA accumulate_step adds a finite step and counts a skipped one", "[cuda]") {
  require_gpu();
  const std::vector<std::vector<double>> cases{{2.5, 7, 9}, {kNaN, 7, 9}, {2.5, 7, kInf}, {2.5, kNaN, 9}};
  for (const auto& st : cases) {
    INFO("stats " << st[0] << " " << st[1] << " " << st[2]);
    const Tensor stats_host = host_f64({st[0], st[1], st[2]});
    Tensor w_cpu = host_f64({1, 2, 3});
    ops::accumulate_step(stats_host, w_cpu);
    Guarded64 w = guarded_copy64(host_f64({1, 2, 3}));
    ops::accumulate_step(to_cuda(stats_host), w.inner);
    check_exact(w.host_checked(true), w_cpu);  // one double addition each
  }
}

TEST_CASE("CUDA causal attention matches the CPU forward and backward", "[cuda]") {
  require_gpu();
  // T not a multiple of the warp; head sizes below, at and above 32 (the warp kernels' lanes hold one to three
  // columns; heads of up to 32 in f32 take the row kernels, whose 32-row tiles T = 37 and 100 cross: 2 and 4 tiles).
  const std::vector<std::array<int64_t, 3>> configs{{3, 5, 37}, {2, 32, 37}, {1, 72, 37}, {2, 32, 100}, {4, 17, 100}};
  for (auto [heads, d, t] : configs) {  // {heads, head size, T}
    INFO("heads " << heads << " d " << d << " T " << t);
    const int64_t nb = 2, c = heads * d;
    const Tensor qkv = seeded(Shape{nb, t, 3 * c}, 101, -1, 1), dout = seeded(Shape{nb, t, c}, 102);
    Tensor out_cpu = Tensor::empty(Shape{nb, t, c}, DType::f32);
    Tensor lse_cpu = Tensor::empty(Shape{nb, heads, t}, DType::f32);
    ops::attention_forward(qkv, heads, {}, out_cpu, lse_cpu);
    Guarded out(out_cpu.shape()), lse(lse_cpu.shape());
    const Tensor qkv_d = to_cuda(qkv);
    ops::attention_forward(qkv_d, heads, {}, out.inner, lse.inner);
    // Both sides sum in double and round once to f32; only the order of the double sums differs (the device adds
    // lane-strided partial dot products, and rescales its running sum as the maximum grows): 1 ulp of f32 plus a
    // small absolute floor for outputs near 0.
    check_close(out.host_checked(), out_cpu, 1e-6, 2.5e-7);
    check_close(lse.host_checked(), lse_cpu, 1e-6, 2.5e-7);

    // Backward from the CPU's out and lse on both sides.
    Tensor dqkv_cpu = Tensor::empty(qkv.shape(), DType::f32), delta_cpu = Tensor::empty(lse_cpu.shape(), DType::f32);
    ops::attention_backward(qkv, out_cpu, lse_cpu, dout, heads, {}, delta_cpu, dqkv_cpu);
    Guarded dqkv(qkv.shape());
    Tensor delta_d = Tensor::empty(lse_cpu.shape(), DType::f32, Device::cuda(0));
    ops::attention_backward(qkv_d, to_cuda(out_cpu), to_cuda(lse_cpu), to_cuda(dout), heads, {}, delta_d, dqkv.inner);
    // delta is rounded to f32 on both sides before use; the sums over up to 37 pairs in double: 1e-5 absolute (the
    // gradients are O(1) and cancel) plus 1e-5 relative.
    check_close(dqkv.host_checked(), dqkv_cpu, 1e-5, 1e-5);
  }
}

// The 16-bit activation copies (ops/half_storage.h) on the device hold the CPU's bits, and widen back to the CPU's
// floats: round to nearest even on both sides, over ties, NaN, infinities, subnormals and values past fp16's range.
TEST_CASE("CUDA pack_activation and unpack_activation give the CPU's 16-bit copies and floats", "[cuda]") {
  require_gpu();
  Tensor y = seeded(Shape{3, 1000}, 120, -70000, 70000);
  float* p = y.data<float>();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {
      0.0f,      -0.0f,      inf,      -inf,     nan,      1.0f + 0x1p-8f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-8f,
      0x1p-130f, -0x1p-140f, 65520.0f, 65519.0f, 0x1p-25f, 3.0e38f};
  for (size_t i = 0; i < std::size(specials); ++i) p[i] = specials[i];
  for (int64_t i = std::size(specials); i < 200; ++i) p[i] *= 0x1p-20f;  // small values: fp16 subnormals
  for (const HalfFormat f : {HalfFormat::bf16, HalfFormat::fp16}) {
    INFO((f == HalfFormat::bf16 ? "bf16" : "fp16"));
    std::vector<uint16_t> cpu_bits(static_cast<size_t>(y.numel()));
    ops::pack_activation(f, y, cpu_bits.data());
    Tensor cpu_back = Tensor::empty(y.shape(), DType::f32);
    ops::unpack_activation(f, cpu_bits.data(), cpu_back);

    const Tensor yd = to_cuda(y);
    const std::shared_ptr<Storage> bits = allocate_storage(cpu_bits.size() * 2, Device::cuda(0));
    ops::pack_activation(f, yd, bits->ptr);
    Guarded back(y.shape());
    ops::unpack_activation(f, bits->ptr, back.inner);
    const Tensor got = back.host_checked(true);
    for (int64_t i = 0; i < y.numel(); ++i) {
      INFO("element " << i << ": " << p[i]);
      const float a = got.data<float>()[i], b = cpu_back.data<float>()[i];
      if (std::isnan(b))
        CHECK(std::isnan(a));
      else
        CHECK(std::memcmp(&a, &b, sizeof a) == 0);
    }
  }
}

// bf16/fp16 attention (ops/cuda/attention.cu, ops/cpu/attention.cpp): both sides multiply q, k, v, dout, P and dS
// rounded to the format with wide sums. The forward differs in where P is rounded: the CPU rounds the normalised
// probability, the device exp(s − running max) before its rescaling, each rounding at most `u` (2⁻⁹ bf16, 2⁻¹²
// fp16) relative; out = Σ P v with Σ P = 1 and |v| ≤ 1 then differs by at most ~2u (tolerance 4u). The backward reads
// the same rounded operands on both sides and rounds P and dS of the same values, so it differs where the sums' order
// moves a value across a rounding boundary: 4u of the largest gradient. The bf16 output must also sit away from the
// fp32 one (q, k, v rounded by up to 2⁻⁹): more than the fp32 test's tolerance.
TEST_CASE("CUDA causal attention in bf16 and fp16 matches the CPU's half attention", "[cuda]") {
  require_gpu();
  const ScopedEnvVar own_kernels("GPUTRAIN_CUDNN_ATTENTION", "0");  // cuDNN's: test_cuda_attention.cpp
  const int64_t d = GENERATE(40, 24);  // the warp kernels, then the row kernels (heads of at most 32)
  INFO("d " << d);
  const int64_t nb = 2, t = 37, heads = 3, c = heads * d;
  const Tensor qkv = seeded(Shape{nb, t, 3 * c}, 111, -1, 1), dout = seeded(Shape{nb, t, c}, 112, -1, 1);
  const Tensor qkv_d = to_cuda(qkv);
  Tensor out_fp32 = Tensor::empty(Shape{nb, t, c}, DType::f32),
         lse_fp32 = Tensor::empty(Shape{nb, heads, t}, DType::f32);
  ops::attention_forward(qkv, heads, {}, out_fp32, lse_fp32);
  for (const Precision p : {Precision::bf16, Precision::fp16}) {
    INFO(to_string(p));
    const double u = p == Precision::bf16 ? 0x1p-9 : 0x1p-12;
    const ProductPrecisionScope autocast(p);
    Tensor out_cpu = Tensor::empty(out_fp32.shape(), DType::f32), lse_cpu = Tensor::empty(lse_fp32.shape(), DType::f32);
    ops::attention_forward(qkv, heads, {}, out_cpu, lse_cpu);
    Guarded out(out_cpu.shape()), lse(lse_cpu.shape());
    ops::attention_forward(qkv_d, heads, {}, out.inner, lse.inner);
    const Tensor got = out.host_checked();
    check_close(got, out_cpu, 4 * u, 0);
    check_close(lse.host_checked(), lse_cpu, 1e-4, 1e-4);  // the same rounded scores, summed wide on both sides
    if (p == Precision::bf16) {
      double far = 0;
      for (int64_t i = 0; i < got.numel(); ++i)
        far = std::max(far, std::abs(static_cast<double>(got.data<float>()[i]) - out_fp32.data<float>()[i]));
      CHECK(far > 1e-4);
    }

    Tensor dqkv_cpu = Tensor::empty(qkv.shape(), DType::f32), delta_cpu = Tensor::empty(lse_cpu.shape(), DType::f32);
    ops::attention_backward(qkv, out_cpu, lse_cpu, dout, heads, {}, delta_cpu, dqkv_cpu);
    Guarded dqkv(qkv.shape());
    Tensor delta_d = Tensor::empty(lse_cpu.shape(), DType::f32, Device::cuda(0));
    ops::attention_backward(qkv_d, to_cuda(out_cpu), to_cuda(lse_cpu), to_cuda(dout), heads, {}, delta_d, dqkv.inner);
    double largest = 0;
    for (int64_t i = 0; i < dqkv_cpu.numel(); ++i)
      largest = std::max(largest, static_cast<double>(std::abs(dqkv_cpu.data<float>()[i])));
    check_close(dqkv.host_checked(), dqkv_cpu, 4 * u * largest + 1e-5, 1e-5);
  }
}

// Attention dropout: the device draws the CPU's mask (ops/math.h) for every (query, key) pair, forward and backward.
// f64 first, where both sides sum in double and differ only in the order of the sums: a pair masked differently
// would move an output by O(0.1), far past 1e-12. Then f32, the training dtype, with the backward's tolerance of the
// test above: the CPU rounds each scaled probability to f32 before its GEMM.
TEST_CASE("CUDA causal attention with dropout matches the CPU's mask forward and backward", "[cuda]") {
  require_gpu();
  const ops::AttentionDropout drop{0.25, 0xabcdef, 7};
  for (const DType dtype : {DType::f64, DType::f32}) {
    for (auto [heads, d] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {1, 72}}) {
      INFO((dtype == DType::f64 ? "f64" : "f32") << " heads " << heads << " d " << d);
      const int64_t nb = 2, t = 37, c = heads * d;
      auto as = [&](const Tensor& f32) {
        Tensor x = Tensor::empty(f32.shape(), dtype);
        for (int64_t i = 0; i < x.numel(); ++i)
          if (dtype == DType::f64)
            x.data<double>()[i] = f32.data<float>()[i];
          else
            x.data<float>()[i] = f32.data<float>()[i];
        return x;
      };
      const Tensor qkv = as(seeded(Shape{nb, t, 3 * c}, 104, -1, 1)), dout = as(seeded(Shape{nb, t, c}, 105));
      Tensor out_cpu = Tensor::empty(Shape{nb, t, c}, dtype), lse_cpu = Tensor::empty(Shape{nb, heads, t}, dtype);
      ops::attention_forward(qkv, heads, drop, out_cpu, lse_cpu);
      Tensor dqkv_cpu = Tensor::empty(qkv.shape(), dtype), delta_cpu = Tensor::empty(lse_cpu.shape(), dtype);
      ops::attention_backward(qkv, out_cpu, lse_cpu, dout, heads, drop, delta_cpu, dqkv_cpu);
      const Tensor qkv_d = to_cuda(qkv);
      Tensor delta_d = Tensor::empty(lse_cpu.shape(), dtype, Device::cuda(0));
      const double atol = dtype == DType::f64 ? 1e-12 : 1e-5, rtol = dtype == DType::f64 ? 1e-12 : 1e-5;
      if (dtype == DType::f64) {
        Guarded64 out(out_cpu.shape()), lse(lse_cpu.shape()), dqkv(qkv.shape());
        ops::attention_forward(qkv_d, heads, drop, out.inner, lse.inner);
        check_close(out.host_checked(), out_cpu, atol, rtol);
        check_close(lse.host_checked(), lse_cpu, atol, rtol);
        ops::attention_backward(qkv_d, to_cuda(out_cpu), to_cuda(lse_cpu), to_cuda(dout), heads, drop, delta_d,
                                dqkv.inner);
        check_close(dqkv.host_checked(), dqkv_cpu, atol, rtol);
      } else {
        Guarded out(out_cpu.shape()), lse(lse_cpu.shape()), dqkv(qkv.shape());
        ops::attention_forward(qkv_d, heads, drop, out.inner, lse.inner);
        check_close(out.host_checked(), out_cpu, atol, rtol);
        check_close(lse.host_checked(), lse_cpu, 1e-6, 2.5e-7);  // lse is before dropout: as in the test above
        ops::attention_backward(qkv_d, to_cuda(out_cpu), to_cuda(lse_cpu), to_cuda(dout), heads, drop, delta_d,
                                dqkv.inner);
        check_close(dqkv.host_checked(), dqkv_cpu, atol, rtol);
      }
    }
  }
}

TEST_CASE("CUDA attention decoding (the key/value cache's new rows) matches the CPU", "[cuda]") {
  require_gpu();
  for (auto [heads, d] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {1, 72}}) {
    const int64_t nb = 2, len = 37, c = heads * d;
    const Tensor qkv = seeded(Shape{nb, len, 3 * c}, 103, -1, 1);
    const Tensor qkv_d = to_cuda(qkv);
    // A prefill of 9 rows at 0, one row in the middle, the last 4 rows (up to the end of the cache).
    for (auto [first, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 9}, {20, 1}, {33, 4}}) {
      INFO("heads " << heads << " d " << d << " rows [" << first << ", " << first + n << ")");
      Tensor out_cpu = Tensor::empty(Shape{nb, n, c}, DType::f32);
      ops::attention_decode(qkv, heads, first, out_cpu);
      Guarded out(out_cpu.shape());
      ops::attention_decode(qkv_d, heads, first, out.inner);
      // The forward's kernel on a subset of rows: as in the forward test, 1 ulp of f32 plus a small floor.
      check_close(out.host_checked(), out_cpu, 1e-6, 2.5e-7);
    }
  }
}
