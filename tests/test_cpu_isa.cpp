// The CPU kernels' hot loops compiled per instruction set (GT_CPU_KERNEL, ops/cpu/isa.h): every path this CPU runs
// below its widest gives the widest path's results, through the public ops, for every kernel family that has such
// loops — AVX2 bit for bit with AVX-512 (both contract a·b + c into FMAs the same way, and every sum has the same
// explicit partial sums on every path), the baseline (no FMA) within a stated tolerance. The widest path's accuracy is
// the other tests' business (the f32-against-f64 and gradient tests); this one shows that what they check holds on
// the paths a narrower CPU takes.
#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "helpers.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/batchnorm.h"
#include "ops/conv2d.h"
#include "ops/cpu/isa.h"
#include "ops/elementwise.h"
#include "ops/layernorm.h"
#include "ops/loss.h"
#include "ops/math.h"
#include "ops/matmul.h"
#include "ops/optim.h"
#include "ops/pool2d.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

Tensor isa_seeded(const Shape& shape, uint64_t seed, double lo = -2, double hi = 2) {
  Tensor t = Tensor::empty(shape, DType::f32);
  Rng rng(seed, 0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng.uniform(lo, hi));
  return t;
}

std::vector<float> values_of(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

using Outputs = std::vector<std::pair<std::string, std::vector<float>>>;

// Every op whose CPU kernel has GT_CPU_KERNEL loops, on seeded f32 inputs with ragged sizes (vector tails), each
// output named.
Outputs run_every_kernel() {
  Outputs out;
  auto keep = [&](const std::string& name, const Tensor& t) { out.emplace_back(name, values_of(t)); };
  {  // elementwise: add_span_f32
    const Tensor a = isa_seeded(Shape{1003}, 1), b = isa_seeded(Shape{1003}, 2);
    Tensor y = Tensor::empty(a.shape(), DType::f32);
    ops::add(a, b, y);
    keep("add", y);
  }
  {  // activation: gelu_tanh_fwd_f32, gelu_tanh_bwd_f32 (x spans the tanh approximation's ranges)
    const Tensor x = isa_seeded(Shape{37, 29}, 3, -12, 12), dy = isa_seeded(Shape{37, 29}, 4);
    Tensor y = Tensor::empty(x.shape(), DType::f32), dx = Tensor::empty(x.shape(), DType::f32);
    ops::activation_forward(Activation::gelu_tanh, x, y);
    ops::activation_backward(Activation::gelu_tanh, x, y, dy, dx);
    keep("gelu forward", y);
    keep("gelu backward", dx);
  }
  {  // layernorm: ln_fwd_rows_f32, ln_dx_rows_f32, ln_param_cols_f32
    const int64_t rows = 41, d = 45;
    const Tensor x = isa_seeded(Shape{rows, d}, 5), g = isa_seeded(Shape{d}, 6, 0.5, 1.5), b = isa_seeded(Shape{d}, 7),
                 dy = isa_seeded(Shape{rows, d}, 8);
    Tensor y = Tensor::empty(x.shape(), DType::f32), m = Tensor::empty(Shape{rows}, DType::f32),
           s = Tensor::empty(Shape{rows}, DType::f32), dx = Tensor::empty(x.shape(), DType::f32),
           dg = Tensor::empty(Shape{d}, DType::f32), db = Tensor::empty(Shape{d}, DType::f32);
    ops::layernorm_forward(x, g, b, 1e-5, m, s, y);
    ops::layernorm_backward(x, g, m, s, dy, dx, dg, db, 0.0);
    keep("layernorm y", y);
    keep("layernorm mean", m);
    keep("layernorm invstd", s);
    keep("layernorm dx", dx);
    keep("layernorm dgamma", dg);
    keep("layernorm dbeta", db);
  }
  {  // matmul: column_sums_f32 (a linear layer's bias gradient)
    const Tensor dy = isa_seeded(Shape{67, 53}, 9);
    Tensor db = Tensor::empty(Shape{53}, DType::f32);
    ops::sum_rows(dy, db, 0.0);
    keep("bias gradient", db);
  }
  {  // conv2d: im2col_f32, col2im_f32, add_row_sums_f32
    const Window2d win{3, 3, 1, 1, 1, 1};
    const Tensor x = isa_seeded(Shape{2, 3, 9, 11}, 10), w = isa_seeded(Shape{5, 3, 3, 3}, 11),
                 b = isa_seeded(Shape{5}, 12), dy = isa_seeded(Shape{2, 5, 9, 11}, 13);
    Tensor y = Tensor::empty(dy.shape(), DType::f32), dx = Tensor::empty(x.shape(), DType::f32),
           dw = Tensor::empty(w.shape(), DType::f32), db = Tensor::empty(b.shape(), DType::f32);
    ops::conv2d_forward(x, w, b, win, 1, y);
    ops::conv2d_backward(x, w, dy, win, 1, dx, dw, db, 0.0);
    keep("conv y", y);
    keep("conv dx", dx);
    keep("conv dw", dw);
    keep("conv db", db);
  }
  {  // pool2d: pool2x2_fwd_rows_f32, pool2x2_bwd_rows_f32, max and average, odd extents
    const Window2d win{2, 2, 2, 2, 0, 0};
    const Tensor x = isa_seeded(Shape{2, 3, 13, 39}, 14), dy = isa_seeded(Shape{2, 3, 6, 19}, 15);
    for (const PoolKind kind : {PoolKind::max, PoolKind::avg}) {
      const std::string name = kind == PoolKind::max ? "max pool" : "average pool";
      Tensor y = Tensor::empty(dy.shape(), DType::f32), dx = Tensor::empty(x.shape(), DType::f32);
      ops::pool2d_forward(kind, x, win, y);
      ops::pool2d_backward(kind, x, dy, win, dx);
      keep(name + " y", y);
      keep(name + " dx", dx);
    }
  }
  {  // batchnorm: bn_shifted_sums_f32, bn_grad_sums_f32, bn_scale_rows_f32, bn_dx_rows_f32; training and evaluation
    const Tensor x = isa_seeded(Shape{6, 4, 7, 5}, 16, 1, 3), g = isa_seeded(Shape{4}, 17, 0.5, 1.5),
                 b = isa_seeded(Shape{4}, 18), dy = isa_seeded(Shape{6, 4, 7, 5}, 19);
    for (const bool training : {true, false}) {
      const std::string name = training ? "batchnorm (training)" : "batchnorm (evaluation)";
      Tensor rm = isa_seeded(Shape{4}, 20), rv = isa_seeded(Shape{4}, 21, 0.5, 2);
      Tensor y = Tensor::empty(x.shape(), DType::f32), sm = Tensor::empty(Shape{4}, DType::f32),
             si = Tensor::empty(Shape{4}, DType::f32), dx = Tensor::empty(x.shape(), DType::f32),
             dg = Tensor::empty(Shape{4}, DType::f32), db = Tensor::empty(Shape{4}, DType::f32);
      ops::batchnorm_forward(x, g, b, rm, rv, 0.1, 1e-5, training, sm, si, y);
      ops::batchnorm_backward(x, g, sm, si, dy, training, dx, dg, db, 0.0);
      keep(name + " y", y);
      keep(name + " running mean", rm);
      keep(name + " running var", rv);
      keep(name + " dx", dx);
      keep(name + " dgamma", dg);
      keep(name + " dbeta", db);
    }
  }
  {  // attention: attn_fwd_task_f32, attn_bwd_task_f32 (the Narrow blocks; AVX-512 runs Wide ones, tested below)
    const int64_t nb = 2, t = 70, heads = 2, c = heads * 24;
    const Tensor qkv = isa_seeded(Shape{nb, t, 3 * c}, 22), dout = isa_seeded(Shape{nb, t, c}, 23);
    Tensor o = Tensor::empty(Shape{nb, t, c}, DType::f32), lse = Tensor::empty(Shape{nb, heads, t}, DType::f32),
           delta = Tensor::empty(Shape{nb, heads, t}, DType::f32), dqkv = Tensor::empty(qkv.shape(), DType::f32);
    ops::attention_forward(qkv, heads, {}, o, lse);
    ops::attention_backward(qkv, o, lse, dout, heads, {}, delta, dqkv);
    keep("attention out", o);
    keep("attention lse", lse);
    keep("attention dqkv", dqkv);
  }
  {  // loss: ce_rows_f32, with label smoothing, an ignored row and a tie for the largest logit
    const int64_t rows = 9, k = 37;
    Tensor logits = isa_seeded(Shape{rows, k}, 28, -6, 6), labels = Tensor::empty(Shape{rows}, DType::i32);
    logits.data<float>()[3 * k + 4] = logits.data<float>()[3 * k + 30] = 9.0f;
    for (int64_t r = 0; r < rows; ++r) labels.data<int32_t>()[r] = static_cast<int32_t>((r * 7) % k);
    labels.data<int32_t>()[3] = 4;   // the first of two equal largest logits: a hit
    labels.data<int32_t>()[6] = -1;  // ignored
    for (const double eps : {0.0, 0.1}) {
      Tensor d = Tensor::empty(logits.shape(), DType::f32), stats = Tensor::zeros(Shape{2}, DType::f64);
      ops::cross_entropy(logits, labels, eps, 0.25, d, stats, {1, -1});
      keep("cross-entropy gradient", d);
      Tensor s32 = Tensor::empty(Shape{2}, DType::f32);
      s32.data<float>()[0] = static_cast<float>(stats.data<double>()[0]);
      s32.data<float>()[1] = static_cast<float>(stats.data<double>()[1]);
      keep("cross-entropy loss and hits", s32);
    }
  }
  {  // optim: adam_span_f32, Adam and AdamW, with and without clipping
    for (const bool decoupled : {false, true})
      for (const double max_norm : {0.0, 0.5}) {
        Tensor p = isa_seeded(Shape{1001}, 24), g = isa_seeded(Shape{1001}, 25), m = isa_seeded(Shape{1001}, 26),
               v = isa_seeded(Shape{1001}, 27, 0, 1), none;
        ops::TensorGroup group;
        group.rows.push_back({p, g, m, v, none});
        Tensor stats = Tensor::zeros(Shape{kStepStats}, DType::f64);
        stats.data<double>()[kGradSq] = 4.0;
        const AdamHyper h{1e-2, 0.9, 0.999, 1e-8, 0.1, 1 - 0.9 * 0.9, std::sqrt(1 - 0.999 * 0.999), decoupled};
        ops::adam_step_group(h, false, group, stats, max_norm);
        const std::string name = std::string(decoupled ? "adamw" : "adam") + (max_norm > 0 ? " clipped" : "");
        keep(name + " param", p);
        keep(name + " m", m);
        keep(name + " v", v);
      }
  }
  return out;
}

}  // namespace

