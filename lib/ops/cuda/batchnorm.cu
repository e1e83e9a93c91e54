// CUDA batch normalisation (ops/batchnorm.h) through cuDNN's spatial mode, x viewed as (B, C, S, 1), and kernels for
// what cuDNN has no call for: the saved statistics of an evaluation pass and the backward pass through fixed (running)
// statistics.
//
// cuDNN keeps the same quantities as the CPU: its running variance is the unbiased batch variance blended with
// `exponentialAverageFactor` (= momentum) as PyTorch does, and its saved "inverse variance" is 1/√(σ²_batch + eps),
// the inverse standard deviation the CPU stores in save_invstd.
#include "ops/batchnorm.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dnn_common.h"

#include <algorithm>

namespace gt::cuda {
namespace {

using namespace dnn;

constexpr int kThreads = 256;  // a power of two: the block reduction halves it

template <class T>
__global__ void bn_eval_stats_kernel(const T* __restrict__ rm, const T* __restrict__ rv, double eps, T* __restrict__ sm,
                                     T* __restrict__ si, int64_t channels) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    sm[c] = rm[c];
    si[c] = static_cast<T>(1.0 / sqrt(static_cast<double>(rv[c]) + eps));  // in double, as the CPU computes it
  }
}

// One block per channel c: the block's threads stride over the channel's batch·spatial elements, write dx on the
// way, and reduce Σ dy and Σ dy·(x − mean) in double (the CPU sums rows in T and combines them in double).
template <class T>
__global__ void bn_eval_backward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                        const T* __restrict__ mean, const T* __restrict__ invstd,
                                        const T* __restrict__ dy, T* __restrict__ dx, T* __restrict__ dgamma,
                                        T* __restrict__ dbeta, double beta, int64_t batch, int64_t channels,
                                        int64_t spatial) {
  __shared__ double part_dy[kThreads], part_dyx[kThreads];
  const int64_t c = blockIdx.x;
  const double m = static_cast<double>(mean[c]), inv = static_cast<double>(invstd[c]);
  const T k = static_cast<T>(static_cast<double>(gamma[c]) * inv);
  const int64_t n = batch * spatial;
  double s_dy = 0, s_dyx = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t b = j / spatial, i = j - b * spatial;
    const int64_t at = (b * channels + c) * spatial + i;  // x (batch, channels, spatial)
    const T g = dy[at];
    s_dy += static_cast<double>(g);
    s_dyx += static_cast<double>(g) * (static_cast<double>(x[at]) - m);
    if (dx) dx[at] = k * g;
  }
  part_dy[threadIdx.x] = s_dy;
  part_dyx[threadIdx.x] = s_dyx;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      part_dy[threadIdx.x] += part_dy[threadIdx.x + stride];
      part_dyx[threadIdx.x] += part_dyx[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    // beta = 0 overwrites without reading the old gradient (it may be uninitialised).
    dgamma[c] = static_cast<T>(part_dyx[0] * inv + (beta != 0 ? beta * static_cast<double>(dgamma[c]) : 0.0));
    dbeta[c] = static_cast<T>(part_dy[0] + (beta != 0 ? beta * static_cast<double>(dbeta[c]) : 0.0));
  }
}

// save_mean = running_mean, save_invstd = 1/√(running_var + eps), per channel, as the CPU stores them for the
// backward pass. `is_double` picks f64 over f32 for every pointer.
void launch_bn_eval_stats(cudaStream_t s, bool is_double, const void* running_mean, const void* running_var, double eps,
                          void* save_mean, void* save_invstd, int64_t channels) {
  if (channels == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((channels + kThreads - 1) / kThreads, 1024));
  if (is_double)
    bn_eval_stats_kernel<double>
        <<<blocks, kThreads, 0, s>>>(static_cast<const double*>(running_mean), static_cast<const double*>(running_var),
                                     eps, static_cast<double*>(save_mean), static_cast<double*>(save_invstd), channels);
  else
    bn_eval_stats_kernel<float>
        <<<blocks, kThreads, 0, s>>>(static_cast<const float*>(running_mean), static_cast<const float*>(running_var),
                                     eps, static_cast<float*>(save_mean), static_cast<float*>(save_invstd), channels);
  GT_CHECK_LAUNCH();
}

// The backward pass through fixed statistics (evaluation mode) over x viewed as (batch, channels, spatial):
//   dx = γ·invstd·dy (skipped when dx is null),
//   dgamma = Σ dy·(x − mean)·invstd + beta·dgamma,  dbeta = Σ dy + beta·dbeta  (sums over batch and spatial).
void launch_bn_eval_backward(cudaStream_t s, bool is_double, const void* x, const void* gamma, const void* save_mean,
                             const void* save_invstd, const void* dy, void* dx, void* dgamma, void* dbeta, double beta,
                             int64_t batch, int64_t channels, int64_t spatial) {
  if (channels == 0) return;
  // One block per channel; a grid's x extent allows 2³¹ − 1 blocks, far more channels than a layer has.
  const unsigned blocks = static_cast<unsigned>(channels);
  auto go = [&](auto zero) {
    using T = decltype(zero);
    bn_eval_backward_kernel<T><<<blocks, kThreads, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(save_mean),
        static_cast<const T*>(save_invstd), static_cast<const T*>(dy), static_cast<T*>(dx), static_cast<T*>(dgamma),
        static_cast<T*>(dbeta), beta, batch, channels, spatial);
  };
  if (is_double)
    go(double{});
  else
    go(float{});
  GT_CHECK_LAUNCH();
}

