// CUDA layer normalisation (ops/layernorm.h): one block per row for the row statistics, column blocks for the
// parameter gradients. Per-element math is ops/math.h's (the CPU runs the same functions); sums are in double.
// x, y, dy and dx may be 16-bit activations, read and written as such (f32 math, each result rounded once, as the
// CPU's ops/wide.h path gives); the parameters, statistics and parameter gradients are then f32.
#include "ops/layernorm.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/math.h"

#include <cmath>

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kColRows = 16;  // row lanes of a column-sum block (32 columns × kColRows)

// x (rows, d) → y; save_mean, save_invstd (rows). One block per row. x and y are stored as X and Y (f32, f64 or 16
// bits, kernel_util.cuh's load/store), computed on in T; the parameters and statistics are T.
template <class X, class Y, class T = compute_t<X, Y>>
__global__ void layernorm_fwd_kernel(const X* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                                     int64_t d, double eps, T* __restrict__ save_mean, T* __restrict__ save_invstd,
                                     Y* __restrict__ y) {
  const int64_t r = blockIdx.x;
  const X* row = x + r * d;
  double s = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += static_cast<double>(load(row[i]));
  const double mean = block_sum(s) / static_cast<double>(d);
  double s2 = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const T v = load(row[i]);
    s2 += (v - mean) * (v - mean);
  }
  const double inv = 1.0 / sqrt(block_sum(s2) / static_cast<double>(d) + eps);
  if (threadIdx.x == 0) {
    save_mean[r] = static_cast<T>(mean);
    save_invstd[r] = static_cast<T>(inv);
  }
  Y* out = y + r * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    out[i] = store<Y>(layernorm_y<T>(load(row[i]), mean, inv, gamma[i], beta[i]));
}

// dx (rows, d) from dy, one block per row, with the saved row statistics. x and dx are stored as X, dy as G.
template <class X, class G, class T = compute_t<X, G>>
__global__ void layernorm_dx_kernel(const X* __restrict__ x, const T* __restrict__ gamma,
                                    const T* __restrict__ save_mean, const T* __restrict__ save_invstd,
                                    const G* __restrict__ dy, int64_t d, X* __restrict__ dx) {
  const int64_t r = blockIdx.x;
  const X* row = x + r * d;
  const G* g = dy + r * d;
  const double mean = save_mean[r], inv = save_invstd[r];
  double a = 0, b = 0;  // Σ dx̂ and Σ dx̂·x̂ with dx̂ = dy·γ (the product in T, as on the CPU)
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const double dxh = load(g[i]) * gamma[i];
    a += dxh;
    b += dxh * (load(row[i]) - mean) * inv;
  }
  a = block_sum(a);
  b = block_sum(b);
  X* out = dx + r * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    out[i] = store<X>(layernorm_dx<T>(load(row[i]), load(g[i]), gamma[i], mean, inv, a, b, d));
}

// dgamma (d) = Σ_r dy·x̂ + beta·dgamma, dbeta (d) = Σ_r dy + beta·dbeta; one block per 32 columns, fixed order.
template <class X, class G, class T = compute_t<X, G>>
__global__ void layernorm_dparams_kernel(const X* __restrict__ x, const T* __restrict__ save_mean,
                                         const T* __restrict__ save_invstd, const G* __restrict__ dy, int64_t rows,
                                         int64_t d, double beta, T* __restrict__ dgamma, T* __restrict__ dbeta) {
  __shared__ double part_g[kColRows][kWarp + 1], part_b[kColRows][kWarp + 1];
  const int64_t i = blockIdx.x * int64_t{kWarp} + threadIdx.x;
  double sg = 0, sb = 0;
  if (i < d)
    for (int64_t r = threadIdx.y; r < rows; r += kColRows) {
      const double g = load(dy[r * d + i]);
      sg += g * (load(x[r * d + i]) - save_mean[r]) * save_invstd[r];  // x − μ in T, as on the CPU
      sb += g;
    }
  part_g[threadIdx.y][threadIdx.x] = sg;
  part_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y != 0 || i >= d) return;
  double tg = 0, tb = 0;
  for (int k = 0; k < kColRows; ++k) tg += part_g[k][threadIdx.x], tb += part_b[k][threadIdx.x];
  dgamma[i] = static_cast<T>(tg + (beta != 0 ? beta * static_cast<double>(dgamma[i]) : 0.0));
  dbeta[i] = static_cast<T>(tb + (beta != 0 ? beta * static_cast<double>(dbeta[i]) : 0.0));
}

void launch_layernorm_forward(cudaStream_t s, DType x_type, DType y_type, const void* x, const void* gamma,
                              const void* beta, int64_t rows, int64_t d, double eps, void* save_mean, void* save_invstd,
                              void* y) {
  if (rows == 0 || d == 0) return;
  with_storage_pair("layernorm_forward", x_type, y_type, [&](auto sx, auto sy) {
    using X = decltype(sx);
    using Y = decltype(sy);
    using T = compute_t<X, Y>;
    layernorm_fwd_kernel<X, Y><<<static_cast<unsigned>(rows), row_threads(d), 0, s>>>(
        static_cast<const X*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta), d, eps,
        static_cast<T*>(save_mean), static_cast<T*>(save_invstd), static_cast<Y*>(y));
  });
  GT_CHECK_LAUNCH();
}

void launch_layernorm_backward(cudaStream_t s, DType x_type, DType dy_type, const void* x, const void* gamma,
                               const void* save_mean, const void* save_invstd, const void* dy, int64_t rows, int64_t d,
                               void* dx, void* dgamma, void* dbeta, double beta) {
  if (d == 0) return;
  with_storage_pair("layernorm_backward", x_type, dy_type, [&](auto sx, auto sg) {
    using X = decltype(sx);
    using G = decltype(sg);
    using T = compute_t<X, G>;
    const X* px = static_cast<const X*>(x);
    const G* pdy = static_cast<const G*>(dy);
    const T *pm = static_cast<const T*>(save_mean), *pi = static_cast<const T*>(save_invstd);
    if (dx && rows > 0) {
      layernorm_dx_kernel<X, G><<<static_cast<unsigned>(rows), row_threads(d), 0, s>>>(
          px, static_cast<const T*>(gamma), pm, pi, pdy, d, static_cast<X*>(dx));
      GT_CHECK_LAUNCH();
    }
    layernorm_dparams_kernel<X, G><<<static_cast<unsigned>((d + kWarp - 1) / kWarp), dim3(kWarp, kColRows), 0, s>>>(
        px, pm, pi, pdy, rows, d, beta, static_cast<T*>(dgamma), static_cast<T*>(dbeta));
  });
  GT_CHECK_LAUNCH();
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y) {
  const int64_t d = gamma.numel();
  is_f64("layernorm_forward", gamma);  // (the parameters and statistics: f32 or f64, the activations' compute type)
  launch_layernorm_forward(stream(x.device().index), x.dtype(), y.dtype(), x.raw(), gamma.raw(), beta.raw(),
                           x.numel() / d, d, eps, save_mean.raw(), save_invstd.raw(), y.raw());
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta) {
  const int64_t d = gamma.numel();
  is_f64("layernorm_backward", gamma);
  launch_layernorm_backward(stream(x.device().index), x.dtype(), dy.dtype(), x.raw(), gamma.raw(), save_mean.raw(),
                            save_invstd.raw(), dy.raw(), x.numel() / d, d, raw_or_null(dx), dgamma.raw(), dbeta.raw(),
                            beta);
}

}  // namespace gt::cuda
