// The CPU convolution's algorithms (ops/cpu/conv_algo.h): Winograd's F(2×2, 3×3) against the definition written as
// loops in double, forward and all three gradients, over the shapes its tiling has edges for (odd sides, every padding
// from none to two, one-pixel and one-column images, groups of images with a partial last one, 1 and 2 threads),
// on every instruction-set path this CPU runs; and which algorithm auto picks. im2col's own check is test_ops.cpp's.
#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "helpers.h"
#include "ops/conv2d.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/sgemm.h"
#include "ops/math.h"
#include "ops/precision.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

struct WinoCase {
  int64_t batch, c, o, h, w, ph, pw;
};

Tensor wino_uniform(const Shape& s, Rng& rng) {
  Tensor t = Tensor::empty(s, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
  return t;
}

struct WinoPasses {
  std::vector<float> y, dx, dw, db;
};

// y = conv(x, w) + b; dx, dw and db from dy, with dw and db accumulated onto `prior` scaled by beta.
WinoPasses run_both_passes(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy, const Window2d& win,
                           double beta, const Tensor& prior_w, const Tensor& prior_b) {
  Tensor y = Tensor::empty(dy.shape(), DType::f32), dx = Tensor::empty(x.shape(), DType::f32);
  Tensor dw = prior_w.clone(), db = prior_b.clone();
  for (int64_t i = 0; i < dx.numel(); ++i) dx.data<float>()[i] = 7.0f;  // garbage every element must overwrite
  ops::conv2d_forward(x, w, b, win, 1, y);
  ops::conv2d_backward(x, w, dy, win, 1, dx, dw, db, beta);
  auto vec = [](const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); };
  return {vec(y), vec(dx), vec(dw), vec(db)};
}

}  // namespace