TEST_CASE("cpu isa: every kernel path this CPU runs gives the widest path's results, and a forced path is the one run",
          "[cpu]") {
  set_num_threads(1);  // the kernels run on this thread, whose calls cpu_kernel_calls counts
  struct Reset {
    ~Reset() { set_num_threads(2); }
  } reset;
  const cpu::CpuIsa best = cpu::best_cpu_isa();
  INFO("this CPU's widest path: " << cpu::to_string(best));
  REQUIRE(cpu::cpu_isa() == best);
  const Outputs want = run_every_kernel();
  int compared = 0;
  for (const cpu::CpuIsa isa : {cpu::CpuIsa::avx512, cpu::CpuIsa::avx2, cpu::CpuIsa::baseline}) {
    if (static_cast<int>(isa) >= static_cast<int>(best)) {
      if (isa != best) {
        CHECK_FALSE(cpu::force_cpu_isa(isa));  // a path the CPU lacks is refused
        CHECK(cpu::cpu_isa() == best);
        WARN("skipped: the " << cpu::to_string(isa) << " kernel paths (this CPU lacks them)");
      }
      continue;
    }
    INFO("forced path: " << cpu::to_string(isa));
    const ForcedCpuIsa forced(isa);
    REQUIRE(forced.ok());
    CHECK(cpu::cpu_isa() == isa);
    const uint64_t before_forced = cpu::cpu_kernel_calls(isa), before_best = cpu::cpu_kernel_calls(best);
    const Outputs got = run_every_kernel();
    // Every family went through the forced path's loops, none through the widest's.
    CHECK(cpu::cpu_kernel_calls(isa) - before_forced >= 20);
    CHECK(cpu::cpu_kernel_calls(best) == before_best);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      INFO(want[i].first);
      const std::vector<float>&a = got[i].second, &b = want[i].second;
      REQUIRE(a.size() == b.size());
      if (isa != cpu::CpuIsa::baseline) {
        CHECK(bit_differences(a, b) == 0);
        continue;
      }
      // The baseline has no FMA: a·b + c rounds twice where the wider paths round once, an ulp (6e-8 relative) per
      // such step; the longest chains here (attention's exponentials and sums, GELU's tanh) stay below 1e-6 of the
      // output's largest magnitude, where a wrong, missing or misplaced term costs orders of magnitude more.
      double worst = 0, scale = 0;
      for (size_t j = 0; j < a.size(); ++j) {
        worst = std::max(worst, std::abs(static_cast<double>(a[j]) - b[j]));
        scale = std::max(scale, std::abs(static_cast<double>(b[j])));
      }
      INFO("worst difference " << worst << " of largest magnitude " << scale);
      CHECK(worst <= 1e-6 * scale);
    }
    ++compared;
  }
  REQUIRE(cpu::force_cpu_isa(std::nullopt));
  CHECK(cpu::cpu_isa() == best);
  if (compared == 0) WARN("skipped: this CPU runs only the baseline kernel paths");
}

