// The tiled CUDA attention's kernels (lib/ops/cuda/attention_tiled_kernels.cuh) run on the host, in every build: a
// thread per CUDA thread of a block (128), a barrier for __syncthreads, __shfl_xor_sync through the block's shared
// slots, and a stand-in for nvcuda::wmma whose fragments hold a whole tile in every lane of a warp (lane 0 multiplies
// and stores), each *_sync call a barrier of the warp's 32 threads. The blocks of a grid run one after another with
// their shared memory filled with NaN (a tile read before it is written poisons the results), the outputs sit between
// sentinels, and each wmma pointer must be 32 bytes into the shared memory and each leading dimension a multiple of 4
// floats (the rules of f32 and tf32 wmma). TF32 rounding is cvt.rna's: to nearest, ties away from zero, 13 low bits
// cleared.
//
// What it shows without a device: the tiles' indexing, masking and synchronisation, the online softmax and the two
// backward kernels, against the CPU's f32 attention within test_cuda_attention_tiled.cpp's written tolerances. What it
// cannot show: the device's own arithmetic (expf, the tensor cores' accumulation order), bank conflicts, speed.
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/attention.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

using namespace gt;

namespace {

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
thread_local dim3 threadIdx, blockIdx;
dim3 gridDim;

constexpr int kBlockThreads = 128;

// What a block's threads share: its shared memory, the block's barrier, each warp's, and the shuffle slots.
struct Block {
  std::vector<float> smem;
  std::barrier<> all{kBlockThreads};
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<float> slots = std::vector<float>(kBlockThreads);
};
thread_local Block* g_block = nullptr;
std::atomic<bool> g_misaligned{false};

void __syncthreads() { g_block->all.arrive_and_wait(); }
void warp_sync() { g_block->warps[threadIdx.x / 32]->arrive_and_wait(); }
// Every thread of the block calls it at the same point (the kernels' pairs of a query row do).
float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  g_block->slots[threadIdx.x] = v;
  __syncthreads();
  const float r = g_block->slots[threadIdx.x ^ static_cast<unsigned>(lane_mask)];
  __syncthreads();
  return r;
}
float* tiled_shared() { return g_block->smem.data(); }

void check_wmma_pointer(const float* p, unsigned ldm) {
  const std::ptrdiff_t offset = p - g_block->smem.data();
  if (offset % 8 != 0 || ldm % 4 != 0) g_misaligned = true;
}

namespace kern {
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
template <class T>
T infinity() {
  return std::numeric_limits<T>::infinity();
}
}  // namespace kern

namespace nvcuda::wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

// A whole R × C tile (row-major) in every lane.
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int R = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int C = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = R * C;
  float x[R * C];
};

float __float_to_tf32(float v) {
  uint32_t u = 0;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & ~0x1fffu;
  std::memcpy(&v, &u, 4);
  return v;
}

template <class Use, int M, int N, int K, class T, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const float* p, unsigned ldm) {
  using F = fragment<Use, M, N, K, T, Layout>;
  check_wmma_pointer(p, ldm);
  for (int r = 0; r < F::R; ++r)
    for (int c = 0; c < F::C; ++c)
      f.x[r * F::C + c] = std::is_same_v<Layout, col_major> ? p[c * ldm + r] : p[r * ldm + c];
  warp_sync();
}
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
  check_wmma_pointer(p, ldm);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) f.x[r * N + c] = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
  warp_sync();
}
template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
  check_wmma_pointer(p, ldm);
  warp_sync();  // every lane has read what the store overwrites
  if (threadIdx.x % 32 == 0)
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < N; ++c) (layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[r * N + c];
  warp_sync();
}
template <int M, int N, int K>
void fill_fragment(fragment<accumulator, M, N, K, float>& f, float v) {
  std::fill(std::begin(f.x), std::end(f.x), v);
}
template <int M, int N, int K, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, precision::tf32, LA>& a,
              const fragment<matrix_b, M, N, K, precision::tf32, LB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  if (threadIdx.x % 32 == 0)  // lane 0's copy is the one store_matrix_sync writes
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        float s = c.x[m * N + n];
        for (int k = 0; k < K; ++k) s += a.x[m * K + k] * b.x[k * N + n];
        d.x[m * N + n] = s;
      }
  warp_sync();
}
}  // namespace nvcuda::wmma

