// cuDNN's fused flash attention (ops/cuda/attention_cudnn.cpp) against the CPU's half attention (ops/cpu/attention.cpp
// under the same bf16/fp16 ProductPrecisionScope): causal, heads of 32, 64 and 128, T = 77 (no multiple of cuDNN's
// 64- and 128-row tiles), forward out and lse, the evaluation forward, the backward's dqkv; the same bits on a second
// run; GPUTRAIN_CUDNN_ATTENTION=0 giving the CUDA kernels' results and =1 refusing loudly; the rate at GPT-2's shape.
// Without a usable GPU every [cuda] case exits with ctest's skip code (77) after printing why.
//
// Tolerances, with u the unit roundoff of the format (2⁻⁸ bf16, 2⁻¹¹ fp16: the largest relative error of a rounding to
// nearest; bf16 keeps 8 significant bits, fp16 11) and inputs in [−1, 1]. Both sides round q, k, v and dout to the
// format the same way (nearest even) and sum the products wider than the format, so their scores agree to f32's
// rounding (~1e-6 for sums of 128 terms). Forward: out_i = Σ_j P_ij v_j with each probability rounded to the format
// before it multiplies v (the CPU rounds P_ij, cuDNN exp(s − running max) before its rescaling): at most u of each
// term, so at most u·max|v| on each side as Σ_j P_ij = 1; cuDNN then writes out in the format (u·|out| more). That is
// 3u·max|v| in all, checked as 4u (bf16 1.6e-2, the ~2e-2 one expects of 8 bits; fp16 2e-3): a wrong scale, a mask one
// position off or a missing normalisation moves outputs by O(0.1). lse: the same scores, log Σ exp summed in f32; if
// cuDNN sums the rounded exponentials, the sum is off by at most u relative and its log by at most u: checked as 2u
// absolute (a base-2 lse would be 44 % off, a missing 1/√d far more). Backward: each gradient sums rounded P·dout or
// dS·k, dS·q terms on both sides, which round the same values unless their f32 differences carry one across a
// rounding boundary (2u of that term); cuDNN forms delta from the 16-bit out and dout (the CPU from f32 ones: u of each
// factor) and writes the gradients in the format (u of each). That is about 5u of the largest gradient for these sums
// (a few hundred terms of random sign), checked as 8u·max|dqkv| + 1e-5 (bf16: 3e-2 of the largest).
#include "cuda_attention_cases.h"
#include "cuda_helpers.h"
#include "ops/attention.h"
#include "ops/cuda/attention_cudnn.h"
#include "ops/cuda/dnn_common.h"
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

constexpr const char* kEnv = "GPUTRAIN_CUDNN_ATTENTION";

double unit_roundoff(Precision p) { return p == Precision::bf16 ? 0x1p-8 : 0x1p-11; }

// The device's forward (with lse) and its backward from the CPU's out and lse, each output inside sentinels.
struct DeviceRun {
  Tensor out, lse, dqkv;
};
DeviceRun device_run(const Case& k) {
  Guarded out(k.out.shape()), lse(k.lse.shape()), dqkv(k.qkv.shape());
  const Tensor qkv = to_cuda(k.qkv);
  ops::attention_forward(qkv, k.heads, {}, out.inner, lse.inner);
  Tensor delta = Tensor::empty(k.lse.shape(), DType::f32, Device::cuda(0));
  ops::attention_backward(qkv, to_cuda(k.out), to_cuda(k.lse), to_cuda(k.dout), k.heads, {}, delta, dqkv.inner);
  return {out.host_checked(), lse.host_checked(), dqkv.host_checked()};
}

}  // namespace

TEST_CASE("cuDNN attention names why it declines a call before a device is asked", "[cpu]") {
  const ScopedEnvVar unset(kEnv, nullptr);
  const ops::AttentionDropout none{}, dropout{0.1, 7, 0};
  auto refusal = [](int64_t d, const ops::AttentionDropout& drop) {
    return cuda::cudnn_attention_refusal(d, drop).value_or("(none)");
  };
  CHECK_THAT(refusal(64, none), Catch::Contains("product precision fp32"));
  const ProductPrecisionScope bf16(Precision::bf16);
  if (!cuda::cudnn_attention_built()) {
    CHECK_THAT(refusal(64, none), Catch::Contains("scripts/setup.sh"));
    return;
  }
  for (const int64_t d : {8, 32, 64, 128}) CHECK_FALSE(cuda::cudnn_attention_refusal(d, none));
  CHECK_THAT(refusal(20, none), Catch::Contains("head size 20"));
  CHECK_THAT(refusal(136, none), Catch::Contains("head size 136"));
  CHECK_THAT(refusal(64, dropout), Catch::Contains("dropout 0.1"));
  {
    const ScopedEnvVar off(kEnv, "0");
    CHECK_THAT(refusal(64, none), Catch::Contains("GPUTRAIN_CUDNN_ATTENTION=0"));
  }
  const ScopedEnvVar bad(kEnv, "yes");
  REQUIRE_THROWS_WITH(refusal(64, none), Catch::Contains("GPUTRAIN_CUDNN_ATTENTION=yes: expected auto, 0 or 1"));
}

