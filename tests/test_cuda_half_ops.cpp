// The CUDA kernels that read and write 16-bit activations themselves (Model::set_activation_dtype): layernorm, the
// activations, add, scale, the block copies and embedding, in bf16 and f16, against the CPU on the same 16-bit tensors
// (which widens them through ops/wide.h and rounds each result once, the semantics the kernels keep). Each CUDA op
// runs twice for the same bits, and must not have made a Wide temporary (ops::wide_temporaries()).
#include "core/half.h"
#include "cuda_helpers.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/layernorm.h"
#include "ops/wide.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

/// A host tensor of `dtype` (bf16 or f16) holding the f32 values rounded to nearest even.
Tensor half_of(const Tensor& f32, DType dtype) {
  Tensor h = Tensor::empty(f32.shape(), dtype);
  ops::convert(f32, h);
  return h;
}

uint16_t bits_at(const Tensor& half, int64_t i) { return static_cast<const uint16_t*>(half.raw())[i]; }

double value_at(const Tensor& half, int64_t i) {
  const uint16_t b = bits_at(half, i);
  return half.dtype() == DType::bf16 ? bf16_to_float(b) : fp16_to_float(b);
}

/// How many 16-bit values of one format lie between a and b: bf16 and fp16 are both sign and magnitude, so the
/// magnitudes' bits count up with the values (+0 and −0 are 0 apart).
int64_t ulps(uint16_t a, uint16_t b) {
  auto ordered = [](uint16_t v) { return (v & 0x8000u) ? -int64_t{v & 0x7fffu} : int64_t{v & 0x7fffu}; };
  return std::abs(ordered(a) - ordered(b));
}

/// CUDA's 16-bit result against the CPU's: a NaN where the CPU has one (the payloads may differ: each rounding keeps
/// its own), else at most max_ulps apart or, for values that cancel to near zero, |Δ| ≤ atol.
void check_ulps(const Tensor& cuda_host, const Tensor& cpu, int64_t max_ulps, double atol = 0) {
  REQUIRE(cuda_host.dtype() == cpu.dtype());
  REQUIRE(cuda_host.numel() == cpu.numel());
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double a = value_at(cuda_host, i), b = value_at(cpu, i);
    INFO("element " << i << ": cuda " << a << " cpu " << b << " (" << ulps(bits_at(cuda_host, i), bits_at(cpu, i))
                    << " ulp)");
    if (std::isnan(b))
      REQUIRE(std::isnan(a));
    else
      REQUIRE((ulps(bits_at(cuda_host, i), bits_at(cpu, i)) <= max_ulps || std::abs(a - b) <= atol));
  }
}

/// The same bytes: two CUDA runs of a deterministic kernel, or an exact copy.
bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

/// A 16-bit CUDA tensor inside a buffer with sentinels on both sides (cuda_helpers.h's GuardedT for 16 bits): a
/// kernel that writes past a row's end, or before it, changes one.
struct GuardedHalf {
  static constexpr uint16_t kSentinelBits = 0x5a5a;  // 1.5e16 in bf16, 203.25 in fp16: no result here
  Tensor outer, inner;
  GuardedHalf(const Shape& shape, DType dtype) {
    const int64_t n = shape.numel();
    outer = Tensor::empty(Shape{n + 2 * kGuard}, dtype, Device::cuda(0));
    Tensor host = Tensor::empty(outer.shape(), dtype);
    auto* p = static_cast<uint16_t*>(host.raw());
    for (int64_t i = 0; i < host.numel(); ++i) p[i] = kSentinelBits;
    outer.copy_from(host);
    inner = outer.slice0(kGuard, n).view(shape);
  }
  explicit GuardedHalf(const Tensor& host) : GuardedHalf(host.shape(), host.dtype()) { inner.copy_from(host); }
  Tensor host_checked() const {
    const Tensor host = to_host(outer);
    const int64_t n = inner.numel();
    for (int64_t i = 0; i < kGuard; ++i) {
      INFO("sentinel " << i << " before / after the output");
      REQUIRE(bits_at(host, i) == kSentinelBits);
      REQUIRE(bits_at(host, kGuard + n + i) == kSentinelBits);
    }
    return host.slice0(kGuard, n).view(inner.shape()).clone();
  }
};

