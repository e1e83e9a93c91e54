// CUDA pooling (ops/pool2d.h) through cuDNN's legacy API: NCHW descriptors, one cached plan per shape.
#include "ops/pool2d.h"

#include "ops/cuda/context.h"
#include "ops/cuda/dnn_common.h"

namespace gt::cuda {
namespace {

using namespace dnn;

struct PoolPlan {
  TensorDesc x, y;
  PoolDesc pool;
};

const PoolPlan& pool_plan(PoolKind kind, const Tensor& x, const Window2d& win, int64_t oh, int64_t ow) {
  GT_CHECK(win.dh == 1 && win.dw == 1, "pool2d on CUDA: cuDNN pooling has no dilation (got {}×{})", win.dh, win.dw);
  check_numel(x, "pool2d input");
  const int device = x.device().index;
  static auto* cache = new PlanCache<15, PoolPlan>;  // leaked on purpose (matmul.cu)
  const PlanCache<15, PoolPlan>::Key key{device,   is_f64(x), kind == PoolKind::max,
                                         x.dim(0), x.dim(1),  x.dim(2),
                                         x.dim(3), win.kh,    win.kw,
                                         win.sh,   win.sw,    win.ph,
                                         win.pw,   oh,        ow};
  return cache->get(key, PlanFamily::pool, [&] {
    auto plan = std::make_unique<PoolPlan>();
    const cudnnDataType_t type = cudnn_type(x.dtype());
    set_4d(plan->x, type, x.dim(0), x.dim(1), x.dim(2), x.dim(3));
    set_4d(plan->y, type, x.dim(0), x.dim(1), oh, ow);
    GT_CHECK_CUDNN(cudnnCreatePoolingDescriptor(plan->pool.out()));
    // Max pooling: the deterministic variant, NaN propagating as in torch.max_pool2d. Average: padding counts in the
    // divisor (count_include_pad=True, PyTorch's default).
    GT_CHECK_CUDNN(cudnnSetPooling2dDescriptor(
        plan->pool.get(),
        kind == PoolKind::max ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
        CUDNN_PROPAGATE_NAN, to_int(win.kh, "window"), to_int(win.kw, "window"), to_int(win.ph, "padding"),
        to_int(win.pw, "padding"), to_int(win.sh, "stride"), to_int(win.sw, "stride")));
    int n = 0, c = 0, h = 0, w = 0;
    GT_CHECK_CUDNN(cudnnGetPooling2dForwardOutputDim(plan->pool.get(), plan->x.get(), &n, &c, &h, &w));
    GT_CHECK(h == oh && w == ow,
             "cuDNN pools {} with a {}×{} window (stride {}×{}, padding {}×{}) to {}×{}, the op "
             "expects {}×{}",
             x.shape().str(), win.kh, win.kw, win.sh, win.sw, win.ph, win.pw, h, w, oh, ow);
    return plan;
  });
}

}  // namespace

void pool2d_forward(PoolKind kind, const Tensor& x, const Window2d& win, Tensor& y) {
  const int device = x.device().index;
  const PoolPlan& plan = pool_plan(kind, x, win, y.dim(2), y.dim(3));
  const bool f64 = is_f64(x);
  const HostScalar one(1.0, f64), zero(0.0, f64);
  GT_CHECK_CUDNN(cudnnPoolingForward(cudnn_handle(device), plan.pool.get(), one.ptr(), plan.x.get(), x.raw(),
                                     zero.ptr(), plan.y.get(), y.raw()));
}

void pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Window2d& win, Tensor& dx) {
  const int device = x.device().index;
  const PoolPlan& plan = pool_plan(kind, x, win, dy.dim(2), dy.dim(3));
  const bool f64 = is_f64(x);
  const HostScalar one(1.0, f64), zero(0.0, f64);
  const cudnnHandle_t handle = cudnn_handle(device);
  // cuDNN's backward pass wants the forward output (max pooling finds the winners by comparing x with y); the op's
  // contract does not pass it, so it is recomputed into the scratch workspace, which nothing else uses meanwhile.
  void* y = workspace(device, dy.bytes());
  GT_CHECK_CUDNN(
      cudnnPoolingForward(handle, plan.pool.get(), one.ptr(), plan.x.get(), x.raw(), zero.ptr(), plan.y.get(), y));
  GT_CHECK_CUDNN(cudnnPoolingBackward(handle, plan.pool.get(), one.ptr(), plan.y.get(), y, plan.y.get(), dy.raw(),
                                      plan.x.get(), x.raw(), zero.ptr(), plan.x.get(), dx.raw()));
}

}  // namespace gt::cuda
