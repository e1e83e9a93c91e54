// CUDA convolution (ops/conv2d.h) through cuDNN's legacy API: NCHW descriptors, algorithms chosen once per shape and
// product precision by cuDNN's heuristics (no benchmarking run, so no host synchronisation).
//
// Precisions (ops/precision.h): fp32 runs FMA math only (no TF32 — PyTorch lets its cuDNN convolutions use TF32 by
// default, but gputrain's fp32 stays fp32 for every product); tf32 lets cuDNN pick tensor core algorithms, which
// round fp32 operands to TF32 (PyTorch's torch.backends.cudnn.allow_tf32). bf16 and fp16 convert x and dy
// to 16-bit scratch and w once per step (half_scratch.h's half_weight; round to nearest even, as the CPU's half path
// rounds its GEMM operands) and run cuDNN's
// PSEUDO_HALF / PSEUDO_BFLOAT16 configuration: 16-bit tensors, f32 compute, tensor cores allowed. cuDNN's legacy API
// writes the result in the operands' type, so y, dx and dw come back rounded once more to 16 bits (as PyTorch AMP's
// half convolutions return them) before widening to the f32 tensors the model holds; the bias and its gradient stay
// f32. The CPU's half path keeps its f32 sums unrounded: the [cuda] tests allow that one rounding.
#include "ops/conv2d.h"

#include "ops/cuda/context.h"
#include "ops/cuda/dnn_common.h"
#include "ops/cuda/half_scratch.h"
#include "ops/precision.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace gt::cuda {
namespace {

using namespace dnn;

// The most scratch a convolution algorithm may ask for; faster algorithms that need more are passed over.
constexpr size_t kMaxConvWorkspace = size_t{256} << 20;

struct ConvPlan {
  TensorDesc x, y, bias;  // x (B, C, H, W), y (B, O, oh, ow) in the product's type; bias (1, O, 1, 1) f32/f64
  TensorDesc y_wide;      // y in the tensors' own type (f32) for the bias ops: made for half plans only
  FilterDesc w;           // (O, C/groups, kh, kw) in the product's type
  // y's descriptor in the tensors' own type: what the bias ops read and write.
  cudnnTensorDescriptor_t y_of_tensor() const { return y_wide.get() ? y_wide.get() : y.get(); }
  ConvDesc conv;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
};

// How a plan multiplies: the tensors' own type with FMA math (fp32, and f64 always), TF32 tensor cores allowed, or
// 16-bit copies (bf16, fp16) with f32 compute.
enum class ConvMath : int64_t { fp32, tf32, bf16, fp16 };

ConvMath conv_math(const Tensor& x) {
  if (is_f64(x)) return ConvMath::fp32;  // f64 products stay f64, as on the CPU
  switch (product_precision()) {
    case Precision::fp32: return ConvMath::fp32;
    case Precision::tf32: return ConvMath::tf32;
    case Precision::bf16: return ConvMath::bf16;
    case Precision::fp16: return ConvMath::fp16;
  }
  return ConvMath::fp32;
}

std::optional<HalfFormat> half_of(ConvMath m) {
  if (m == ConvMath::bf16) return HalfFormat::bf16;
  if (m == ConvMath::fp16) return HalfFormat::fp16;
  return std::nullopt;
}

// The first algorithm of cuDNN's ranking (fastest first) that is supported, deterministic, runs without tensor cores
// unless `tensor_ops` (TF32 would round fp32 inputs to 10 mantissa bits; 16-bit operands lose nothing on them) and
// needs at most kMaxConvWorkspace; failing that, the supported one needing the least workspace. Deterministic, as
// PyTorch's cudnn.deterministic: backward algorithms that add partial sums with atomics (backward-filter 0 and 3,
// backward-data 0) give other bits on every run, and a seeded run (or a captured step against an uncaptured one)
// must give the same ones. `workspace_of` returns false when cuDNN refuses the algorithm for this problem.
template <class Perf, class Algo, class WorkspaceOf>
void choose(const std::vector<Perf>& ranked, const char* direction, const std::string& problem, bool tensor_ops,
            WorkspaceOf&& workspace_of, Algo& algo, size_t& ws) {
  bool found = false;
  size_t best_ws = std::numeric_limits<size_t>::max();
  Algo best{};
  for (const Perf& p : ranked) {
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC) continue;
    if (p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;  // would convert fp32 operands to fp16
    if (p.mathType == CUDNN_TENSOR_OP_MATH && !tensor_ops) continue;
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
                                         int64_t groups, int64_t oh, int64_t ow, ConvMath math) {
  auto plan = std::make_unique<ConvPlan>();
  const cudnnDataType_t wide = cudnn_type(x.dtype());
  const std::optional<HalfFormat> half = half_of(math);
  // The operands' and result's type, and the accumulation's: the data's own, or 16-bit data with f32 sums.
  const cudnnDataType_t type = !half ? wide : *half == HalfFormat::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  const cudnnDataType_t compute = half ? CUDNN_DATA_FLOAT : wide;
  const bool tensor_ops = math != ConvMath::fp32;
  const int64_t batch = x.dim(0), out_ch = w.dim(0);
  const char* math_name[] = {"", " (tf32)", " (bf16 products)", " (fp16 products)"};
  const std::string problem = fmt::format("{}{} x {} · w {}, stride {}×{}, padding {}×{}, dilation {}×{}, groups {}",
                                          dtype_name(x.dtype()), math_name[static_cast<int>(math)], x.shape().str(),
                                          w.shape().str(), win.sh, win.sw, win.ph, win.pw, win.dh, win.dw, groups);
  set_4d(plan->x, type, batch, x.dim(1), x.dim(2), x.dim(3));
  set_4d(plan->y, type, batch, out_ch, oh, ow);
  set_4d(plan->bias, wide, 1, out_ch, 1, 1);
  if (half) set_4d(plan->y_wide, wide, batch, out_ch, oh, ow);
  GT_CHECK_CUDNN(cudnnCreateFilterDescriptor(plan->w.out()));
  GT_CHECK_CUDNN(cudnnSetFilter4dDescriptor(plan->w.get(), type, CUDNN_TENSOR_NCHW, to_int(out_ch, "out channels"),
                                            to_int(w.dim(1), "in channels per group"), to_int(w.dim(2), "kernel h"),
                                            to_int(w.dim(3), "kernel w")));
  GT_CHECK_CUDNN(cudnnCreateConvolutionDescriptor(plan->conv.out()));
  // Cross-correlation (no kernel flip) is what PyTorch's conv2d computes.
  GT_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(plan->conv.get(), to_int(win.ph, "padding"), to_int(win.pw, "padding"),
                                                 to_int(win.sh, "stride"), to_int(win.sw, "stride"),
                                                 to_int(win.dh, "dilation"), to_int(win.dw, "dilation"),
                                                 CUDNN_CROSS_CORRELATION, compute));
  GT_CHECK_CUDNN(cudnnSetConvolutionGroupCount(plan->conv.get(), to_int(groups, "groups")));
  // fp32: FMA math only (CUDNN_DEFAULT_MATH lets fp32 convolutions run as TF32 on Ampere and later); tf32 and the
  // 16-bit products: tensor cores.
  GT_CHECK_CUDNN(cudnnSetConvolutionMathType(plan->conv.get(), tensor_ops ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));

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
        perf, "forward convolution", problem, tensor_ops,
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
        perf, "backward-data convolution", problem, tensor_ops,
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
        perf, "backward-filter convolution", problem, tensor_ops,
        [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t& bytes) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, plan->x.get(), plan->y.get(), plan->conv.get(),
                                                                plan->w.get(), algo, &bytes) == CUDNN_STATUS_SUCCESS;
        },
        plan->bwd_filter, plan->bwd_filter_ws);
  }
  return plan;
}