using namespace kern;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#include "ops/cuda/attention_tiled_kernels.cuh"
#undef __global__
#undef __device__
#undef __forceinline__
#undef __launch_bounds__

// Runs body() as each thread of each block of `grid`, a block at a time, with `floats` of shared memory (NaN at the
// start of every block). The block's 128 threads are made once and walk the blocks together.
template <class F>
void launch(dim3 grid, size_t floats, F&& body) {
  gridDim = grid;
  Block block;
  for (int w = 0; w < kBlockThreads / 32; ++w) block.warps.push_back(std::make_unique<std::barrier<>>(32));
  std::vector<std::thread> threads;
  for (unsigned tx = 0; tx < kBlockThreads; ++tx)
    threads.emplace_back([&, tx] {
      threadIdx = {tx, 0, 0};
      g_block = &block;
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          blockIdx = {bx, by, 0};
          if (tx == 0) block.smem.assign(floats, std::numeric_limits<float>::quiet_NaN());
          __syncthreads();
          body();
          __syncthreads();  // the block is done before the next one refills its shared memory
        }
    });
  for (std::thread& t : threads) t.join();
}

constexpr int64_t kGuard = 64;
constexpr float kSentinel = 1234.5f;

// n floats between kGuard sentinels on each side.
struct GuardedBuffer {
  std::vector<float> all;
  explicit GuardedBuffer(int64_t n) : all(static_cast<size_t>(n + 2 * kGuard), kSentinel) {}
  float* data() { return all.data() + kGuard; }
  bool guards_intact() const {
    for (int64_t i = 0; i < kGuard; ++i)
      if (all[static_cast<size_t>(i)] != kSentinel || all[all.size() - 1 - static_cast<size_t>(i)] != kSentinel)
        return false;
    return true;
  }
};

struct Emulated {
  GuardedBuffer out, lse, dqkv;
};

// The forward of qkv, and the backward from the given out and lse (delta = Σ dout·out per row, summed in double
// as attention.cu's delta kernel sums it), for heads of D in the product mode kTc.
template <int D, bool kTc>
void run_kernels(const Tensor& qkv, const Tensor& dout, int64_t heads, const Tensor& out, const Tensor& lse,
                 Emulated& e) {
  using L = Tiles<D>;
  const int64_t nb = qkv.dim(0), t = qkv.dim(1), c = heads * D;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  std::vector<float> delta(static_cast<size_t>(nb * heads * t));
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i) {
        double s = 0;
        for (int64_t x = 0; x < D; ++x) {
          const int64_t at = (b * t + i) * c + h * D + x;
          s += static_cast<double>(dout.data<float>()[at]) * out.data<float>()[at];
        }
        delta[static_cast<size_t>((b * heads + h) * t + i)] = static_cast<float>(s);
      }
  const float *x = qkv.data<float>(), *g = dout.data<float>(), *l = lse.data<float>();
  const auto bh = static_cast<unsigned>(nb * heads);
  const auto tiles = [&](int rows) { return static_cast<unsigned>((t + rows - 1) / rows); };
  launch(dim3{bh, tiles(L::kFwdRows), 1}, L::kFwdFloats,
         [&] { tiled_fwd_kernel<D, kTc>(x, t, c, heads, scale, e.out.data(), e.lse.data()); });
  launch(dim3{bh, tiles(L::kKvKeys), 1}, L::kKvFloats,
         [&] { tiled_dkv_kernel<D, kTc>(x, g, l, delta.data(), t, c, heads, scale, e.dqkv.data()); });
  launch(dim3{bh, tiles(L::kDqRows), 1}, L::kDqFloats,
         [&] { tiled_dq_kernel<D, kTc>(x, g, l, delta.data(), t, c, heads, scale, e.dqkv.data()); });
}