/// The column sums dgamma, dbeta of CUDA against the CPU's: |Δ| ≤ 1e-6·(|start| + Σ_r |term|) per column, the
/// tolerance of test_cuda_ops.cpp's f32 case (sums in another order, an x − μ in f32 on one side and in double on
/// the other). term(r, j) gives row r's term of column j.
template <class Term>
void check_column_sums(const Tensor& cuda_host, const Tensor& cpu, const Tensor& start, int64_t rows, Term&& term) {
  REQUIRE(cuda_host.numel() == cpu.numel());
  for (int64_t j = 0; j < cpu.numel(); ++j) {
    double magnitude = std::abs(start.data<float>()[j]);
    for (int64_t r = 0; r < rows; ++r) magnitude += std::abs(term(r, j));
    const double a = cuda_host.data<float>()[j], b = cpu.data<float>()[j];
    INFO("column " << j << ": cuda " << a << " cpu " << b << " magnitude " << magnitude);
    REQUIRE(std::abs(a - b) <= 1e-6 * magnitude);
  }
}

/// An f32 CUDA copy of a host tensor, guarded.
Guarded guarded_f32(const Tensor& host) {
  Guarded g(host.shape());
  g.inner.copy_from(host);
  return g;
}

/// Fails unless the calls between its construction and check() made no Wide temporary: the op read and wrote its
/// 16-bit tensors itself, with no conversion pass.
class NoWide {
 public:
  NoWide() : m_before(ops::wide_temporaries()) {}
  void check() const { REQUIRE(ops::wide_temporaries() == m_before); }

 private:
  int64_t m_before;
};

constexpr double kEps = 1e-5;

}  // namespace

TEST_CASE("a CPU op on 16-bit tensors widens them through Wide, an f32 op does not", "[cpu]") {
  // The counter the [cuda] cases below read to see that the CUDA ops took the 16-bit tensors themselves.
  const Tensor x = seeded(Shape{3, 10}, 1), gamma = seeded(Shape{10}, 2), beta = seeded(Shape{10}, 3);
  Tensor mean = Tensor::empty(Shape{3}, DType::f32), inv = Tensor::empty(Shape{3}, DType::f32);
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  int64_t before = ops::wide_temporaries();
  ops::layernorm_forward(x, gamma, beta, kEps, mean, inv, y);
  CHECK(ops::wide_temporaries() == before);
  Tensor y16 = Tensor::empty(x.shape(), DType::bf16);
  before = ops::wide_temporaries();
  ops::layernorm_forward(half_of(x, DType::bf16), gamma, beta, kEps, mean, inv, y16);
  CHECK(ops::wide_temporaries() == before + 2);  // x widened, y's f32 result
}

