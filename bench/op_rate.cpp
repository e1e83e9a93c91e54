// CPU time of the GPT step's non-GEMM ops at configs/gpt_bytes.yaml's shapes (B 16, T 64, C 128, 4 heads, MLP 512):
// the median over repetitions of each op's process CPU time, so a kernel change can be compared on a busy machine
// (CPU time, unlike wall time, barely moves when other processes compete). Prints one JSON line, microseconds.
// Usage: bench_op_rate [THREADS] [REPS]
#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/layernorm.h"
#include "ops/optim.h"
#include "ops/precision.h"

#include "seeded.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

namespace {

using gt::bench::seeded_f32;

double cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

template <class F>
double median_us(int reps, F&& f) {
  f();  // warm-up: page faults and scratch buffers
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_us();
    f();
    t.push_back(cpu_us() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The medians of f's and g's CPU times, each repetition running one then the other (so drift hits both alike).
template <class F, class G>
std::pair<double, double> median_pair_us(int reps, F&& f, G&& g) {
  f();
  g();
  std::vector<double> tf, tg;
  for (int r = 0; r < reps; ++r) {
    double t0 = cpu_us();
    f();
    tf.push_back(cpu_us() - t0);
    t0 = cpu_us();
    g();
    tg.push_back(cpu_us() - t0);
  }
  std::sort(tf.begin(), tf.end());
  std::sort(tg.begin(), tg.end());
  return {tf[tf.size() / 2], tg[tg.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  using gt::Shape;
  gt::set_num_threads(argc > 1 ? std::atoi(argv[1]) : 1);
  const int reps = argc > 2 ? std::atoi(argv[2]) : 200;
  const int64_t b = 16, t = 64, c = 128, heads = 4, rows = b * t, hidden = 512;

  gt::Tensor x = seeded_f32(Shape{rows, c}, 1), gamma = seeded_f32(Shape{c}, 2), beta = seeded_f32(Shape{c}, 3);
  gt::Tensor y = gt::Tensor::empty(Shape{rows, c}, gt::DType::f32), dy = seeded_f32(Shape{rows, c}, 4);
  gt::Tensor mean = gt::Tensor::empty(Shape{rows}, gt::DType::f32),
             inv = gt::Tensor::empty(Shape{rows}, gt::DType::f32);
  gt::Tensor dx = gt::Tensor::empty(Shape{rows, c}, gt::DType::f32);
  gt::Tensor dg = gt::Tensor::empty(Shape{c}, gt::DType::f32), db = gt::Tensor::empty(Shape{c}, gt::DType::f32);

  gt::Tensor qkv = seeded_f32(Shape{b, t, 3 * c}, 5), out = gt::Tensor::empty(Shape{b, t, c}, gt::DType::f32);
  gt::Tensor lse = gt::Tensor::empty(Shape{b, heads, t}, gt::DType::f32), dout = seeded_f32(Shape{b, t, c}, 6);
  gt::Tensor delta = gt::Tensor::empty(Shape{b, heads, t}, gt::DType::f32);
  gt::Tensor dqkv = gt::Tensor::empty(Shape{b, t, 3 * c}, gt::DType::f32);

  gt::Tensor h = seeded_f32(Shape{rows, hidden}, 7), hy = gt::Tensor::empty(Shape{rows, hidden}, gt::DType::f32);
  gt::Tensor hdy = seeded_f32(Shape{rows, hidden}, 8), hdx = gt::Tensor::empty(Shape{rows, hidden}, gt::DType::f32);

  // configs/gpt_bytes.yaml's parameters (wte, wpe, 4 blocks, ln_f) as one AdamW group, gradients clipped.
  gt::ops::TensorGroup group;
  std::vector<gt::Shape> shapes = {Shape{256, c}, Shape{t, c}};
  for (int l = 0; l < 4; ++l)
    for (const gt::Shape& s : {Shape{c}, Shape{c}, Shape{3 * c, c}, Shape{3 * c}, Shape{c, c}, Shape{c}, Shape{c},
                               Shape{c}, Shape{hidden, c}, Shape{hidden}, Shape{c, hidden}, Shape{c}})
      shapes.push_back(s);
  shapes.push_back(Shape{c});
  shapes.push_back(Shape{c});
  uint32_t seed = 100;
  for (const gt::Shape& s : shapes)
    group.rows.push_back({seeded_f32(s, seed++), seeded_f32(s, seed++), gt::Tensor::zeros(s, gt::DType::f32),
                          gt::Tensor::zeros(s, gt::DType::f32), gt::Tensor()});
  gt::Tensor stats = gt::Tensor::zeros(Shape{gt::kStepStats}, gt::DType::f64), per_row;
  const gt::AdamHyper adam{1e-3, 0.9, 0.99, 1e-8, 0.1, 0.1, 0.1, true};
  const double norm = median_us(reps, [&] {
    stats.data<double>()[gt::kGradSq] = 0;
    gt::ops::sum_squares_group(group, 1, stats, per_row);
  });
  const double step = median_us(reps, [&] { gt::ops::adam_step_group(adam, false, group, stats, 1e-3); });

  const double ln_f = median_us(reps, [&] { gt::ops::layernorm_forward(x, gamma, beta, 1e-5, mean, inv, y); });
  const double ln_b = median_us(reps, [&] { gt::ops::layernorm_backward(x, gamma, mean, inv, dy, dx, dg, db, 1.0); });
  // The f32 attention with the CPU's register blocks (AVX-512's where it runs them) and, interleaved, with AVX2's
  // (gt::cpu::force_attention_narrow; the same on a CPU without AVX-512).
  auto narrow = [](auto&& f) {
    return [f] {
      gt::cpu::force_attention_narrow(true);
      f();
      gt::cpu::force_attention_narrow(false);
    };
  };
  auto fwd = [&] { gt::ops::attention_forward(qkv, heads, {}, out, lse); };
  auto bwd = [&] { gt::ops::attention_backward(qkv, out, lse, dout, heads, {}, delta, dqkv); };
  const auto [at_f, at_f_narrow] = median_pair_us(reps, fwd, narrow(fwd));
  const auto [at_b, at_b_narrow] = median_pair_us(reps, bwd, narrow(bwd));
  double at_f16 = 0, at_b16 = 0;  // under train.precision bf16 (the kernel rounds its operands)
  {
    gt::ProductPrecisionScope bf16(gt::Precision::bf16);
    at_f16 = median_us(reps, [&] { gt::ops::attention_forward(qkv, heads, {}, out, lse); });
    at_b16 = median_us(reps, [&] { gt::ops::attention_backward(qkv, out, lse, dout, heads, {}, delta, dqkv); });
  }
  const double ge_f = median_us(reps, [&] { gt::ops::activation_forward(gt::Activation::gelu_tanh, h, hy); });
  const double ge_b =
      median_us(reps, [&] { gt::ops::activation_backward(gt::Activation::gelu_tanh, h, hy, hdy, hdx); });
  std::printf(
      "{\"threads\": %d, \"layernorm_fwd_us\": %.1f, \"layernorm_bwd_us\": %.1f, \"attention_fwd_us\": %.1f, "
      "\"attention_bwd_us\": %.1f, \"attention_avx2_blocks_fwd_us\": %.1f, \"attention_avx2_blocks_bwd_us\": %.1f, "
      "\"attention_bf16_fwd_us\": %.1f, \"attention_bf16_bwd_us\": %.1f, "
      "\"gelu_fwd_us\": %.1f, \"gelu_bwd_us\": %.1f, \"grad_norm_us\": %.1f, "
      "\"adamw_clipped_us\": %.1f}\n",
      gt::num_threads(), ln_f, ln_b, at_f, at_b, at_f_narrow, at_b_narrow, at_f16, at_b16, ge_f, ge_b, norm, step);
  return 0;
}