TEST_CASE("cpu isa: forcing AVX2 or the baseline also takes attention off its AVX-512 register blocks", "[cpu]") {
  if (cpu::best_cpu_isa() != cpu::CpuIsa::avx512) {
    WARN("skipped: this CPU has no AVX-512 (attention's Wide blocks are never taken)");
    return;
  }
  set_num_threads(1);
  struct Reset {
    ~Reset() {
      cpu::force_attention_narrow(false);
      set_num_threads(2);
    }
  } reset;
  const int64_t nb = 1, t = 40, heads = 2, c = heads * 32;
  const Tensor qkv = isa_seeded(Shape{nb, t, 3 * c}, 40);
  auto forward = [&] {
    Tensor o = Tensor::empty(Shape{nb, t, c}, DType::f32), lse = Tensor::empty(Shape{nb, heads, t}, DType::f32);
    ops::attention_forward(qkv, heads, {}, o, lse);
    return values_of(o);
  };
  // The Wide blocks are not GT_CPU_KERNEL loops: nothing counted. The Narrow ones run on the forced AVX2 path, and on
  // the AVX-512 path when a test asks for them there.
  auto calls = [](cpu::CpuIsa isa) { return cpu::cpu_kernel_calls(isa); };
  uint64_t v4 = calls(cpu::CpuIsa::avx512), v3 = calls(cpu::CpuIsa::avx2);
  const std::vector<float> wide = forward();
  CHECK(calls(cpu::CpuIsa::avx512) == v4);
  std::vector<float> narrow;
  {
    const ForcedCpuIsa avx2(cpu::CpuIsa::avx2);
    REQUIRE(avx2.ok());
    narrow = forward();
  }
  CHECK(calls(cpu::CpuIsa::avx2) > v3);
  cpu::force_attention_narrow(true);
  v4 = calls(cpu::CpuIsa::avx512);
  const std::vector<float> narrow_v4 = forward();
  CHECK(calls(cpu::CpuIsa::avx512) > v4);
  // The Narrow blocks give the same bits on either path; the Wide ones differ from them only by adding zeros.
  CHECK(bit_differences(narrow, narrow_v4) == 0);
  double worst = 0;
  for (size_t i = 0; i < wide.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(wide[i] - narrow[i])));
  CHECK(worst < 1e-5);
}