TEST_CASE("CUDA layernorm on 16-bit x, y, dy, dx matches the CPU's widened op within an ulp", "[cuda]") {
  require_gpu();
  const DType dt = GENERATE(DType::bf16, DType::f16);
  INFO(dtype_name(dt));
  // Row lengths under, over and far over a warp, none a multiple of 32: the kernels' strided loops and tails.
  for (auto [rows, d] : std::vector<std::pair<int64_t, int64_t>>{{6, 37}, {3, 300}, {2, 1001}}) {
    INFO("rows " << rows << " d " << d);
    const Tensor x = half_of(seeded(Shape{rows, d}, 11), dt), dy = half_of(seeded(Shape{rows, d}, 12, -1, 1), dt);
    const Tensor gamma = seeded(Shape{d}, 13, 0.5, 1.5), beta = seeded(Shape{d}, 14), dg0 = seeded(Shape{d}, 15),
                 db0 = seeded(Shape{d}, 16);
    Tensor y_cpu = Tensor::empty(x.shape(), dt), m_cpu = Tensor::empty(Shape{rows}, DType::f32),
           i_cpu = Tensor::empty(Shape{rows}, DType::f32);
    ops::layernorm_forward(x, gamma, beta, kEps, m_cpu, i_cpu, y_cpu);
    Tensor dx_cpu = Tensor::empty(x.shape(), dt), dg_cpu = dg0.clone(), db_cpu = db0.clone();
    ops::layernorm_backward(x, gamma, m_cpu, i_cpu, dy, dx_cpu, dg_cpu, db_cpu, 1.0);

    const Tensor xd = to_cuda(x), dyd = to_cuda(dy), gd = to_cuda(gamma), bd = to_cuda(beta);
    const Tensor md = to_cuda(m_cpu), id = to_cuda(i_cpu);
    GuardedHalf y1(x.shape(), dt), y2(x.shape(), dt), dx1(x.shape(), dt), dx2(x.shape(), dt);
    Guarded mean(Shape{rows}), inv(Shape{rows}), dg1 = guarded_f32(dg0), db1 = guarded_f32(db0), dg2 = guarded_f32(dg0),
                                                 db2 = guarded_f32(db0);
    const NoWide no_wide;
    ops::layernorm_forward(xd, gd, bd, kEps, mean.inner, inv.inner, y1.inner);
    ops::layernorm_forward(xd, gd, bd, kEps, mean.inner, inv.inner, y2.inner);
    // Backward from the CPU's saved statistics: the same inputs on both sides.
    ops::layernorm_backward(xd, gd, md, id, dyd, dx1.inner, dg1.inner, db1.inner, 1.0);
    ops::layernorm_backward(xd, gd, md, id, dyd, dx2.inner, dg2.inner, db2.inner, 1.0);
    no_wide.check();

    // Before rounding to 16 bits the two sides' f32 y and dx differ as in test_cuda_ops.cpp's f32 case (the CPU's
    // per-element arithmetic is f32, CUDA's double): |Δ| ≤ 1e-6 + 1e-6·|y|, 1e-5 + 1e-5·|dx|. The relative part is
    // far below a 16-bit ulp (2^-11 of the value at best), so each rounding once to 16 bits leaves them at most 1 ulp
    // apart, or, where a 16-bit ulp is below the absolute part (values near zero), within it plus an ulp: atol
    // 3e-6 for y, 3e-5 for dx.
    const Tensor y = y1.host_checked(), dx = dx1.host_checked();
    check_ulps(y, y_cpu, 1, 3e-6);
    check_ulps(dx, dx_cpu, 1, 3e-5);
    CHECK(same_bytes(y, y2.host_checked()));
    CHECK(same_bytes(dx, dx2.host_checked()));
    // The statistics and parameter gradients stay f32, with test_cuda_ops.cpp's tolerances: the statistics are
    // double sums in another order rounded to f32 once, an ulp or two apart.
    check_close(mean.host_checked(), m_cpu, 1e-9, 1e-6);
    check_close(inv.host_checked(), i_cpu, 1e-9, 1e-6);
    const Tensor dg = dg1.host_checked(), db = db1.host_checked();
    auto at = [d = d](const Tensor& t, int64_t r, int64_t j) { return value_at(t, r * d + j); };
    check_column_sums(dg, dg_cpu, dg0, rows, [&](int64_t r, int64_t j) {
      return at(dy, r, j) * (at(x, r, j) - m_cpu.data<float>()[r]) * i_cpu.data<float>()[r];
    });
    check_column_sums(db, db_cpu, db0, rows, [&](int64_t r, int64_t j) { return at(dy, r, j); });
    CHECK(same_bytes(dg, dg2.host_checked()));
    CHECK(same_bytes(db, db2.host_checked()));
  }
}

TEST_CASE("CUDA activations on 16-bit x, y, dy, dx match the CPU's widened ops within an ulp", "[cuda]") {
  require_gpu();
  const DType dt = GENERATE(DType::bf16, DType::f16);
  INFO(dtype_name(dt));
  const int64_t n = 5003;  // not a multiple of the 256 threads of a block
  const Tensor x = half_of(seeded(Shape{n}, 21), dt), dy = half_of(seeded(Shape{n}, 22, -1, 1), dt);
  for (Activation a :
       {Activation::gelu_tanh, Activation::gelu, Activation::relu, Activation::tanh, Activation::sigmoid}) {
    INFO("activation " << static_cast<int>(a));
    Tensor y_cpu = Tensor::empty(x.shape(), dt), dx_cpu = Tensor::empty(x.shape(), dt);
    ops::activation_forward(a, x, y_cpu);
    ops::activation_backward(a, x, y_cpu, dy, dx_cpu);

    const Tensor xd = to_cuda(x), yd = to_cuda(y_cpu), dyd = to_cuda(dy);
    GuardedHalf y1(x.shape(), dt), y2(x.shape(), dt), dx1(x.shape(), dt), dx2(x.shape(), dt);
    const NoWide no_wide;
    ops::activation_forward(a, xd, y1.inner);
    ops::activation_forward(a, xd, y2.inner);
    ops::activation_backward(a, xd, yd, dyd, dx1.inner);  // (from the CPU's y: the same inputs on both sides)
    ops::activation_backward(a, xd, yd, dyd, dx2.inner);
    no_wide.check();

    // The formulas are ops/math.h's on both sides, but CUDA's expf, erff and tanhf are not the CPU's exp_f32 and
    // libm: in f32 the two differ by |Δ| ≤ 1e-6 + 1e-5·|cpu| (test_cuda.cpp). The relative part is far below a 16-bit
    // ulp, so rounding each once to 16 bits leaves them at most 1 ulp apart, or, where the result cancels to near
    // zero (1 + erf(x) for x ≪ 0, GELU's derivative around x ≈ −0.75) and a 16-bit ulp is below 1e-6, within 1e-6
    // plus an ulp: atol 3e-6.
    const Tensor y = y1.host_checked(), dx = dx1.host_checked();
    check_ulps(y, y_cpu, 1, 3e-6);
    check_ulps(dx, dx_cpu, 1, 3e-6);
    CHECK(same_bytes(y, y2.host_checked()));
    CHECK(same_bytes(dx, dx2.host_checked()));
  }
}