TEST_CASE("conv2d Winograd F(2x2,3x3) matches the definition, forward and backward, on every path", "[cpu]") {
  const WinoCase cases[] = {
      {5, 8, 16, 14, 14, 1, 1},  // the CNNs' shape: 49 tiles, images grouped 3 at a time, a partial last group
      {5, 9, 8, 7, 7, 1, 1},     // odd sides: the last tile row and column half outside
      {3, 3, 5, 9, 11, 1, 1},    // odd, few channels
      {2, 2, 3, 6, 5, 0, 0},     // no padding: 4 × 3 outputs
      {2, 2, 2, 5, 4, 2, 2},     // padding 2: outputs larger than the image
      {3, 4, 3, 3, 8, 1, 0},     // padding in one direction only
      {2, 1, 2, 1, 1, 1, 1},     // one pixel
      {2, 2, 2, 40, 2, 1, 1},    // one column of tiles
      {2, 32, 64, 7, 7, 1, 1},   // a speedrun layer's channels
  };
  Rng rng(29, 0);
  for (const WinoCase& cs : cases) {
    CAPTURE(cs.batch, cs.c, cs.o, cs.h, cs.w, cs.ph, cs.pw);
    const Window2d win{3, 3, 1, 1, cs.ph, cs.pw};
    const int64_t oh = window_out(cs.h, 3, 1, cs.ph, 1), ow = window_out(cs.w, 3, 1, cs.pw, 1);
    const Tensor x = wino_uniform(Shape{cs.batch, cs.c, cs.h, cs.w}, rng),
                 w = wino_uniform(Shape{cs.o, cs.c, 3, 3}, rng);
    const Tensor b = wino_uniform(Shape{cs.o}, rng), dy = wino_uniform(Shape{cs.batch, cs.o, oh, ow}, rng);
    const Tensor prior_w = wino_uniform(w.shape(), rng), prior_b = wino_uniform(b.shape(), rng);
    REQUIRE(cpu::winograd_applies(DType::f32, w.shape(), win, 1));
    // the definition, in double; dw and db onto half the prior (beta 0.5)
    std::vector<double> want_y(static_cast<size_t>(dy.numel())), want_dx(static_cast<size_t>(x.numel()));
    std::vector<double> want_dw(static_cast<size_t>(w.numel())), want_db(static_cast<size_t>(b.numel()));
    for (size_t i = 0; i < want_dw.size(); ++i) want_dw[i] = 0.5 * prior_w.data<float>()[i];
    for (size_t i = 0; i < want_db.size(); ++i) want_db[i] = 0.5 * prior_b.data<float>()[i];
    const float *X = x.data<float>(), *W = w.data<float>(), *G = dy.data<float>();
    for (int64_t n = 0; n < cs.batch; ++n)
      for (int64_t o = 0; o < cs.o; ++o)
        for (int64_t oy = 0; oy < oh; ++oy)
          for (int64_t ox = 0; ox < ow; ++ox) {
            const int64_t yi = ((n * cs.o + o) * oh + oy) * ow + ox;
            double acc = b.data<float>()[o];
            want_db[static_cast<size_t>(o)] += G[yi];
            for (int64_t ci = 0; ci < cs.c; ++ci)
              for (int64_t ky = 0; ky < 3; ++ky)
                for (int64_t kx = 0; kx < 3; ++kx) {
                  const int64_t iy = oy - cs.ph + ky, ix = ox - cs.pw + kx;
                  if (iy < 0 || iy >= cs.h || ix < 0 || ix >= cs.w) continue;
                  const int64_t xi = ((n * cs.c + ci) * cs.h + iy) * cs.w + ix,
                                wi = ((o * cs.c + ci) * 3 + ky) * 3 + kx;
                  acc += double(W[wi]) * X[xi];
                  want_dx[static_cast<size_t>(xi)] += double(W[wi]) * G[yi];
                  want_dw[static_cast<size_t>(wi)] += double(X[xi]) * G[yi];
                }
            want_y[static_cast<size_t>(yi)] = acc;
          }
    auto worst = [](const std::vector<float>& got, const std::vector<double>& want) {
      double e = 0;
      for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::abs(got[i] - want[i]));
      return e;
    };
    // Tolerances: every output sums C·9 products of values in [-1, 1] (dw and db: batch·oh·ow of them), so the bound is
    // per term. Measured worst (AVX-512, this data): Winograd 2.9e-8·C·9 on y, 3.7e-8·C·9 on dx, 3.1e-8 per term on
    // dw; im2col 5.0e-8, 2.7e-8 and 2.5e-8. The bounds leave five times that.
    const double tol_y = 2e-7 * static_cast<double>(cs.c * 9), tol_dw = 2e-7 * static_cast<double>(cs.batch * oh * ow);
    // The transforms only add and subtract (nothing to fuse into an FMA): every instruction-set path gives the same
    // bits at a thread count. Across thread counts y and dx keep them where gputrain's GEMM kernels run, as an
    // element of their products depends on its row and column only, not on which images share its group
    // (OpenBLAS's blocking may follow the product's width); dw and db follow the threads' chunks of the batch.
    const bool our_gemm = cpu::cpu_sgemm_path() != cpu::CpuSgemmPath::openblas;
    std::optional<WinoPasses> first, one_thread;
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      first.reset();
      for (const cpu::CpuIsa isa : {cpu::CpuIsa::avx512, cpu::CpuIsa::avx2, cpu::CpuIsa::baseline}) {
        const ForcedCpuIsa forced_isa(isa);
        if (!forced_isa.ok()) continue;
        CAPTURE(threads, cpu::to_string(isa));
        const ForcedConvAlgo forced(cpu::CpuConvAlgo::winograd);
        const uint64_t calls = cpu::cpu_kernel_calls(isa);
        const WinoPasses r = run_both_passes(x, w, b, dy, win, 0.5, prior_w, prior_b);
        CHECK(cpu::cpu_kernel_calls(isa) > calls);  // the transforms ran on the forced path
        CHECK(worst(r.y, want_y) < tol_y);
        CHECK(worst(r.dx, want_dx) < tol_y);
        CHECK(worst(r.dw, want_dw) < tol_dw);
        CHECK(worst(r.db, want_db) < tol_dw);
        if (one_thread && our_gemm) {
          CHECK(bit_differences(r.y, one_thread->y) == 0);
          CHECK(bit_differences(r.dx, one_thread->dx) == 0);
        }
        if (!first) {
          first = r;
          continue;
        }
        CHECK(bit_differences(r.y, first->y) == 0);
        CHECK(bit_differences(r.dx, first->dx) == 0);
        CHECK(bit_differences(r.dw, first->dw) == 0);
        CHECK(bit_differences(r.db, first->db) == 0);
      }
      if (!one_thread) one_thread = first;
    }
    // im2col on the same data, as a second opinion near the first: the two differ by rounding only.
    const ForcedConvAlgo forced(cpu::CpuConvAlgo::im2col);
    const WinoPasses ref = run_both_passes(x, w, b, dy, win, 0.5, prior_w, prior_b);
    CHECK(worst(ref.y, want_y) < tol_y);
    CHECK(bit_differences(ref.y, first->y) > 0);  // it did run the other algorithm
  }
  set_num_threads(1);
}

TEST_CASE("conv2d Winograd: no bias, no dx, beta 0", "[cpu]") {
  Rng rng(31, 0);
  const Window2d win{3, 3, 1, 1, 1, 1};
  const Tensor x = wino_uniform(Shape{3, 8, 6, 6}, rng), w = wino_uniform(Shape{8, 8, 3, 3}, rng);
  const Tensor dy = wino_uniform(Shape{3, 8, 6, 6}, rng);
  std::vector<float> ys[2], dws[2];
  for (const cpu::CpuConvAlgo algo : {cpu::CpuConvAlgo::im2col, cpu::CpuConvAlgo::winograd}) {
    const ForcedConvAlgo forced(algo);
    Tensor y = Tensor::empty(dy.shape(), DType::f32), dw = Tensor::empty(w.shape(), DType::f32), none;
    for (int64_t i = 0; i < dw.numel(); ++i) dw.data<float>()[i] = std::nanf("");  // beta 0 never reads it
    ops::conv2d_forward(x, w, none, win, 1, y);
    ops::conv2d_backward(x, w, dy, win, 1, none, dw, none, 0.0);
    ys[static_cast<int>(algo)].assign(y.data<float>(), y.data<float>() + y.numel());
    dws[static_cast<int>(algo)].assign(dw.data<float>(), dw.data<float>() + dw.numel());
  }
  for (size_t i = 0; i < ys[0].size(); ++i) REQUIRE(std::abs(ys[0][i] - ys[1][i]) < 1e-4);
  for (size_t i = 0; i < dws[0].size(); ++i) REQUIRE(std::abs(dws[0][i] - dws[1][i]) < 1e-4);
}

