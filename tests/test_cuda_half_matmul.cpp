// The CUDA dense-layer ops on 16-bit activation tensors (Model::set_activation_dtype), which under the precision of
// their own format read them as cuBLASLt's operands and write 16-bit results (ops/cuda/matmul.cu), against the CPU's
// same ops on the same 16-bit host tensors, which widen them to f32 (ops/wide.h), under the same
// ProductPrecisionScope: matmul (16-bit a, b and c; a 16-bit dy beside an f32 operand into an f32 weight gradient and
// into a 16-bit result), add_row_bias, sum_rows, linear_forward, linear_forward_act, linear_forward_add,
// linear_backward_weight and linear_backward, in bf16 and fp16, widths on and off multiples of 8, beta 0 and 1, with
// sentinels around every CUDA output and a second CUDA run that must give the same bits. The CUDA side must make no
// HalfOperand copy of a 16-bit operand (cuda::half_operand_copies counts the copies): only an f32 operand that no
// forward rounded as a weight is copied. Outside the native path (an fp32 scope, a scope of the other format) the
// CUDA ops widen as the CPU does and must give its numbers too. Without a usable GPU every case exits with ctest's
// skip code (77) after printing why.
//
// Tolerances. Both sides multiply the same 16-bit operands (an f32 operand rounded to the format on both sides), each
// product exact in f32, and add them in f32 in different orders: |Δ| ≤ 1e-5 · K · 16 before the output is stored, as
// in test_cuda_epilogues.cpp (K terms |x·w| ≤ 16, inputs in [-4, 4)). A 16-bit output is then rounded once on each
// side, and two sums that close can round to neighbouring 16-bit numbers: 2 ulps of the output's format relative to
// the value on top (2 · 2⁻⁷ · |v| in bf16, 2 · 2⁻¹⁰ · |v| in fp16; one for the flip, one for the margin; 2 · 2⁻²³
// for an f32 output). A missing bias or term, a wrong transpose or 16 bits read as another type is off by order 1 and
// more. add_row_bias adds in f32 and rounds once on both sides: the same bits. sum_rows sums R rows |dy| ≤ 4 (in
// double on CUDA): 1e-5 · R · 4. GELU (cuBLASLt's tanh, possibly the hardware's approximation): 1.2× the product's
// bound and 2⁻¹⁰ · |h| more, h its input (test_cuda_epilogues.cpp). Beside a 16-bit output cuBLASLt's epilogue adds
// the bias's 16-bit copy (its bias has D's type) where the CPU adds the f32 bias: half an ulp of |bias| ≤ 4 more
// (bias_tol).
#include "cuda_helpers.h"
#include "ops/cuda/half_scratch.h"
#include "ops/matmul.h"
#include "ops/precision.h"
#include "ops/wide.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// `values` (f32, host) in `dtype`: rounded to nearest even for a 16-bit dtype.
Tensor in_dtype(const Tensor& values, DType dtype) {
  Tensor t = Tensor::empty(values.shape(), dtype);
  ops::convert(values, t);
  return t;
}

/// A host tensor widened to f32 (exact for 16 bits).
Tensor widened(const Tensor& host) { return in_dtype(host, DType::f32); }

/// Seeded values in [-4, 4) in `dtype`.
Tensor seeded_in(const Shape& shape, uint64_t seed, DType dtype) { return in_dtype(seeded(shape, seed), dtype); }

/// The largest spacing of `dtype`'s numbers relative to the value (2^(1 - significant bits)).
double ulp(DType dtype) { return dtype == DType::bf16 ? 0x1p-7 : dtype == DType::f16 ? 0x1p-10 : 0x1p-23; }

Precision precision_of(DType half) { return half == DType::bf16 ? Precision::bf16 : Precision::fp16; }

/// The bias's own rounding to `out`'s 16-bit format (cuBLASLt's epilogue adds that copy): half an ulp of |b| < 4.
double bias_tol(DType out, bool with_bias) { return with_bias && is_half(out) ? 4 * ulp(out) / 2 : 0; }

/// One output of an op under test.
struct Out {
  Tensor init;                    // its starting values (host, in the output's dtype); undefined: the op gets none
  bool read = false;              // the op reads them (beta 1, add_row_bias's y); otherwise they start as NaN on CUDA
  double atol = 0;                // the sums' bound (file comment); the output's 2 ulps are added to it
  const Tensor* scale = nullptr;  // f32 host, the output's shape: tol += scale_rel · |scale| (GELU's input)
  double scale_rel = 0;
  bool exact = false;  // the CPU's bits (one f32 sum rounded once on both sides)
};

