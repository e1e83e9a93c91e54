// CUDA convolution (ops/conv2d.h) through cuDNN's legacy API: NCHW descriptors, algorithms chosen once per shape by
// cuDNN's heuristics (no benchmarking run, so no host synchronisation), fp32 without TF32.
#include "ops/conv2d.h"

#include "ops/cuda/context.h"
#include "ops/cuda/dnn_common.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace gt::cuda {
namespace {

using namespace dnn;

// The most scratch a convolution algorithm may ask for; faster algorithms that need more are passed over.
constexpr size_t kMaxConvWorkspace = size_t{256} << 20;

struct ConvPlan {
  TensorDesc x, y, bias;  // x (B, C, H, W), y (B, O, oh, ow), bias (1, O, 1, 1)
  FilterDesc w;           // (O, C/groups, kh, kw)
  ConvDesc conv;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
};

// The first algorithm of cuDNN's ranking (fastest first) that is supported, runs without tensor cores (TF32 would
// round fp32 inputs to 10 mantissa bits) and needs at most kMaxConvWorkspace; failing that, the supported one
// needing the least workspace. `workspace_of` returns false when cuDNN refuses the algorithm for this problem.
template <class Perf, class Algo, class WorkspaceOf>
void choose(const std::vector<Perf>& ranked, const char* direction, const std::string& problem,
            WorkspaceOf&& workspace_of, Algo& algo, size_t& ws) {
  bool found = false;
  size_t best_ws = std::numeric_limits<size_t>::max();
  Algo best{};
  for (const Perf& p : ranked) {
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    size_t bytes = 0;
    if (!workspace_of(p.algo, bytes)) continue;
    if (bytes <= kMaxConvWorkspace) {
      algo = p.algo;
      ws = bytes;
      return;
    }
    if (bytes < best_ws) {
      best_ws = bytes;
      best = p.algo;
      found = true;
    }
  }
  if (!found) throw Error(fmt::format("cuDNN offers no {} algorithm for {}", direction, problem));
  algo = best;
  ws = best_ws;
}

std::unique_ptr<ConvPlan> make_conv_plan(int device, const Tensor& x, const Tensor& w, const Window2d& win,
                                         int64_t groups, int64_t oh, int64_t ow) {
  auto plan = std::make_unique<ConvPlan>();
  const cudnnDataType_t type = cudnn_type(x.dtype());
  const int64_t batch = x.dim(0), out_ch = w.dim(0);
  const std::string problem =
      fmt::format("{} x {} · w {}, stride {}×{}, padding {}×{}, dilation {}×{}, groups {}", dtype_name(x.dtype()),
                  x.shape().str(), w.shape().str(), win.sh, win.sw, win.ph, win.pw, win.dh, win.dw, groups);
  set_4d(plan->x, type, batch, x.dim(1), x.dim(2), x.dim(3));
  set_4d(plan->y, type, batch, out_ch, oh, ow);
  set_4d(plan->bias, type, 1, out_ch, 1, 1);
  GT_CHECK_CUDNN(cudnnCreateFilterDescriptor(plan->w.out()));
  GT_CHECK_CUDNN(cudnnSetFilter4dDescriptor(plan->w.get(), type, CUDNN_TENSOR_NCHW, to_int(out_ch, "out channels"),
                                            to_int(w.dim(1), "in channels per group"), to_int(w.dim(2), "kernel h"),
                                            to_int(w.dim(3), "kernel w")));
  GT_CHECK_CUDNN(cudnnCreateConvolutionDescriptor(plan->conv.out()));
  // Cross-correlation (no kernel flip) is what PyTorch's conv2d computes; accumulation in the data's precision.
  GT_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(
      plan->conv.get(), to_int(win.ph, "padding"), to_int(win.pw, "padding"), to_int(win.sh, "stride"),
      to_int(win.sw, "stride"), to_int(win.dh, "dilation"), to_int(win.dw, "dilation"), CUDNN_CROSS_CORRELATION, type));
  GT_CHECK_CUDNN(cudnnSetConvolutionGroupCount(plan->conv.get(), to_int(groups, "groups")));
  // FMA math only: CUDNN_DEFAULT_MATH lets fp32 convolutions run as TF32 on Ampere and later.
  GT_CHECK_CUDNN(cudnnSetConvolutionMathType(plan->conv.get(), CUDNN_FMA_MATH));

  int n = 0, c = 0, h = 0, wd = 0;
  GT_CHECK_CUDNN(
      cudnnGetConvolution2dForwardOutputDim(plan->conv.get(), plan->x.get(), plan->w.get(), &n, &c, &h, &wd));
  GT_CHECK(n == batch && c == out_ch && h == oh && wd == ow,
           "cuDNN's conv2d output (B {}, C {}, {}×{}) for {} is not "
           "the op's ({}, {}, {}×{})",
           n, c, h, wd, problem, batch, out_ch, oh, ow);