TEST_CASE("CUDA activations and layernorm take an f32 input beside a 16-bit output and its gradient", "[cuda]") {
  // A layer whose input is the model's own f32 and whose output is held in 16 bits: x and dx f32, y and dy 16-bit.
  require_gpu();
  const DType dt = GENERATE(DType::bf16, DType::f16);
  INFO(dtype_name(dt));
  const int64_t n = 777;
  const Tensor x = seeded(Shape{n}, 31), dy = half_of(seeded(Shape{n}, 32, -1, 1), dt);
  Tensor y_cpu = Tensor::empty(x.shape(), dt), dx_cpu = Tensor::empty(x.shape(), DType::f32);
  ops::activation_forward(Activation::gelu_tanh, x, y_cpu);
  ops::activation_backward(Activation::gelu_tanh, x, y_cpu, dy, dx_cpu);
  const Tensor xd = to_cuda(x);
  GuardedHalf y(x.shape(), dt);
  Guarded dx(x.shape());
  const NoWide no_wide;
  ops::activation_forward(Activation::gelu_tanh, xd, y.inner);
  ops::activation_backward(Activation::gelu_tanh, xd, to_cuda(y_cpu), to_cuda(dy), dx.inner);
  no_wide.check();
  check_ulps(y.host_checked(), y_cpu, 1, 3e-6);        // (as for 16-bit x)
  check_close(dx.host_checked(), dx_cpu, 1e-6, 1e-5);  // dx in f32: test_cuda.cpp's f32 tolerance

  const int64_t rows = 3, d = 259;
  const Tensor xl = seeded(Shape{rows, d}, 33), gamma = seeded(Shape{d}, 34, 0.5, 1.5), beta = seeded(Shape{d}, 35);
  Tensor yl_cpu = Tensor::empty(xl.shape(), dt), m = Tensor::empty(Shape{rows}, DType::f32),
         i = Tensor::empty(Shape{rows}, DType::f32);
  ops::layernorm_forward(xl, gamma, beta, kEps, m, i, yl_cpu);
  GuardedHalf yl(xl.shape(), dt);
  Tensor md = Tensor::empty(m.shape(), DType::f32, Device::cuda(0)), id = md.clone();
  const NoWide no_wide_ln;
  ops::layernorm_forward(to_cuda(xl), to_cuda(gamma), to_cuda(beta), kEps, md, id, yl.inner);
  no_wide_ln.check();
  check_ulps(yl.host_checked(), yl_cpu, 1, 3e-6);  // (as for 16-bit x)
}