/// A CUDA output of any dtype between sentinels: the op sees `inner`.
class GuardedOut {
 public:
  GuardedOut(const Tensor& init, bool read) : m_n(init.numel()), m_shape(init.shape()) {
    Tensor start = Tensor::empty(Shape{m_n + 2 * kGuard}, DType::f32);
    const Tensor values = widened(init);
    for (int64_t i = 0; i < start.numel(); ++i) start.data<float>()[i] = kSentinel;
    for (int64_t i = 0; i < m_n; ++i) start.data<float>()[kGuard + i] = read ? values.data<float>()[i] : kNaN;
    m_host = in_dtype(start, init.dtype());
    m_outer = to_cuda(m_host);
    m_inner = m_outer.slice0(kGuard, m_n).view(m_shape);
  }
  const Tensor& inner() const { return m_inner; }
  /// Copies back; fails on a touched sentinel or a non-finite value inside.
  Tensor host_checked() const {
    const Tensor h = to_host(m_outer);
    const size_t guard = static_cast<size_t>(kGuard) * dtype_size(h.dtype()), inside = m_inner.bytes();
    const auto *got = static_cast<const char*>(h.raw()), *want = static_cast<const char*>(m_host.raw());
    INFO("the sentinels before and after the output");
    REQUIRE(std::memcmp(got, want, guard) == 0);
    REQUIRE(std::memcmp(got + guard + inside, want + guard + inside, guard) == 0);
    const Tensor result = h.slice0(kGuard, m_n).view(m_shape).clone(), wide = widened(result);
    for (int64_t i = 0; i < wide.numel(); ++i) REQUIRE(std::isfinite(wide.data<float>()[i]));
    return result;
  }

 private:
  int64_t m_n;
  Shape m_shape;
  Tensor m_host, m_outer, m_inner;
};

using Op = std::function<void(const std::vector<Tensor>& in, std::vector<Tensor>& out)>;

/// Runs `op` on the host inputs (the CPU) and twice on their CUDA copies inside one ProductPrecisionScope of `p`:
/// the two CUDA runs give the same bits, the first one the CPU's numbers within each output's tolerance, and, where
/// `copies` is given, it made that many HalfOperand copies.
void compare(Precision p, const std::vector<Tensor>& in, const std::vector<Out>& outs, const Op& op,
             std::optional<int64_t> copies) {
  const ProductPrecisionScope scope(p);
  std::vector<Tensor> cpu;
  for (const Out& o : outs) cpu.push_back(o.init.defined() ? o.init.clone() : Tensor());
  op(in, cpu);
  std::vector<Tensor> dev_in;
  for (const Tensor& t : in) dev_in.push_back(t.defined() ? to_cuda(t) : Tensor());
  std::vector<std::vector<Tensor>> runs;
  for (int run = 0; run < 2; ++run) {
    std::vector<std::optional<GuardedOut>> guarded;
    std::vector<Tensor> dev_out;
    for (const Out& o : outs) {
      guarded.emplace_back();
      if (o.init.defined()) guarded.back().emplace(o.init, o.read);
      dev_out.push_back(o.init.defined() ? guarded.back()->inner() : Tensor());
    }
    const int64_t before = cuda::half_operand_copies();
    op(dev_in, dev_out);
    if (run == 0 && copies) CHECK(cuda::half_operand_copies() - before == *copies);
    runs.emplace_back();
    for (const auto& g : guarded) runs.back().push_back(g ? g->host_checked() : Tensor());
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].init.defined()) continue;
    INFO("output " << k << " (" << dtype_name(outs[k].init.dtype()) << ")");
    const Tensor &first = runs[0][k], &second = runs[1][k];
    CHECK(std::memcmp(first.raw(), second.raw(), first.bytes()) == 0);  // deterministic
    if (outs[k].exact) {
      CHECK(std::memcmp(first.raw(), cpu[k].raw(), first.bytes()) == 0);
      continue;
    }
    const Tensor got = widened(first), want = widened(cpu[k]);
    const double rel = 2 * ulp(outs[k].init.dtype());
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double a = got.data<float>()[i], b = want.data<float>()[i];
      const double s = outs[k].scale ? std::abs(outs[k].scale->data<float>()[i]) : 0.0;
      INFO("element " << i << ": cuda " << a << " cpu " << b);
      REQUIRE(std::abs(a - b) <= outs[k].atol + rel * std::abs(b) + outs[k].scale_rel * s);
    }
  }
}

/// The sums' bound for K terms |x·w| ≤ 16 (file comment).
double sum_tol(int64_t k) { return 1e-5 * static_cast<double>(k) * 16; }