TEST_CASE("conv2d: which algorithm auto picks on the CPU", "[cpu]") {
  const Window2d same{3, 3, 1, 1, 1, 1};
  const Shape x{128, 32, 14, 14}, w{64, 32, 3, 3};
  CHECK(cpu::cpu_conv_algo(DType::f32, x, w, same, 1) == cpu::CpuConvAlgo::winograd);
  CHECK(cpu::cpu_conv_algo(DType::f32, Shape{128, 16, 14, 14}, Shape{16, 16, 3, 3}, same, 1) ==
        cpu::CpuConvAlgo::winograd);
  // a first layer's single input channel, or few outputs: im2col
  CHECK(cpu::cpu_conv_algo(DType::f32, Shape{128, 1, 28, 28}, Shape{32, 1, 3, 3}, same, 1) == cpu::CpuConvAlgo::im2col);
  CHECK(cpu::cpu_conv_algo(DType::f32, x, Shape{cpu::kWinogradMinChannels - 1, 32, 3, 3}, same, 1) ==
        cpu::CpuConvAlgo::im2col);
  CHECK(cpu::cpu_conv_algo(DType::f32, Shape{128, cpu::kWinogradMinChannels - 1, 14, 14},
                           Shape{64, cpu::kWinogradMinChannels - 1, 3, 3}, same, 1) == cpu::CpuConvAlgo::im2col);
  // images of more than kWinogradMaxTiles output tiles (64 × 64 outputs: 1024 tiles; 66 × 64: 1056)
  CHECK(cpu::cpu_conv_algo(DType::f32, Shape{8, 32, 64, 64}, w, same, 1) == cpu::CpuConvAlgo::winograd);
  CHECK(cpu::cpu_conv_algo(DType::f32, Shape{8, 32, 66, 64}, w, same, 1) == cpu::CpuConvAlgo::im2col);
  // what F(2x2,3x3) cannot compute: f64 (the gradient checks' type), stride 2, dilation, groups, other windows
  CHECK(cpu::cpu_conv_algo(DType::f64, x, w, same, 1) == cpu::CpuConvAlgo::im2col);
  CHECK(cpu::cpu_conv_algo(DType::f32, x, w, Window2d{3, 3, 2, 2, 1, 1}, 1) == cpu::CpuConvAlgo::im2col);
  CHECK(cpu::cpu_conv_algo(DType::f32, x, w, Window2d{3, 3, 1, 1, 2, 2, 2, 2}, 1) == cpu::CpuConvAlgo::im2col);
  CHECK(cpu::cpu_conv_algo(DType::f32, x, Shape{64, 16, 3, 3}, same, 2) == cpu::CpuConvAlgo::im2col);
  CHECK(cpu::cpu_conv_algo(DType::f32, x, Shape{64, 32, 5, 5}, Window2d{5, 5, 1, 1, 2, 2}, 1) ==
        cpu::CpuConvAlgo::im2col);
  // half product precisions keep im2col (its bf16 kernels round the operands); tf32 is f32 on the CPU
  {
    const ProductPrecisionScope half(Precision::bf16);
    CHECK(cpu::cpu_conv_algo(DType::f32, x, w, same, 1) == cpu::CpuConvAlgo::im2col);
  }
  {
    const ProductPrecisionScope tf32(Precision::tf32);
    CHECK(cpu::cpu_conv_algo(DType::f32, x, w, same, 1) == cpu::CpuConvAlgo::winograd);
  }
  // forced either way where it applies; never where it does not
  {
    const ForcedConvAlgo forced(cpu::CpuConvAlgo::im2col);
    CHECK(cpu::cpu_conv_algo(DType::f32, x, w, same, 1) == cpu::CpuConvAlgo::im2col);
  }
  {
    const ForcedConvAlgo forced(cpu::CpuConvAlgo::winograd);
    CHECK(cpu::cpu_conv_algo(DType::f32, Shape{128, 1, 28, 28}, Shape{32, 1, 3, 3}, same, 1) ==
          cpu::CpuConvAlgo::winograd);
    CHECK(cpu::cpu_conv_algo(DType::f32, x, w, Window2d{3, 3, 2, 2, 1, 1}, 1) == cpu::CpuConvAlgo::im2col);
  }
}
