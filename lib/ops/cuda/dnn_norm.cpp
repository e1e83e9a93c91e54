// Batch normalisation through cuDNN's spatial mode, x viewed as (B, C, S, 1); the evaluation-mode backward pass,
// which cuDNN has no call for, is a small kernel (dnn_kernels.cu).
//
// cuDNN keeps the same quantities as the CPU: its running variance is the unbiased batch variance blended with
// `exponentialAverageFactor` (= momentum) as PyTorch does, and its saved "inverse variance" is 1/√(σ²_batch + eps),
// the inverse standard deviation the CPU stores in save_invstd.
#include "ops/cuda/context.h"
#include "ops/cuda/dnn.h"
#include "ops/cuda/dnn_common.h"
#include "ops/cuda/dnn_launch.h"

#include <algorithm>

namespace gt::cuda {
namespace {

using namespace dnn;

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
  static auto* cache = new PlanCache<5, NormPlan>;  // leaked on purpose (dnn_matmul.cpp)
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
    throw Error(fmt::format("batchnorm on CUDA: eps = {} is below cuDNN's minimum {}; set the layer's eps to at "
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
    GT_CHECK_CUDNN(cudnnBatchNormalizationForwardTraining(
        handle, CUDNN_BATCHNORM_SPATIAL, one.ptr(), zero.ptr(), plan.x.get(), x.raw(), plan.x.get(), y.raw(),
        plan.bn.get(), gamma.raw(), beta.raw(), momentum, running_mean.raw(), running_var.raw(), eps, save_mean.raw(),
        save_invstd.raw()));
    return;
  }
  GT_CHECK_CUDNN(cudnnBatchNormalizationForwardInference(handle, CUDNN_BATCHNORM_SPATIAL, one.ptr(), zero.ptr(),
                                                         plan.x.get(), x.raw(), plan.x.get(), y.raw(), plan.bn.get(),
                                                         gamma.raw(), beta.raw(), running_mean.raw(),
                                                         running_var.raw(), eps));
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
  GT_CHECK_CUDNN(cudnnBatchNormalizationBackward(cudnn_handle(device), CUDNN_BATCHNORM_SPATIAL, one.ptr(),
                                                 zero.ptr(), one.ptr(), acc.ptr(), plan.x.get(), x.raw(),
                                                 plan.x.get(), dy.raw(), plan.x.get(), dx_ptr, plan.bn.get(),
                                                 gamma.raw(), dgamma.raw(), dbeta.raw(), unused_eps, save_mean.raw(),
                                                 save_invstd.raw()));
}

}  // namespace gt::cuda