/// Rows × in inputs, out × in weights: off multiples of 8 (37, 29, 45), on them (64, 32, 48), tiny (5, 7, 3).
struct Dims {
  int64_t rows, in, out;
};
constexpr Dims kDims[] = {{37, 29, 45}, {64, 32, 48}, {5, 7, 3}};
constexpr DType kHalves[] = {DType::bf16, DType::f16};

void check_matmul(DType h, const Dims& d, double beta, uint64_t seed) {
  INFO("matmul " << dtype_name(h) << " rows " << d.rows << " in " << d.in << " out " << d.out << " beta " << beta);
  const Precision p = precision_of(h);
  const bool read = beta != 0;
  const auto mm = [beta](bool ta, bool tb) {
    return Op([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) {
      ops::matmul(in[0], ta, in[1], tb, out[0], beta);
    });
  };
  {  // all 16-bit: y (rows, out) = x (rows, in) · wᵀ, and the same with x stored transposed
    INFO("16-bit a, b and c");
    const Tensor x = seeded_in(Shape{d.rows, d.in}, seed, h), xt = seeded_in(Shape{d.in, d.rows}, seed + 1, h);
    const Tensor w = seeded_in(Shape{d.out, d.in}, seed + 2, h);
    const Out c{.init = seeded_in(Shape{d.rows, d.out}, seed + 3, h), .read = read, .atol = sum_tol(d.in)};
    compare(p, {x, w}, {c}, mm(false, true), 0);
    compare(p, {xt, w}, {c}, mm(true, true), 0);
  }
  {  // attention's dW_proj = dyᵀ · att: a 16-bit dy, an f32 att (copied), into an f32 gradient
    INFO("16-bit a, f32 b, f32 c");
    const Tensor dy = seeded_in(Shape{d.rows, d.out}, seed + 4, h), att = seeded(Shape{d.rows, d.in}, seed + 5);
    const Out dw{.init = seeded(Shape{d.out, d.in}, seed + 6), .read = read, .atol = sum_tol(d.rows)};
    compare(p, {dy, att}, {dw}, mm(true, false), 1);
  }
  {  // datt = dy · W: a 16-bit dy, an f32 W (copied: no forward rounded it in this scope), into a 16-bit result
    INFO("16-bit a, f32 b, 16-bit c");
    const Tensor dy = seeded_in(Shape{d.rows, d.out}, seed + 7, h), w = seeded(Shape{d.out, d.in}, seed + 8);
    const Out datt{.init = seeded_in(Shape{d.rows, d.in}, seed + 9, h), .read = read, .atol = sum_tol(d.out)};
    compare(p, {dy, w}, {datt}, mm(false, false), 1);
  }
}

void check_bias_ops(DType h, const Dims& d, uint64_t seed) {
  INFO("add_row_bias, sum_rows " << dtype_name(h) << " rows " << d.rows << " cols " << d.out);
  const Precision p = precision_of(h);
  const Tensor bias = seeded(Shape{d.out}, seed);
  const Out y{.init = seeded_in(Shape{d.rows, d.out}, seed + 1, h), .read = true, .exact = true};
  compare(
      p, {bias}, {y}, [](const std::vector<Tensor>& in, std::vector<Tensor>& out) { ops::add_row_bias(out[0], in[0]); },
      0);
  const Tensor dy = seeded_in(Shape{d.rows, d.out}, seed + 2, h);
  for (const double beta : {0.0, 1.0}) {
    const Out db{.init = seeded(Shape{d.out}, seed + 3), .read = beta != 0, .atol = 1e-5 * 4 * d.rows};
    compare(
        p, {dy}, {db},
        [beta](const std::vector<Tensor>& in, std::vector<Tensor>& out) { ops::sum_rows(in[0], out[0], beta); }, 0);
  }
}

void check_linear_forward(DType h, const Dims& d, bool with_bias, uint64_t seed) {
  INFO("linear_forward " << dtype_name(h) << " rows " << d.rows << " in " << d.in << " out " << d.out
                         << (with_bias ? " bias" : " no bias"));
  const Tensor x = seeded_in(Shape{d.rows, d.in}, seed, h), w = seeded(Shape{d.out, d.in}, seed + 1);
  const Tensor bias = with_bias ? seeded(Shape{d.out}, seed + 2) : Tensor();
  const Out y{.init = seeded_in(Shape{d.rows, d.out}, seed + 3, h), .atol = sum_tol(d.in) + bias_tol(h, with_bias)};
  // w through half_weight, x as it is: no HalfOperand copy.
  compare(
      precision_of(h), {x, w, bias}, {y},
      [](const std::vector<Tensor>& in, std::vector<Tensor>& out) { ops::linear_forward(in[0], in[1], in[2], out[0]); },
      0);
}

