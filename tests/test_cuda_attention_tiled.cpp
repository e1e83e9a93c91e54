// The tiled f32 attention (ops/cuda/attention_tiled.cu) against the CPU's f32 attention (ops/cpu/attention.cpp):
// causal, heads of 64, 96 and 128, T = 77 and 130 (no multiple of the 16- to 64-row tiles), B = 2, forward out and lse,
// the evaluation forward, the backward's dqkv; in fp32 (f32 FMA) and under a tf32 ProductPrecisionScope (TF32 tensor
// cores); the same bits on a second run; a future key that changes no earlier row; which calls the tiled kernels take
// and GPUTRAIN_TILED_ATTENTION=0 giving the warp kernels; the rate at GPT-2's shape against the warp kernels.
// Without a usable GPU every [cuda] case exits with ctest's skip code (77) after printing why.
//
// Tolerances. Inputs are uniform in [−1, 1]; the backward runs from the CPU's out and lse on both sides.
// fp32: both sides multiply the same f32 values and sum in f32 (the CPU's softmax sum in double), in different orders.
// A chain of n f32 additions is off by at most n·2⁻²⁴ of the sum of its terms' magnitudes: a score over d = 128
// products (Σ|q·k| ≈ d/4 = 32, times 1/√d) by 128·6e-8·2.8 ≈ 2e-5 at worst, which moves a probability by as much
// relative (and lse by as much absolute), and out = Σ P v over up to 130 keys adds 130·6e-8 ≈ 1e-5 for Σ P = 1, |v| ≤
// 1: out and lse are checked within 5e-5 (plus 1e-5 relative for lse, which is up to ~6); the worst case lines every
// rounding up, the real differences are ~1e-6, and a wrong mask, scale or tile moves outputs by O(0.1). Each gradient
// sums a chain of up to T + 2d ≈ 390 roundings on each side over terms whose magnitudes add up to a few times the
// largest gradient (their signs are random): 1e-4 of the largest gradient, plus 1e-5 for the ones near 0.
// tf32: each operand of the four products is rounded to TF32's 10 explicit mantissa bits (u = 2⁻¹¹, nearest), the
// CPU's stay f32. A score's products are then off by 2u each, u√d/2 in all for Σ|q·k|/√d ≈ √d/4 (2.8e-3 at d = 128);
// lse moves by as much (checked as u√d), a probability by twice that relative, and rounding P and v adds 2u:
// out is checked within u(√d + 4) (7.5e-3 at d = 128). The backward's terms carry the same relative errors (dP = dout·v
// rounds like a score, dS and q, k, dout round once more), over sums a few times the largest gradient:
// 4u(√d + 4) of the largest gradient (3e-2 at d = 128). The tf32 output must also differ from the fp32 one by more than
// fp32's tolerance: the tensor cores ran.
#include "cuda_attention_cases.h"
#include "cuda_helpers.h"
#include "ops/attention.h"
#include "ops/cuda/attention_tiled.h"
#include "ops/precision.h"
#include "ops/stream.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

using namespace gt;
using namespace gt::test;
using namespace gt::test::attention_cases;

namespace {

constexpr const char* kEnv = "GPUTRAIN_TILED_ATTENTION";
constexpr double kTf32 = 0x1p-11;  // TF32's unit roundoff

double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return m;
}