const ConvPlan& conv_plan(const Tensor& x, const Tensor& w, const Window2d& win, int64_t groups, int64_t oh, int64_t ow,
                          ConvMath math) {
  check_numel(x, "conv2d input");
  const int device = x.device().index;
  static auto* cache = new PlanCache<19, ConvPlan>;  // leaked on purpose, as every plan cache here (matmul.cu)
  const PlanCache<19, ConvPlan>::Key key{device,
                                         is_f64(x),
                                         x.dim(0),
                                         x.dim(1),
                                         x.dim(2),
                                         x.dim(3),
                                         w.dim(0),
                                         w.dim(2),
                                         w.dim(3),
                                         win.sh,
                                         win.sw,
                                         win.ph,
                                         win.pw,
                                         win.dh,
                                         win.dw,
                                         groups,
                                         oh,
                                         ow,
                                         static_cast<int64_t>(math)};
  return cache->get(key, PlanFamily::conv, [&] { return make_conv_plan(device, x, w, win, groups, oh, ow, math); });
}

// An operand as a plan's cuDNN call reads it: the tensor itself, or its 16-bit copy under a half plan — for the
// weight the scope's copy (half_weight: made by the first of the step's forward and backward calls that reads it),
// for x and dy one in scratch for this call.
class ConvOperand {
 public:
  ConvOperand(const Tensor& t, std::optional<HalfFormat> half, bool weight = false) : m_ptr(t.raw()) {
    if (half && weight)
      m_ptr = cuda::half_weight(t, *half);
    else if (half)
      m_ptr = m_copy.emplace(t, *half).get();
  }
  const void* get() const { return m_ptr; }

 private:
  const void* m_ptr;
  std::optional<HalfOperand> m_copy;
};