// The frontend's own checks of the graphs, without a device: what each SM generation's support rules say of the packed
// strides, the 16-bit types, the causal band and the deterministic backward. The shapes of the [cuda] cases below
// pass on A100 (80), H100/H200 (90) and B200 (100); a head size the rules exclude fails with the frontend's reason.
TEST_CASE("cuDNN attention graphs pass the frontend's checks for SM 80, 90 and 100 without a device", "[cpu]") {
  using Kind = cuda::CudnnAttentionKind;
  if (!cuda::cudnn_attention_built()) {
    CHECK_THAT(cuda::cudnn_attention_check_graph(2, 77, 3, 64, HalfFormat::bf16, Kind::forward_train, 90).value(),
               Catch::Contains("no cuDNN frontend"));
    return;
  }
  for (const int sm : {80, 90, 100})
    for (const Kind kind : {Kind::forward_train, Kind::forward_eval, Kind::backward})
      for (const HalfFormat f : {HalfFormat::bf16, HalfFormat::fp16})
        for (const int64_t d : {32, 64, 128}) {
          INFO("sm " << sm << " kind " << static_cast<int>(kind) << " bf16 " << (f == HalfFormat::bf16) << " d " << d);
          const std::optional<std::string> why = cuda::cudnn_attention_check_graph(2, 77, 3, d, f, kind, sm);
          CHECK(why.value_or("passes") == "passes");
        }
  for (const Kind kind : {Kind::forward_train, Kind::backward})
    CHECK_THAT(cuda::cudnn_attention_check_graph(2, 77, 3, 20, HalfFormat::bf16, kind, 90).value_or("passes"),
               Catch::Contains("multiple of 8"));
}

TEST_CASE("cuDNN flash attention matches the CPU's half attention forward, in evaluation and backward", "[cuda]") {
  require_gpu();
  const ScopedEnvVar required(kEnv, "1");  // a call cuDNN declines fails here, saying why
  const int64_t d = GENERATE(32, 64, 128);
  for (const Precision p : {Precision::bf16, Precision::fp16}) {
    INFO(to_string(p) << ", head size " << d);
    const double u = unit_roundoff(p);
    const ProductPrecisionScope autocast(p);
    const Case k = cpu_case(2, 77, 3, d, 130 + static_cast<uint64_t>(d));
    const cuda::CudnnAttentionRuns before = cuda::cudnn_attention_runs();
    const DeviceRun got = device_run(k);
    REQUIRE(cuda::cudnn_attention_runs().forward == before.forward + 1);
    REQUIRE(cuda::cudnn_attention_runs().backward == before.backward + 1);
    check_close(got.out, k.out, 4 * u, 0);
    check_close(got.lse, k.lse, 2 * u, 0);
    check_close(got.dqkv, k.dqkv, 8 * u * max_abs(k.dqkv) + 1e-5, 0);

    Guarded out(k.out.shape());  // evaluation: no lse, its own graph
    Tensor no_lse;
    ops::attention_forward(to_cuda(k.qkv), k.heads, {}, out.inner, no_lse);
    check_close(out.host_checked(), k.out, 4 * u, 0);
  }
}

TEST_CASE("cuDNN flash attention gives the same bits on a second run, from the graphs of the first", "[cuda]") {
  require_gpu();
  const ScopedEnvVar required(kEnv, "1");
  const ProductPrecisionScope autocast(Precision::bf16);
  // T = 333: several 64- and 128-row tiles of queries and of keys, so each dq sums the parts of several key tiles,
  // which a non-deterministic backward adds with atomics in the order they finish.
  const Case k = cpu_case(2, 333, 4, 64, 150);
  const DeviceRun first = device_run(k);
  const int64_t graphs = cuda::dnn_plan_counts().attention;
  const DeviceRun second = device_run(k);
  CHECK(cuda::dnn_plan_counts().attention == graphs);
  CHECK(same_bits(first.out, second.out));
  CHECK(same_bits(first.lse, second.lse));
  CHECK(same_bits(first.dqkv, second.dqkv));
}