// The device's forward (with lse) and its backward from given out and lse, each output inside sentinels.
struct DeviceRun {
  Tensor out, lse, dqkv;
};
DeviceRun device_forward(const Tensor& qkv, int64_t heads) {
  const Shape out_shape{qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3};
  Guarded out(out_shape), lse(Shape{qkv.dim(0), heads, qkv.dim(1)});
  ops::attention_forward(to_cuda(qkv), heads, {}, out.inner, lse.inner);
  return {out.host_checked(), lse.host_checked(), Tensor()};
}
Tensor device_backward(const Tensor& qkv, const Tensor& dout, int64_t heads, const Tensor& out, const Tensor& lse) {
  Guarded dqkv(qkv.shape());
  Tensor delta = Tensor::empty(lse.shape(), DType::f32, Device::cuda(0));
  ops::attention_backward(to_cuda(qkv), to_cuda(out), to_cuda(lse), to_cuda(dout), heads, {}, delta, dqkv.inner);
  return dqkv.host_checked();
}
// The forward, and the backward from the CPU's out and lse.
DeviceRun device_run(const Case& k) {
  DeviceRun r = device_forward(k.qkv, k.heads);
  r.dqkv = device_backward(k.qkv, k.dout, k.heads, k.out, k.lse);
  return r;
}

// The written tolerances above: out, lse and the gradients (relative to the largest) for heads of d.
struct Tolerance {
  double out, lse, grad;
};
Tolerance tolerance(Precision p, int64_t d) {
  const double rd = std::sqrt(static_cast<double>(d));
  if (p == Precision::tf32) return {kTf32 * (rd + 4), kTf32 * rd, 4 * kTf32 * (rd + 4)};
  return {5e-5, 5e-5, 1e-4};
}

}  // namespace

TEST_CASE("the tiled attention names why it declines a call before a device is asked", "[cpu]") {
  const ScopedEnvVar unset(kEnv, nullptr);
  auto refusal = [](DType type, int64_t heads, int64_t d, double p) {
    const Tensor qkv = Tensor::empty(Shape{2, 9, 3 * heads * d}, type);
    return cuda::tiled_attention_refusal(qkv, heads, {p, 3, 0}).value_or("(none)");
  };
  for (const int64_t d : {64, 96, 128}) CHECK(refusal(DType::f32, 3, d, 0) == "(none)");
  CHECK_THAT(refusal(DType::f32, 2, 32, 0), Catch::Contains("head size 32"));
  CHECK_THAT(refusal(DType::f32, 2, 72, 0), Catch::Contains("head size 72"));
  CHECK_THAT(refusal(DType::f32, 1, 256, 0), Catch::Contains("head size 256"));
  CHECK_THAT(refusal(DType::f64, 2, 64, 0), Catch::Contains("f64"));
  CHECK_THAT(refusal(DType::f32, 2, 64, 0.1), Catch::Contains("dropout 0.1"));
  {
    const ProductPrecisionScope tf32(Precision::tf32);
    CHECK(refusal(DType::f32, 2, 64, 0) == "(none)");
  }
  for (const Precision p : {Precision::bf16, Precision::fp16}) {
    const ProductPrecisionScope half(p);
    CHECK_THAT(refusal(DType::f32, 2, 64, 0), Catch::Contains("product precision " + to_string(p)));
  }
  {
    const ScopedEnvVar off(kEnv, "0");
    CHECK_THAT(refusal(DType::f32, 2, 64, 0), Catch::Contains("GPUTRAIN_TILED_ATTENTION=0"));
  }
  const ScopedEnvVar bad(kEnv, "yes");
  REQUIRE_THROWS_WITH(refusal(DType::f32, 2, 64, 0),
                      Catch::Contains("GPUTRAIN_TILED_ATTENTION=yes: expected auto or 0"));
}