// A result as a plan's cuDNN call writes it: into the tensor itself, or into 16-bit scratch that finish() widens into
// the tensor (t = scratch + beta·t).
class ConvResult {
 public:
  ConvResult(Tensor& t, std::optional<HalfFormat> half) : m_t(t), m_half(half) {
    if (half) m_copy.emplace(t.device().index, t.numel());
  }
  void* get() const { return m_copy ? m_copy->get() : m_t.raw(); }
  void finish(float beta) const {
    if (m_copy)
      half_to_f32(m_t.device().index, *m_half, m_copy->get(), static_cast<float*>(m_t.raw()), m_t.numel(), beta);
  }

 private:
  Tensor& m_t;
  std::optional<HalfFormat> m_half;
  std::optional<HalfBuffer> m_copy;
};

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win, int64_t groups, Tensor& y) {
  check_numel(y, "conv2d output");
  const int device = x.device().index;
  const ConvMath math = conv_math(x);
  const std::optional<HalfFormat> half = half_of(math);
  const ConvPlan& plan = conv_plan(x, w, win, groups, y.dim(2), y.dim(3), math);
  const bool f64 = is_f64(x);
  const HostScalar one(1.0, f64), zero(0.0, f64);  // float for 16-bit data too (f32 compute)
  const cudnnHandle_t handle = cudnn_handle(device);
  void* ws = plan.fwd_ws ? workspace(device, plan.fwd_ws) : nullptr;
  const ConvOperand xo(x, half), wo(w, half, true);
  const ConvResult yr(y, half);
  GT_CHECK_CUDNN(cudnnConvolutionForward(handle, one.ptr(), plan.x.get(), xo.get(), plan.w.get(), wo.get(),
                                         plan.conv.get(), plan.fwd, ws, plan.fwd_ws, zero.ptr(), plan.y.get(),
                                         yr.get()));
  yr.finish(0.0f);
  // y += b broadcast over (B, ·, oh, ow), in y's own type.
  if (b.defined())
    GT_CHECK_CUDNN(cudnnAddTensor(handle, one.ptr(), plan.bias.get(), b.raw(), one.ptr(), plan.y_of_tensor(), y.raw()));
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Window2d& win, int64_t groups,
                     Tensor& dx, Tensor& dw, Tensor& db, double beta) {
  check_numel(dy, "conv2d output gradient");
  const int device = x.device().index;
  const ConvMath math = conv_math(x);
  const std::optional<HalfFormat> half = half_of(math);
  const ConvPlan& plan = conv_plan(x, w, win, groups, dy.dim(2), dy.dim(3), math);
  const bool f64 = is_f64(x);
  const HostScalar one(1.0, f64), zero(0.0, f64), acc(beta, f64);
  const cudnnHandle_t handle = cudnn_handle(device);
  // One workspace request for both calls: they run one after the other on the stream.
  const size_t ws_bytes = std::max(dx.defined() ? plan.bwd_data_ws : 0, dw.defined() ? plan.bwd_filter_ws : 0);
  void* ws = ws_bytes ? workspace(device, ws_bytes) : nullptr;
  const ConvOperand dyo(dy, half), xo(x, half);
  if (dx.defined()) {
    const ConvOperand wo(w, half, true);
    const ConvResult dxr(dx, half);
    GT_CHECK_CUDNN(cudnnConvolutionBackwardData(handle, one.ptr(), plan.w.get(), wo.get(), plan.y.get(), dyo.get(),
                                                plan.conv.get(), plan.bwd_data, ws, plan.bwd_data_ws, zero.ptr(),
                                                plan.x.get(), dxr.get()));
    dxr.finish(0.0f);
  }
  // dw = ∂L/∂w + beta·dw: cuDNN's output blend (with beta = 0 the old dw is not read), or under a half plan the
  // widening's, which reads the f32 dw rather than a 16-bit copy of it. None for a frozen weight (train.freeze).
  if (dw.defined()) {
    const ConvResult dwr(dw, half);
    GT_CHECK_CUDNN(cudnnConvolutionBackwardFilter(handle, one.ptr(), plan.x.get(), xo.get(), plan.y.get(), dyo.get(),
                                                  plan.conv.get(), plan.bwd_filter, ws, plan.bwd_filter_ws,
                                                  half ? zero.ptr() : acc.ptr(), plan.w.get(), dwr.get()));
    dwr.finish(static_cast<float>(beta));
  }
  // db from the unrounded dy, in its own type.
  if (db.defined())
    GT_CHECK_CUDNN(cudnnConvolutionBackwardBias(handle, one.ptr(), plan.y_of_tensor(), dy.raw(), acc.ptr(),
                                                plan.bias.get(), db.raw()));
}

}  // namespace gt::cuda