// What the bit-for-bit agreement of the paths buys: a run on a CPU with only AVX2 (gputrain's own f32 kernels,
// GPUTRAIN_CPU_SGEMM=avx2, and the AVX2 loops) ends with the weights a run on an AVX-512 CPU ends with, byte for
// byte — checked here by running both paths on this machine: the GPT config (layer norm, attention, GELU, AdamW,
// clipping) and the speedrun's CNN (convolutions, batch norm, pooling, Nesterov SGD).
TEST_CASE("cpu isa: training on the AVX2 paths, or unfused, ends with the AVX-512 paths' weights, byte for byte",
          "[e2e]") {
  if (cpu::best_cpu_isa() != cpu::CpuIsa::avx512) {
    WARN("skipped: this CPU has no AVX-512 path to compare the AVX2 one with");
    return;
  }
  TempDir dir;
  REQUIRE(std::filesystem::is_directory("/usr/share/games/fortunes"));  // installed by scripts/setup.sh
  const auto tok =
      run_gputrain("tokenize /usr/share/games/fortunes/fortunes /usr/share/games/fortunes/literature --out " +
                   (dir / "data/fortunes"));
  INFO(tok.output);
  REQUIRE(tok.exit_code == 0);
  struct Case {
    std::string config, sets;
  };
  for (const Case& c : {Case{"configs/gpt_bytes.yaml", "--set train.eval_tokens=4096"},
                        Case{"configs/fashion_mnist_speedrun.yaml", "--set data.test=null"}}) {
    INFO(c.config);
    std::vector<std::string> weights;
    // The AVX-512 paths, the AVX2 ones, and (the CNN) the AVX-512 paths with every layer apart instead of the fused
    // chains of batch norm, pool and relu (graph/model.h's Model::chains), which promise the same bits too.
    for (const std::string run : {"avx512", "avx2", "avx512_unfused"}) {
      const bool unfused = run == "avx512_unfused";
      if (unfused && c.config.find("speedrun") == std::string::npos) continue;  // the GPT has no chain
      const std::string isa = unfused ? "avx512" : run;
      const std::string out = dir / (std::filesystem::path(c.config).stem().string() + "_" + run);
      const auto r = run_gputrain("train " + source_path(c.config) + " --device cpu --threads 2 --max-steps 25 " +
                                      c.sets + " --no-progress --out " + out,
                                  "cd " + dir.path() + " && GPUTRAIN_CPU_ISA=" + isa + " GPUTRAIN_CPU_SGEMM=" + isa +
                                      (unfused ? " GPUTRAIN_CPU_FUSE=off" : ""));
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      weights.push_back(read_text(out + "/model.safetensors"));
    }
    REQUIRE(weights[0].size() > 10000);
    for (size_t k = 1; k < weights.size(); ++k) {
      CAPTURE(k);
      CHECK(weights[0] == weights[k]);
    }
  }
}