  const cudnnHandle_t handle = cudnn_handle(device);
  int count = 0, returned = 0;
  {
    GT_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(std::max(count, 1)));
    GT_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(handle, plan->x.get(), plan->w.get(), plan->conv.get(),
                                                          plan->y.get(), static_cast<int>(perf.size()), &returned,
                                                          perf.data()));
    perf.resize(static_cast<size_t>(returned));
    choose(
        perf, "forward convolution", problem,
        [&](cudnnConvolutionFwdAlgo_t algo, size_t& bytes) {
          return cudnnGetConvolutionForwardWorkspaceSize(handle, plan->x.get(), plan->w.get(), plan->conv.get(),
                                                         plan->y.get(), algo, &bytes) == CUDNN_STATUS_SUCCESS;
        },
        plan->fwd, plan->fwd_ws);
  }
  {
    GT_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(std::max(count, 1)));
    GT_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, plan->w.get(), plan->y.get(), plan->conv.get(),
                                                               plan->x.get(), static_cast<int>(perf.size()), &returned,
                                                               perf.data()));
    perf.resize(static_cast<size_t>(returned));
    choose(
        perf, "backward-data convolution", problem,
        [&](cudnnConvolutionBwdDataAlgo_t algo, size_t& bytes) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, plan->w.get(), plan->y.get(), plan->conv.get(),
                                                              plan->x.get(), algo, &bytes) == CUDNN_STATUS_SUCCESS;
        },
        plan->bwd_data, plan->bwd_data_ws);
  }
  {
    GT_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<size_t>(std::max(count, 1)));
    GT_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, plan->x.get(), plan->y.get(), plan->conv.get(),
                                                                 plan->w.get(), static_cast<int>(perf.size()),
                                                                 &returned, perf.data()));
    perf.resize(static_cast<size_t>(returned));
    choose(
        perf, "backward-filter convolution", problem,
        [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t& bytes) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, plan->x.get(), plan->y.get(), plan->conv.get(),
                                                                plan->w.get(), algo, &bytes) == CUDNN_STATUS_SUCCESS;
        },
        plan->bwd_filter, plan->bwd_filter_ws);
  }
  return plan;
}

const ConvPlan& conv_plan(const Tensor& x, const Tensor& w, const Window2d& win, int64_t groups, int64_t oh,
                          int64_t ow) {
  check_numel(x, "conv2d input");
  const int device = x.device().index;
  static auto* cache = new PlanCache<18, ConvPlan>;  // leaked on purpose, as every plan cache here (matmul.cu)
  const PlanCache<18, ConvPlan>::Key key{device,   is_f64(x), x.dim(0), x.dim(1), x.dim(2), x.dim(3),
                                         w.dim(0), w.dim(2),  w.dim(3), win.sh,   win.sw,   win.ph,
                                         win.pw,   win.dh,    win.dw,   groups,   oh,       ow};
  return cache->get(key, PlanFamily::conv, [&] { return make_conv_plan(device, x, w, win, groups, oh, ow); });
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win, int64_t groups, Tensor& y) {
  check_numel(y, "conv2d output");
  const int device = x.device().index;
  const ConvPlan& plan = conv_plan(x, w, win, groups, y.dim(2), y.dim(3));
  const bool f64 = is_f64(x);
  const HostScalar one(1.0, f64), zero(0.0, f64);
  const cudnnHandle_t handle = cudnn_handle(device);
  void* ws = plan.fwd_ws ? workspace(device, plan.fwd_ws) : nullptr;
  GT_CHECK_CUDNN(cudnnConvolutionForward(handle, one.ptr(), plan.x.get(), x.raw(), plan.w.get(), w.raw(),
                                         plan.conv.get(), plan.fwd, ws, plan.fwd_ws, zero.ptr(), plan.y.get(),
                                         y.raw()));
  // y += b broadcast over (B, ·, oh, ow).
  if (b.defined())
    GT_CHECK_CUDNN(cudnnAddTensor(handle, one.ptr(), plan.bias.get(), b.raw(), one.ptr(), plan.y.get(), y.raw()));
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Window2d& win, int64_t groups,
                     Tensor& dx, Tensor& dw, Tensor& db, double beta) {
  check_numel(dy, "conv2d output gradient");
  const int device = x.device().index;
  const ConvPlan& plan = conv_plan(x, w, win, groups, dy.dim(2), dy.dim(3));
  const bool f64 = is_f64(x);
  const HostScalar one(1.0, f64), zero(0.0, f64), acc(beta, f64);
  const cudnnHandle_t handle = cudnn_handle(device);
  // One workspace request for both calls: they run one after the other on the stream.
  const size_t ws_bytes = std::max(dx.defined() ? plan.bwd_data_ws : 0, plan.bwd_filter_ws);
  void* ws = ws_bytes ? workspace(device, ws_bytes) : nullptr;
  if (dx.defined())
    GT_CHECK_CUDNN(cudnnConvolutionBackwardData(handle, one.ptr(), plan.w.get(), w.raw(), plan.y.get(), dy.raw(),
                                                plan.conv.get(), plan.bwd_data, ws, plan.bwd_data_ws, zero.ptr(),
                                                plan.x.get(), dx.raw()));
  // dw = ∂L/∂w + beta·dw (cuDNN's output blend; with beta = 0 the old dw is not read).
  GT_CHECK_CUDNN(cudnnConvolutionBackwardFilter(handle, one.ptr(), plan.x.get(), x.raw(), plan.y.get(), dy.raw(),
                                                plan.conv.get(), plan.bwd_filter, ws, plan.bwd_filter_ws, acc.ptr(),
                                                plan.w.get(), dw.raw()));
  if (db.defined())
    GT_CHECK_CUDNN(
        cudnnConvolutionBackwardBias(handle, one.ptr(), plan.y.get(), dy.raw(), acc.ptr(), plan.bias.get(), db.raw()));
}

}  // namespace gt::cuda