TEST_CASE("tiled CUDA attention matches the CPU's f32 attention forward, in evaluation and backward", "[cuda]") {
  require_gpu();
  const ScopedEnvVar unset(kEnv, nullptr);
  const int64_t d = GENERATE(64, 96, 128);
  const int64_t t = GENERATE(77, 130);
  const int64_t heads = d == 128 ? 2 : 3;
  const Case k = cpu_case(2, t, heads, d, 200 + static_cast<uint64_t>(d + t));
  Tensor fp32_out;
  for (const Precision p : {Precision::fp32, Precision::tf32}) {
    INFO(to_string(p) << ", head size " << d << ", T " << t);
    const ProductPrecisionScope scope(p);
    const Tolerance tol = tolerance(p, d);
    const cuda::TiledAttentionRuns before = cuda::tiled_attention_runs();
    const DeviceRun got = device_run(k);
    REQUIRE(cuda::tiled_attention_runs().forward == before.forward + 1);
    REQUIRE(cuda::tiled_attention_runs().backward == before.backward + 1);
    check_close(got.out, k.out, tol.out, 0);
    check_close(got.lse, k.lse, tol.lse, 1e-5);
    check_close(got.dqkv, k.dqkv, tol.grad * max_abs(k.dqkv) + 1e-5, 0);
    if (p == Precision::fp32)
      fp32_out = got.out;
    else
      CHECK(max_diff(got.out, fp32_out) > tolerance(Precision::fp32, d).out);  // TF32 rounded the operands

    Guarded out(k.out.shape());  // evaluation: no lse
    Tensor no_lse;
    ops::attention_forward(to_cuda(k.qkv), k.heads, {}, out.inner, no_lse);
    CHECK(same_bits(out.host_checked(), got.out));
  }
}

TEST_CASE("tiled CUDA attention gives the same bits on a second run", "[cuda]") {
  require_gpu();
  const ScopedEnvVar unset(kEnv, nullptr);
  // T = 333: several tiles of queries and of keys, so each dq sums the parts of several key tiles and each dk, dv of
  // several query tiles.
  const int64_t d = GENERATE(64, 128);
  const Case k = cpu_case(2, 333, 3, d, 220);
  for (const Precision p : {Precision::fp32, Precision::tf32}) {
    INFO(to_string(p) << ", head size " << d);
    const ProductPrecisionScope scope(p);
    const DeviceRun first = device_run(k);
    const DeviceRun second = device_run(k);
    CHECK(same_bits(first.out, second.out));
    CHECK(same_bits(first.lse, second.lse));
    CHECK(same_bits(first.dqkv, second.dqkv));
  }
}

// Changing the key and value of position p changes no output, lse or dq of an earlier query (bit for bit: a masked
// pair adds an exact 0), and does change the outputs at p. p sits inside a query tile and inside a key tile, and at a
// tile's first row, so a mask one position off or a key tile read past the block's last row shows.
TEST_CASE("tiled CUDA attention: a future key changes no earlier row", "[cuda]") {
  require_gpu();
  const ScopedEnvVar unset(kEnv, nullptr);
  const int64_t nb = 2, t = 130, heads = 2, d = GENERATE(64, 128), c = heads * d;
  const Tensor qkv = seeded(Shape{nb, t, 3 * c}, 230, -1, 1), dout = seeded(Shape{nb, t, c}, 231, -1, 1);
  for (const Precision p : {Precision::fp32, Precision::tf32}) {
    const ProductPrecisionScope scope(p);
    for (const int64_t pos : {int64_t{40}, int64_t{64}, int64_t{97}}) {
      INFO(to_string(p) << ", head size " << d << ", position " << pos);
      Tensor changed = Tensor::empty(qkv.shape(), DType::f32);
      changed.copy_from(qkv);
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t e = c; e < 3 * c; ++e) changed.data<float>()[(b * t + pos) * 3 * c + e] *= -0.5f;
      // Each run's backward from its own forward: the rows before pos have the same out and lse on both.
      DeviceRun a = device_forward(qkv, heads), b = device_forward(changed, heads);
      a.dqkv = device_backward(qkv, dout, heads, a.out, a.lse);
      b.dqkv = device_backward(changed, dout, heads, b.out, b.lse);
      for (int64_t s = 0; s < nb; ++s) {
        CHECK(std::memcmp(a.out.data<float>() + s * t * c, b.out.data<float>() + s * t * c,
                          static_cast<size_t>(pos * c) * 4) == 0);
        for (int64_t h = 0; h < heads; ++h)
          CHECK(std::memcmp(a.lse.data<float>() + (s * heads + h) * t, b.lse.data<float>() + (s * heads + h) * t,
                            static_cast<size_t>(pos) * 4) == 0);
        for (int64_t i = 0; i < pos; ++i)  // dq of the rows before pos
          CHECK(std::memcmp(a.dqkv.data<float>() + (s * t + i) * 3 * c, b.dqkv.data<float>() + (s * t + i) * 3 * c,
                            static_cast<size_t>(c) * 4) == 0);
        const float* oa = a.out.data<float>() + (s * t + pos) * c;
        const float* ob = b.out.data<float>() + (s * t + pos) * c;
        CHECK(std::memcmp(oa, ob, static_cast<size_t>(c) * 4) != 0);
      }
    }
  }
}