// The CUDA kernels round where the CPU rounds and sum in double (test_cuda_ops.cpp's half attention test): within 2u
// of the CPU forward and 2u of the largest gradient backward, half of cuDNN's tolerances above. Their out is f32
// (cuDNN's is bf16 widened), so some element is no bf16 value: a second sign that cuDNN did not run.
TEST_CASE("GPUTRAIN_CUDNN_ATTENTION=0 gives the CUDA kernels' half attention", "[cuda]") {
  require_gpu();
  const ScopedEnvVar off(kEnv, "0");
  const ProductPrecisionScope autocast(Precision::bf16);
  const double u = unit_roundoff(Precision::bf16);
  const Case k = cpu_case(2, 77, 3, 64, 160);
  const cuda::CudnnAttentionRuns before = cuda::cudnn_attention_runs();
  const DeviceRun got = device_run(k);
  CHECK(cuda::cudnn_attention_runs().forward == before.forward);
  CHECK(cuda::cudnn_attention_runs().backward == before.backward);
  check_close(got.out, k.out, 2 * u, 0);
  check_close(got.lse, k.lse, 1e-4, 1e-4);
  check_close(got.dqkv, k.dqkv, 2 * u * max_abs(k.dqkv) + 1e-5, 1e-5);
  const float* o = got.out.data<float>();
  CHECK(std::any_of(o, o + got.out.numel(), [](float x) { return bf16_to_float(float_to_bf16(x)) != x; }));
}

TEST_CASE("GPUTRAIN_CUDNN_ATTENTION=1 makes a half call cuDNN cannot take an error that says why", "[cuda]") {
  require_gpu();
  const ScopedEnvVar required(kEnv, "1");
  const ProductPrecisionScope autocast(Precision::bf16);
  auto forward = [](int64_t heads, int64_t d, const ops::AttentionDropout& drop) {
    const Tensor qkv = to_cuda(seeded(Shape{1, 9, 3 * heads * d}, 170, -1, 1));
    Tensor out = Tensor::empty(Shape{1, 9, heads * d}, DType::f32, Device::cuda(0));
    Tensor lse = Tensor::empty(Shape{1, heads, 9}, DType::f32, Device::cuda(0));
    ops::attention_forward(qkv, heads, drop, out, lse);
  };
  REQUIRE_THROWS_WITH(forward(2, 20, {}), Catch::Contains("head size 20"));
  REQUIRE_THROWS_WITH(forward(1, 64, {0.1, 5, 0}), Catch::Contains("dropout 0.1"));
  const ProductPrecisionScope fp32(Precision::fp32);  // not cuDNN's call: the CUDA kernels run it
  REQUIRE_NOTHROW(forward(2, 20, {}));
}

// The rate at GPT-2 small's attention (attention_cases::Gpt2Rate) in bf16, each call as training makes it (the
// f32 → bf16 roundings and the widening back included), against the CUDA kernels once each. scripts/gpu_check.sh
// prints the `rate:` line.
TEST_CASE("cuDNN flash attention at GPT-2's shape is faster than the CUDA kernels (rate: TFLOP/s)", "[cuda]") {
  require_gpu();
  const ProductPrecisionScope autocast(Precision::bf16);
  attention_cases::Gpt2Rate g(180);
  const int64_t nb = g.nb, t = g.t, heads = g.heads, d = g.d;
  const double fwd_flop = g.fwd_flop, bwd_flop = g.bwd_flop;
  double cudnn_fwd = 0, cudnn_bwd = 0, own_fwd = 0, own_bwd = 0;
  {
    const ScopedEnvVar required(kEnv, "1");
    cudnn_fwd = g.time_ms(20, true, false);
    cudnn_bwd = g.time_ms(10, true, true);
  }
  {
    const ScopedEnvVar off(kEnv, "0");
    own_fwd = g.time_ms(1, false, false);
    own_bwd = g.time_ms(1, false, true);
  }
  std::printf(
      "rate: bf16 attention B %lld T %lld heads %lld d %lld: cuDNN forward %.3f ms (%.1f TFLOP/s), backward %.3f ms "
      "(%.1f TFLOP/s); CUDA kernels forward %.1f ms, backward %.1f ms\n",
      static_cast<long long>(nb), static_cast<long long>(t), static_cast<long long>(heads), static_cast<long long>(d),
      cudnn_fwd, fwd_flop / cudnn_fwd * 1e-9, cudnn_bwd, bwd_flop / cudnn_bwd * 1e-9, own_fwd, own_bwd);
  std::fflush(stdout);
  CHECK(cudnn_fwd < own_fwd);
  CHECK(cudnn_bwd < own_bwd);
}