TEST_CASE("CUDA add, scale, copy_blocks and split_blocks on 16-bit tensors give the CPU's bits", "[cuda]") {
  require_gpu();
  const DType dt = GENERATE(DType::bf16, DType::f16);
  INFO(dtype_name(dt));
  const int64_t n = 5003, outer = 7, part = 13, whole = 29, offset = 9;
  const Tensor a = half_of(seeded(Shape{n}, 41), dt), b = half_of(seeded(Shape{n}, 42), dt);
  const Tensor src = half_of(seeded(Shape{outer, part}, 43), dt), big = half_of(seeded(Shape{outer, whole}, 44), dt);
  // The CPU: each sum in f32, rounded once; the copies move values, and a value survives widening exactly.
  Tensor sum_cpu = Tensor::empty(a.shape(), dt), scaled_cpu = a.clone(), copied_cpu = big.clone(),
         split_cpu = Tensor::empty(src.shape(), dt);
  ops::add(a, b, sum_cpu);
  ops::scale(scaled_cpu, 0.3);
  ops::copy_blocks(src, copied_cpu, outer, part, whole, offset);
  ops::split_blocks(big, split_cpu, outer, part, whole, offset);

  const Tensor ad = to_cuda(a), bd = to_cuda(b), srcd = to_cuda(src), bigd = to_cuda(big);
  std::vector<Tensor> runs[4];  // sum, scaled, copied, split: two runs each
  const NoWide no_wide;
  for (int run = 0; run < 2; ++run) {
    GuardedHalf sum(a.shape(), dt), scaled(a), copied(big), split(src.shape(), dt);
    ops::add(ad, bd, sum.inner);
    ops::scale(scaled.inner, 0.3);
    ops::copy_blocks(srcd, copied.inner, outer, part, whole, offset);
    ops::split_blocks(bigd, split.inner, outer, part, whole, offset);
    runs[0].push_back(sum.host_checked());
    runs[1].push_back(scaled.host_checked());
    runs[2].push_back(copied.host_checked());
    runs[3].push_back(split.host_checked());
  }
  no_wide.check();
  // One f32 addition or multiplication per element and one rounding, on both sides: the same bits (0 ulp).
  check_ulps(runs[0][0], sum_cpu, 0);
  check_ulps(runs[1][0], scaled_cpu, 0);
  CHECK(same_bytes(runs[2][0], copied_cpu));
  CHECK(same_bytes(runs[3][0], split_cpu));
  for (const auto& r : runs) CHECK(same_bytes(r[0], r[1]));

  // In place, y = a + y, as the residual layers add.
  GuardedHalf acc(b);
  ops::add(ad, acc.inner, acc.inner);
  check_ulps(acc.host_checked(), sum_cpu, 0);
}

TEST_CASE("CUDA embedding writes a 16-bit y and reads a 16-bit dy with the CPU's bits", "[cuda]") {
  require_gpu();
  const DType dt = GENERATE(DType::bf16, DType::f16);
  INFO(dtype_name(dt));
  const int64_t vocab = 11, dim = 37, n = 29;  // more tokens than rows: repeats add up in dweight
  Tensor idx = Tensor::empty(Shape{n}, DType::f32);
  for (int64_t k = 0; k < n; ++k) idx.data<float>()[k] = static_cast<float>((k * 7 + 3) % vocab);
  const Tensor weight = seeded(Shape{vocab, dim}, 51), dy = half_of(seeded(Shape{n, dim}, 52), dt),
               dw0 = seeded(Shape{vocab, dim}, 53);
  Tensor y_cpu = Tensor::empty(Shape{n, dim}, dt), dw_cpu = dw0.clone();
  ops::embedding_forward(idx, weight, y_cpu);
  ops::embedding_backward(idx, dy, dw_cpu, 1.0);

  const Tensor idxd = to_cuda(idx), wd = to_cuda(weight), dyd = to_cuda(dy);
  GuardedHalf y1(y_cpu.shape(), dt), y2(y_cpu.shape(), dt);
  Guarded dw1 = guarded_f32(dw0), dw2 = guarded_f32(dw0);
  const NoWide no_wide;
  ops::embedding_forward(idxd, wd, y1.inner);
  ops::embedding_forward(idxd, wd, y2.inner);
  ops::embedding_backward(idxd, dyd, dw1.inner, 1.0);
  ops::embedding_backward(idxd, dyd, dw2.inner, 1.0);
  no_wide.check();
  // y: each weight rounded once on both sides. dweight: dy widened exactly, added in token order in f32 on both
  // sides (embedding.cu sorts the tokens by row, stably): the same bits.
  const Tensor y = y1.host_checked(), dw = dw1.host_checked();
  check_ulps(y, y_cpu, 0);
  CHECK(same_bytes(dw, dw_cpu));
  CHECK(same_bytes(y, y2.host_checked()));
  CHECK(same_bytes(dw, dw2.host_checked()));

  // An index outside the table: on CUDA that row of the 16-bit y is NaN (ops/embedding.h), the others the CPU's.
  Tensor bad = idx.clone();
  bad.data<float>()[4] = static_cast<float>(vocab);
  GuardedHalf y3(y_cpu.shape(), dt);
  ops::embedding_forward(to_cuda(bad), wd, y3.inner);
  const Tensor y_bad = y3.host_checked();
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < dim; ++j) {
      INFO("token " << k << " column " << j);
      if (k == 4)
        REQUIRE(std::isnan(value_at(y_bad, k * dim + j)));
      else
        REQUIRE(bits_at(y_bad, k * dim + j) == bits_at(y_cpu, k * dim + j));
    }
}
