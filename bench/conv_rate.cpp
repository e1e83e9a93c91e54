// The CPU convolution's algorithms side by side (ops/cpu/conv_algo.h): im2col + GEMM against Winograd's F(2×2, 3×3), at
// the 3×3 layers of this project's image configs (batch 128), forward and backward (dx, dw, db) apart. Each repetition
// runs one algorithm then the other, so the machine's drift hits both alike; medians of wall-clock time.
// Prints one JSON line per layer: microseconds per call and the ratio im2col / Winograd (above 1: Winograd faster).
// Usage: bench_conv_rate [THREADS] [REPS]
#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/conv2d.h"
#include "ops/cpu/conv_algo.h"
#include "ops/math.h"

#include "seeded.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using gt::bench::seeded_f32;

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Layer {
  const char* where;
  int64_t c, o, h;
};

}  // namespace

int main(int argc, char** argv) {
  using gt::Shape;
  gt::set_num_threads(argc > 1 ? std::atoi(argv[1]) : 1);
  const int reps = argc > 2 ? std::atoi(argv[2]) : 30;
  const int64_t batch = 128;
  const Layer layers[] = {
      {"cnn/resnet first layer", 1, 32, 28}, {"speedrun first layer", 1, 16, 28}, {"cnn layer 2", 32, 64, 14},
      {"resnet stage 1", 32, 32, 14},        {"resnet stage 2", 64, 64, 7},       {"speedrun layer 2", 16, 32, 14},
      {"speedrun layer 3", 32, 64, 7},       {"8 channels, 28x28", 8, 8, 28},     {"16 channels, 28x28", 16, 16, 28},
  };
  const gt::Window2d win{3, 3, 1, 1, 1, 1};
  for (const Layer& l : layers) {
    const gt::Tensor x = seeded_f32(Shape{batch, l.c, l.h, l.h}, 1), w = seeded_f32(Shape{l.o, l.c, 3, 3}, 2);
    const gt::Tensor b = seeded_f32(Shape{l.o}, 3), dy = seeded_f32(Shape{batch, l.o, l.h, l.h}, 4);
    gt::Tensor y = gt::Tensor::empty(dy.shape(), gt::DType::f32), dx = gt::Tensor::empty(x.shape(), gt::DType::f32);
    gt::Tensor dw = gt::Tensor::empty(w.shape(), gt::DType::f32), db = gt::Tensor::empty(b.shape(), gt::DType::f32);
    // a first layer's input needs no gradient
    gt::Tensor none, &dx_or_none = l.c == 1 ? none : dx;
    std::vector<double> t[2][2];     // [algorithm][forward, backward]
    for (int r = -1; r < reps; ++r)  // r = −1: warm-up (page faults, scratch)
      for (const gt::cpu::CpuConvAlgo algo : {gt::cpu::CpuConvAlgo::im2col, gt::cpu::CpuConvAlgo::winograd}) {
        gt::cpu::force_cpu_conv_algo(algo);
        const double t0 = now_us();
        gt::ops::conv2d_forward(x, w, b, win, 1, y);
        const double t1 = now_us();
        gt::ops::conv2d_backward(x, w, dy, win, 1, dx_or_none, dw, db, 0.0);
        const double t2 = now_us();
        if (r >= 0) {
          t[static_cast<int>(algo)][0].push_back(t1 - t0);
          t[static_cast<int>(algo)][1].push_back(t2 - t1);
        }
      }
    gt::cpu::force_cpu_conv_algo(std::nullopt);
    double med[2][2];
    for (int a = 0; a < 2; ++a)
      for (int p = 0; p < 2; ++p) {
        std::sort(t[a][p].begin(), t[a][p].end());
        med[a][p] = t[a][p][t[a][p].size() / 2];
      }
    const bool auto_winograd =
        gt::cpu::cpu_conv_algo(gt::DType::f32, x.shape(), w.shape(), win, 1) == gt::cpu::CpuConvAlgo::winograd;
    std::printf(
        "{\"layer\": \"%s\", \"c\": %ld, \"o\": %ld, \"hw\": %ld, \"threads\": %d, \"im2col_fwd_us\": %.0f, "
        "\"winograd_fwd_us\": %.0f, \"fwd_ratio\": %.2f, \"im2col_bwd_us\": %.0f, \"winograd_bwd_us\": %.0f, "
        "\"bwd_ratio\": %.2f, \"auto\": \"%s\"}\n",
        l.where, static_cast<long>(l.c), static_cast<long>(l.o), static_cast<long>(l.h), gt::num_threads(), med[0][0],
        med[1][0], med[0][0] / med[1][0], med[0][1], med[1][1], med[0][1] / med[1][1],
        auto_winograd ? "winograd" : "im2col");
    std::fflush(stdout);
  }
}