void check_linear_act(DType h, const Dims& d, Activation act, bool keep_h, bool with_bias, uint64_t seed) {
  INFO("linear_forward_act " << dtype_name(h) << (act == Activation::relu ? " relu" : " gelu_tanh")
                             << (keep_h ? " keeping h" : "") << " rows " << d.rows << " in " << d.in << " out " << d.out
                             << (with_bias ? " bias" : " no bias"));
  const Precision p = precision_of(h);
  const Tensor x = seeded_in(Shape{d.rows, d.in}, seed, h), w = seeded(Shape{d.out, d.in}, seed + 1);
  const Tensor bias = with_bias ? seeded(Shape{d.out}, seed + 2) : Tensor();
  const Shape ys{d.rows, d.out};
  Tensor sum = Tensor::empty(ys, DType::f32);  // GELU's input, for its bound
  {
    const ProductPrecisionScope scope(p);
    ops::linear_forward(widened(x), w, bias, sum);
  }
  const double tol = sum_tol(d.in) + bias_tol(h, with_bias);
  const Out hout{.init = keep_h ? seeded_in(ys, seed + 3, h) : Tensor(), .atol = tol};
  const Out y{.init = seeded_in(ys, seed + 4, h),
              .atol = (act == Activation::relu ? 1.0 : 1.2) * tol,
              .scale = &sum,
              .scale_rel = act == Activation::relu ? 0 : 0x1p-10};
  compare(
      p, {x, w, bias}, {hout, y},
      [act](const std::vector<Tensor>& in, std::vector<Tensor>& out) {
        ops::linear_forward_act(in[0], in[1], in[2], act, out[0], out[1]);
      },
      0);
}

void check_linear_add(DType h, const Dims& d, bool with_bias, DType r_type, uint64_t seed) {
  INFO("linear_forward_add " << dtype_name(h) << " r " << dtype_name(r_type) << " rows " << d.rows << " in " << d.in
                             << " out " << d.out << (with_bias ? " bias" : " no bias"));
  const Tensor x = seeded_in(Shape{d.rows, d.in}, seed, h), w = seeded(Shape{d.out, d.in}, seed + 1);
  const Tensor bias = with_bias ? seeded(Shape{d.out}, seed + 2) : Tensor();
  const Tensor r = seeded_in(Shape{d.rows, d.out}, seed + 3, r_type);
  const Out y{.init = seeded_in(Shape{d.rows, d.out}, seed + 4, h), .atol = sum_tol(d.in) + bias_tol(h, with_bias)};
  // r of y's dtype is cuBLASLt's C; an f32 r goes through an f32 y (Wide, y rounded once): no HalfOperand copy either
  // way.
  compare(
      precision_of(h), {x, w, bias, r}, {y},
      [](const std::vector<Tensor>& in, std::vector<Tensor>& out) {
        ops::linear_forward_add(in[0], in[1], in[2], in[3], out[0]);
      },
      0);
}

void check_backward(DType h, const Dims& d, bool with_bias, double beta, bool with_dx, uint64_t seed) {
  INFO((with_dx ? "linear_backward " : "linear_backward_weight ")
       << dtype_name(h) << " rows " << d.rows << " in " << d.in << " out " << d.out
       << (with_bias ? " bias" : " no bias") << " beta " << beta);
  const Tensor dy = seeded_in(Shape{d.rows, d.out}, seed, h), x = seeded_in(Shape{d.rows, d.in}, seed + 1, h);
  const Tensor w = seeded(Shape{d.out, d.in}, seed + 2);
  const Out dw{.init = seeded(Shape{d.out, d.in}, seed + 3), .read = beta != 0, .atol = sum_tol(d.rows)};
  const Out db{.init = with_bias ? seeded(Shape{d.out}, seed + 4) : Tensor(),
               .read = beta != 0,
               .atol = 1e-5 * 4 * static_cast<double>(d.rows)};
  const Out dx{.init = with_dx ? seeded_in(Shape{d.rows, d.in}, seed + 5, h) : Tensor(), .atol = sum_tol(d.out)};
  const Op op = [beta, with_dx](const std::vector<Tensor>& in, std::vector<Tensor>& out) {
    if (with_dx)
      ops::linear_backward(in[0], in[1], nullptr, in[2], out[0], out[1], out[2], beta);
    else
      ops::linear_backward_weight(in[0], in[1], out[0], out[1], beta);
  };
  // dy and x are read as they are; dx = dy·W copies w, which no forward rounded in this scope.
  compare(precision_of(h), {dy, x, w}, {dw, db, dx}, op, with_dx ? 1 : 0);
}

}  // namespace