// GPUTRAIN_TILED_ATTENTION=0 sends the call to the warp kernels (double sums): they too match the CPU, within the
// fp32 test's tolerance of test_cuda_ops.cpp, and the tiled kernels' counters stay put.
TEST_CASE("GPUTRAIN_TILED_ATTENTION=0 gives the warp kernels' attention", "[cuda]") {
  require_gpu();
  const ScopedEnvVar off(kEnv, "0");
  const Case k = cpu_case(2, 77, 3, 64, 240);
  const cuda::TiledAttentionRuns before = cuda::tiled_attention_runs();
  const DeviceRun got = device_run(k);
  CHECK(cuda::tiled_attention_runs().forward == before.forward);
  CHECK(cuda::tiled_attention_runs().backward == before.backward);
  check_close(got.out, k.out, 1e-6, 2.5e-7);
  check_close(got.dqkv, k.dqkv, 1e-5, 1e-5);
}

// The rate at GPT-2 small's attention (attention_cases::Gpt2Rate) in fp32 and tf32, against the warp kernels
// (GPUTRAIN_TILED_ATTENTION=0) once each. The `rate:` line gives the ratio (the aim: 10× the warp kernels).
TEST_CASE("tiled CUDA attention at GPT-2's shape is faster than the warp kernels (rate: TFLOP/s)", "[cuda]") {
  require_gpu();
  attention_cases::Gpt2Rate g(250);
  const int64_t nb = g.nb, t = g.t, heads = g.heads, d = g.d;
  const double fwd_flop = g.fwd_flop, bwd_flop = g.bwd_flop;
  double warp_fwd = 0, warp_bwd = 0;
  {
    const ScopedEnvVar off(kEnv, "0");
    warp_fwd = g.time_ms(1, true, false);
    warp_bwd = g.time_ms(1, true, true);
  }
  const ScopedEnvVar unset(kEnv, nullptr);
  for (const Precision p : {Precision::fp32, Precision::tf32}) {
    const ProductPrecisionScope scope(p);
    const double fwd = g.time_ms(10, true, false), bwd = g.time_ms(5, true, true);
    std::printf(
        "rate: %s attention B %lld T %lld heads %lld d %lld: tiled forward %.3f ms (%.1f TFLOP/s), backward %.3f ms "
        "(%.1f TFLOP/s); warp kernels forward %.1f ms (%.2f TFLOP/s), backward %.1f ms (%.2f TFLOP/s); tiled/warp "
        "%.1fx forward, %.1fx backward\n",
        to_string(p).c_str(), static_cast<long long>(nb), static_cast<long long>(t), static_cast<long long>(heads),
        static_cast<long long>(d), fwd, fwd_flop / fwd * 1e-9, bwd, bwd_flop / bwd * 1e-9, warp_fwd,
        fwd_flop / warp_fwd * 1e-9, warp_bwd, bwd_flop / warp_bwd * 1e-9, warp_fwd / fwd, warp_bwd / bwd);
    std::fflush(stdout);
    CHECK(fwd < warp_fwd);
    CHECK(bwd < warp_bwd);
  }
}