Tensor uniform(const Shape& shape, uint64_t seed) {
  Tensor x = Tensor::empty(shape, DType::f32);
  Rng rng(seed, 0);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
  return x;
}

// The largest |a − b| over n elements, or infinity where a is not finite.
double max_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}

}  // namespace

// Tolerances: test_cuda_attention_tiled.cpp's, derived there (fp32: 5e-5 on out and lse, 1e-4 of the largest
// gradient; tf32 with u = 2⁻¹¹: u(√d + 4) on out, u√d on lse, 4u(√d + 4) of the largest gradient).
TEST_CASE("the tiled CUDA attention's kernels, run on the host, match the CPU's f32 attention", "[cpu]") {
  const auto [d, t] = GENERATE(std::pair<int64_t, int64_t>{64, 77}, std::pair<int64_t, int64_t>{96, 77},
                               std::pair<int64_t, int64_t>{128, 130});
  const bool tc = GENERATE(false, true);
  INFO("head size " << d << ", T " << t << (tc ? ", tf32" : ", fp32"));
  const int64_t nb = 2, heads = 2, c = heads * d;
  const Tensor qkv = uniform(Shape{nb, t, 3 * c}, 300 + static_cast<uint64_t>(d + t)),
               dout = uniform(Shape{nb, t, c}, 301);
  Tensor out = Tensor::empty(Shape{nb, t, c}, DType::f32), lse = Tensor::empty(Shape{nb, heads, t}, DType::f32);
  ops::attention_forward(qkv, heads, {}, out, lse);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::f32), delta = Tensor::empty(lse.shape(), DType::f32);
  ops::attention_backward(qkv, out, lse, dout, heads, {}, delta, dqkv);

  Emulated e{GuardedBuffer(out.numel()), GuardedBuffer(lse.numel()), GuardedBuffer(qkv.numel())};
  g_misaligned = false;
  auto run = [&](auto dc) {
    if (tc)
      run_kernels<decltype(dc)::value, true>(qkv, dout, heads, out, lse, e);
    else
      run_kernels<decltype(dc)::value, false>(qkv, dout, heads, out, lse, e);
  };
  if (d == 64)
    run(std::integral_constant<int, 64>{});
  else if (d == 96)
    run(std::integral_constant<int, 96>{});
  else
    run(std::integral_constant<int, 128>{});
  CHECK_FALSE(g_misaligned);
  CHECK(e.out.guards_intact());
  CHECK(e.lse.guards_intact());
  CHECK(e.dqkv.guards_intact());

  const double u = 0x1p-11, rd = std::sqrt(static_cast<double>(d));
  const double out_tol = tc ? u * (rd + 4) : 5e-5, lse_tol = tc ? u * rd : 5e-5,
               grad_tol = tc ? 4 * u * (rd + 4) : 1e-4;
  double largest = 0;
  for (int64_t i = 0; i < dqkv.numel(); ++i) largest = std::max(largest, std::abs(double{dqkv.data<float>()[i]}));
  const double out_err = max_diff(e.out.data(), out.data<float>(), out.numel());
  const double lse_err = max_diff(e.lse.data(), lse.data<float>(), lse.numel());
  const double grad_err = max_diff(e.dqkv.data(), dqkv.data<float>(), dqkv.numel());
  INFO("out " << out_err << ", lse " << lse_err << ", dqkv " << grad_err << " of largest " << largest);
  CHECK(out_err <= out_tol);
  CHECK(lse_err <= lse_tol + 1e-4);  // plus 1e-5 of lse (up to ~10 here), as the device test's relative term
  CHECK(grad_err <= grad_tol * largest + 1e-5);
  if (tc) CHECK(out_err > 5e-5);  // the operands were rounded to TF32
}