TEST_CASE("CUDA matmul takes 16-bit operands and results as they are, to the CPU's numbers, without copying them",
          "[cuda]") {
  require_gpu();
  uint64_t seed = 9000;
  for (const DType h : kHalves)
    for (const Dims& d : kDims)
      for (const double beta : {0.0, 1.0}) check_matmul(h, d, beta, seed += 10);
}

TEST_CASE("CUDA add_row_bias and sum_rows on 16-bit activations beside f32 parameters match the CPU", "[cuda]") {
  require_gpu();
  uint64_t seed = 9200;
  for (const DType h : kHalves)
    for (const Dims& d : kDims) check_bias_ops(h, d, seed += 4);
}

TEST_CASE("CUDA linear_forward on 16-bit x and y writes its bias epilogue's 16-bit D to the CPU's numbers", "[cuda]") {
  require_gpu();
  uint64_t seed = 9300;
  for (const DType h : kHalves)
    for (const Dims& d : kDims)
      for (const bool with_bias : {true, false}) check_linear_forward(h, d, with_bias, seed += 4);
}

TEST_CASE("CUDA linear_forward_act on 16-bit activations (relu, GELU, GELU keeping a 16-bit h) matches the CPU",
          "[cuda]") {
  require_gpu();
  uint64_t seed = 9400;
  for (const DType h : kHalves)
    for (const Dims& d : kDims)
      for (const Activation act : {Activation::relu, Activation::gelu_tanh})
        for (const bool keep_h : {true, false})
          for (const bool with_bias : {true, false}) check_linear_act(h, d, act, keep_h, with_bias, seed += 5);
}

TEST_CASE("CUDA linear_forward_add reads a 16-bit residual as cuBLASLt's C into a 16-bit y, and an f32 one apart",
          "[cuda]") {
  require_gpu();
  uint64_t seed = 9700;
  for (const DType h : kHalves)
    for (const Dims& d : kDims)
      for (const bool with_bias : {true, false})
        for (const DType r_type : {h, DType::f32}) check_linear_add(h, d, with_bias, r_type, seed += 5);
}

TEST_CASE("CUDA linear_backward and linear_backward_weight read 16-bit dy and x as they are into f32 dw and db",
          "[cuda]") {
  require_gpu();
  uint64_t seed = 9900;
  for (const DType h : kHalves)
    for (const Dims& d : kDims)
      for (const bool with_bias : {true, false})
        for (const double beta : {0.0, 1.0})
          for (const bool with_dx : {true, false}) check_backward(h, d, with_bias, beta, with_dx, seed += 6);
}

TEST_CASE("CUDA ops widen 16-bit activations outside the precision of their format, to the CPU's numbers", "[cuda]") {
  require_gpu();
  const Dims d = kDims[0];
  uint64_t seed = 10200;
  for (const DType h : kHalves)
    for (const Precision p : {Precision::fp32, h == DType::bf16 ? Precision::fp16 : Precision::bf16}) {
      INFO(dtype_name(h) << " activations under " << to_string(p));
      const Tensor x = seeded_in(Shape{d.rows, d.in}, seed += 4, h), w = seeded(Shape{d.out, d.in}, seed + 1);
      const Tensor bias = seeded(Shape{d.out}, seed + 2);
      const Out y{.init = seeded_in(Shape{d.rows, d.out}, seed + 3, h), .atol = sum_tol(d.in)};
      compare(
          p, {x, w, bias}, {y},
          [](const std::vector<Tensor>& in, std::vector<Tensor>& out) {
            ops::linear_forward(in[0], in[1], in[2], out[0]);
          },
          std::nullopt);
      compare(
          p, {x, seeded_in(Shape{d.out, d.in}, seed + 1, h)}, {y},
          [](const std::vector<Tensor>& in, std::vector<Tensor>& out) {
            ops::matmul(in[0], false, in[1], true, out[0], 0.0);
          },
          std::nullopt);
    }
}

TEST_CASE("a call with bf16 and f16 tensors is refused, naming both", "[cuda]") {
  require_gpu();
  const ProductPrecisionScope scope(Precision::bf16);
  const Tensor a = to_cuda(seeded_in(Shape{4, 8}, 10300, DType::bf16));
  const Tensor b = to_cuda(seeded_in(Shape{8, 8}, 10301, DType::f16));
  Tensor c = Tensor::empty(Shape{4, 8}, DType::bf16, Device::cuda(0));
  CHECK_THROWS_WITH(ops::matmul(a, false, b, false, c, 0.0), Catch::Contains("bf16 and f16"));
}