struct NormPlan {
  TensorDesc x;   // (B, C, S, 1), also the descriptor of y, dy and dx
  TensorDesc bn;  // (1, C, 1, 1): gamma, beta, the running and the saved statistics
};

struct Extent {
  int64_t batch, channels, spatial;
};

Extent extent_of(const Tensor& x, const Tensor& gamma) {
  const int64_t batch = x.dim(0), channels = gamma.numel();
  return {batch, channels, batch * channels == 0 ? 0 : x.numel() / (batch * channels)};
}

const NormPlan& norm_plan(const Tensor& x, const Extent& e) {
  check_numel(x, "batchnorm input");
  const int device = x.device().index;
  static auto* cache = new PlanCache<5, NormPlan>;  // leaked on purpose (matmul.cu)
  const PlanCache<5, NormPlan>::Key key{device, is_f64(x), e.batch, e.channels, e.spatial};
  return cache->get(key, PlanFamily::batchnorm, [&] {
    auto plan = std::make_unique<NormPlan>();
    GT_CHECK_CUDNN(cudnnCreateTensorDescriptor(plan->x.out()));
    GT_CHECK_CUDNN(cudnnSetTensor4dDescriptor(plan->x.get(), CUDNN_TENSOR_NCHW, cudnn_type(x.dtype()),
                                              to_int(e.batch, "batch"), to_int(e.channels, "channels"),
                                              to_int(e.spatial, "spatial size"), 1));
    // The statistics' descriptor, in the type cuDNN wants for them (f64 for f64 data, f32 for f32).
    GT_CHECK_CUDNN(cudnnCreateTensorDescriptor(plan->bn.out()));
    GT_CHECK_CUDNN(cudnnDeriveBNTensorDescriptor(plan->bn.get(), plan->x.get(), CUDNN_BATCHNORM_SPATIAL));
    return plan;
  });
}

}  // namespace

void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y) {
  if (!(eps >= CUDNN_BN_MIN_EPSILON))
    throw Error(
        fmt::format("batchnorm on CUDA: eps = {} is below cuDNN's minimum {}; set the layer's eps to at "
                    "least that (PyTorch's default is 1e-5)",
                    eps, CUDNN_BN_MIN_EPSILON));
  const int device = x.device().index;
  const Extent e = extent_of(x, gamma);
  if (x.numel() == 0) return;
  const NormPlan& plan = norm_plan(x, e);
  const bool f64 = is_f64(x);
  const HostScalar one(1.0, f64), zero(0.0, f64);
  const cudnnHandle_t handle = cudnn_handle(device);
  if (training) {
    GT_CHECK_CUDNN(cudnnBatchNormalizationForwardTraining(handle, CUDNN_BATCHNORM_SPATIAL, one.ptr(), zero.ptr(),
                                                          plan.x.get(), x.raw(), plan.x.get(), y.raw(), plan.bn.get(),
                                                          gamma.raw(), beta.raw(), momentum, running_mean.raw(),
                                                          running_var.raw(), eps, save_mean.raw(), save_invstd.raw()));
    return;
  }
  GT_CHECK_CUDNN(cudnnBatchNormalizationForwardInference(
      handle, CUDNN_BATCHNORM_SPATIAL, one.ptr(), zero.ptr(), plan.x.get(), x.raw(), plan.x.get(), y.raw(),
      plan.bn.get(), gamma.raw(), beta.raw(), running_mean.raw(), running_var.raw(), eps));
  // The CPU leaves the statistics it normalised with for the backward pass; so does this.
  launch_bn_eval_stats(stream(device), f64, running_mean.raw(), running_var.raw(), eps, save_mean.raw(),
                       save_invstd.raw(), e.channels);
}

void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta) {
  const int device = x.device().index;
  const Extent e = extent_of(x, gamma);
  const bool f64 = is_f64(x);
  if (!training) {
    launch_bn_eval_backward(stream(device), f64, x.raw(), gamma.raw(), save_mean.raw(), save_invstd.raw(), dy.raw(),
                            dx.defined() ? dx.raw() : nullptr, dgamma.raw(), dbeta.raw(), beta, e.batch, e.channels,
                            e.spatial);
    return;
  }
  if (x.numel() == 0) return;
  const NormPlan& plan = norm_plan(x, e);
  const HostScalar one(1.0, f64), zero(0.0, f64), acc(beta, f64);
  // cuDNN always writes dx: without one (the first layer), it goes to scratch.
  void* dx_ptr = dx.defined() ? dx.raw() : workspace(device, x.bytes());
  // With the saved mean and inverse std passed, cuDNN does not recompute them, so the epsilon argument is unused;
  // it must still be a valid one.
  const double unused_eps = std::max(1e-5, CUDNN_BN_MIN_EPSILON);
  GT_CHECK_CUDNN(cudnnBatchNormalizationBackward(cudnn_handle(device), CUDNN_BATCHNORM_SPATIAL, one.ptr(), zero.ptr(),
                                                 one.ptr(), acc.ptr(), plan.x.get(), x.raw(), plan.x.get(), dy.raw(),
                                                 plan.x.get(), dx_ptr, plan.bn.get(), gamma.raw(), dgamma.raw(),
                                                 dbeta.raw(), unused_eps, save_mean.raw(), save_invstd.raw()));
}

}  // namespace gt::cuda
