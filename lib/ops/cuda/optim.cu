// CUDA optimizer ops (ops/optim.h): the gradient sums and scaling, and fused multi-tensor kernels over a TensorGroup
// (the gradient norm, the SGD and Adam updates gated by the step's statistics and clipped on the fly, the window
// accumulation): one launch per optimizer step however many parameters the model has. The per-element math is
// ops/math.h's, shared with the CPU; sums accumulate in double.
#include "ops/optim.h"

#include "core/noncopyable.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kThreads = 256;

// out[0] += Σ g² (f64), the blocks' sums added in block order (the same bits on every run). At most
// ReduceScratch::kBlocks blocks, enough to keep an H200 busy.
template <class T>
__global__ void sum_squares_kernel(const T* __restrict__ g, int64_t n, double* out, ReduceScratch scratch) {
  double acc = 0;
  for (int64_t i = global_index(); i < n; i += grid_stride()) acc += static_cast<double>(g[i]) * g[i];
  const double sums[1] = {block_sum(acc)};
  add_in_block_order(sums, out, scratch);
}

// x ← x · scale[0]; the scale stays on the device, so nothing waits for the host.
template <class T>
__global__ void scale_by_kernel(T* __restrict__ x, int64_t n, const double* __restrict__ scale) {
  const double k = *scale;
  for (int64_t i = global_index(); i < n; i += grid_stride()) x[i] = store<T>(load(x[i]) * k);
}

/// A slice of one row's elements that one thread block updates, and the row's parameter group.
struct GroupChunk {
  int32_t row, group;
  int64_t begin, end;
};

/// The groups' rates as a kernel argument (by value: no copy to the device per step).
struct RateTable {
  ops::GroupRate rate[ops::kMaxGroupRates];
};

// Group g's rate from the device block (graph mode) or the argument. The argument's entry is picked by a loop over
// constant indices, which reads the kernel's parameter space directly (an indexed read would copy the table into
// each thread's local memory first).
__device__ __forceinline__ ops::GroupRate group_rate(const RateTable& arg, const ops::GroupRate* on_device, int32_t g) {
  if (on_device) return on_device[g];
  ops::GroupRate r = arg.rate[0];
#pragma unroll
  for (int k = 1; k < static_cast<int>(ops::kMaxGroupRates); ++k)
    if (k == g) r = arg.rate[k];
  return r;
}

/// The table the kernels take by value: device arrays ptrs[row * width + col] (null for an undefined tensor) and
/// chunks[] (each row's in order, row after row: row r's are chunks[row_first[r] .. row_first[r + 1])), and the
/// scratch of the sums of squares: one per chunk and the ticket that tells the last block.
struct GroupView {
  void** ptrs = nullptr;
  GroupChunk* chunks = nullptr;
  int64_t* row_first = nullptr;
  double* chunk_sums = nullptr;
  unsigned int* ticket = nullptr;
  int32_t width = 0, rows = 0;
  int64_t num_chunks = 0;
  bool is_double = false;
};

/// Owns a GroupView's device arrays (made once per group by table_of, below).
struct GroupTable : NonCopyable {
  GroupView view;
  int device = 0;
  GroupTable() = default;
  ~GroupTable();
};

/// Elements per chunk: large enough to amortise a block's start, small enough to spread a big row over many SMs.
inline constexpr int64_t kGroupChunk = 1 << 16;

int group_grid(const GroupTable& t) { return static_cast<int>(std::min<int64_t>(t.view.num_chunks, 65535)); }

// Whether the step may update (loss and gradient norm finite), and the clip coefficient (1 when not clipping).
__device__ bool step_ok(const double* stats) { return isfinite(stats[kLossSum]) && isfinite(stats[kGradSq]); }
__device__ double clip_coef(const double* stats, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (sqrt(stats[kGradSq]) + 1e-6);
  return c < 1.0 ? c : 1.0;
}

// One chunk at a time per block (the loop bound is the same for every thread of the block, so the barriers are
// safe), each chunk's sum stored in t.chunk_sums; the last block to finish adds them up in chunk order, row by row,
// into each row's entry and the total — the same bits on every run (atomicAdd from each block would add them in the
// order the blocks finish).
template <class T>
__global__ void sum_squares_group_kernel(GroupView t, int column, double* out, double* per_row) {
  __shared__ double partial[kThreads];
  __shared__ bool last;
  for (int64_t c = blockIdx.x; c < t.num_chunks; c += gridDim.x) {
    const GroupChunk ch = t.chunks[c];
    const T* g = static_cast<const T*>(t.ptrs[ch.row * t.width + column]);
    double acc = 0;
    for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) acc += double(g[i]) * double(g[i]);
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = kThreads / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
      __syncthreads();
    }
    if (threadIdx.x == 0) t.chunk_sums[c] = partial[0];
    __syncthreads();  // partial[] is reused by the next chunk
  }
  if (threadIdx.x == 0) {
    __threadfence();  // this block's chunk sums are visible to every block before its ticket is
    last = atomicInc(t.ticket, gridDim.x - 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  double acc = 0;
  for (int r = static_cast<int>(threadIdx.x); r < t.rows; r += static_cast<int>(blockDim.x)) {
    double row = 0;
    for (int64_t c = t.row_first[r]; c < t.row_first[r + 1]; ++c) row += __ldcg(t.chunk_sums + c);
    if (per_row) per_row[r] += row;
    acc += row;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out += acc;
}

// On the device (graph mode) the block holds the hyperparameters at byte 0 and the rates at kHyperRatesOffset.
__device__ const ops::GroupRate* device_rates(const void* on_device) {
  return on_device
             ? reinterpret_cast<const ops::GroupRate*>(static_cast<const char*>(on_device) + ops::kHyperRatesOffset)
             : nullptr;
}

template <class T, bool kMomentum, bool kNesterov>
__global__ void sgd_group_kernel(SgdHyper arg, RateTable rates, const SgdHyper* on_device, GroupView t,
                                 const double* stats, double max_norm) {
  if (!step_ok(stats)) return;
  SgdHyper h = on_device ? *on_device : arg;
  const ops::GroupRate* dr = device_rates(on_device);
  const double coef = clip_coef(stats, max_norm);
  for (int64_t c = blockIdx.x; c < t.num_chunks; c += gridDim.x) {
    const GroupChunk ch = t.chunks[c];
    const ops::GroupRate r = group_rate(rates, dr, ch.group);
    h.lr = r.lr;
    h.weight_decay = r.weight_decay;
    void** row = t.ptrs + ch.row * t.width;
    T* p = static_cast<T*>(row[0]);
    const T* g = static_cast<const T*>(row[1]);
    T* m = static_cast<T*>(row[2]);
    for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
      const T gi = coef < 1.0 ? static_cast<T>(g[i] * coef) : g[i];
      T unused = 0;
      sgd_update<T, kMomentum, kNesterov>(h, p[i], gi, kMomentum ? m[i] : unused);
    }
  }
}

template <class T, bool kAmsgrad>
__global__ void adam_group_kernel(AdamHyper arg, RateTable rates, const AdamHyper* on_device, GroupView t,
                                  const double* stats, double max_norm) {
  if (!step_ok(stats)) return;
  AdamHyper h = on_device ? *on_device : arg;
  const ops::GroupRate* dr = device_rates(on_device);
  const double coef = clip_coef(stats, max_norm);
  for (int64_t c = blockIdx.x; c < t.num_chunks; c += gridDim.x) {
    const GroupChunk ch = t.chunks[c];
    const ops::GroupRate r = group_rate(rates, dr, ch.group);
    h.lr = r.lr;
    h.weight_decay = r.weight_decay;
    void** row = t.ptrs + ch.row * t.width;
    T* p = static_cast<T*>(row[0]);
    const T* g = static_cast<const T*>(row[1]);
    T* m = static_cast<T*>(row[2]);
    T* v = static_cast<T*>(row[3]);
    T* vmax = static_cast<T*>(row[4]);
    for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
      const T gi = coef < 1.0 ? static_cast<T>(g[i] * coef) : g[i];
      T unused = 0;
      adam_update<T, kAmsgrad>(h, p[i], gi, m[i], v[i], kAmsgrad ? vmax[i] : unused);
    }
  }
}

__global__ void accumulate_kernel(const double* stats, double* window) {
  if (isfinite(stats[kLossSum]) && isfinite(stats[kGradSq])) {
    window[0] += stats[kLossSum];
    window[1] += stats[kHits];
  } else {
    window[2] += 1;
  }
}

__global__ void loss_scale_kernel(const double* stats, double* state, LossScaleHyper h) {
  loss_scale_update(state, isfinite(stats[kLossSum]) && isfinite(stats[kGradSq]), h);
}

void launch_sum_squares(cudaStream_t s, ReduceScratch scratch, bool is_double, const void* g, int64_t n, double* out) {
  if (n == 0) return;
  with_float_type(is_double, [&](auto t) {
    using T = decltype(t);
    sum_squares_kernel<T>
        <<<grid_for(n, kThreads, ReduceScratch::kBlocks), kThreads, 0, s>>>(static_cast<const T*>(g), n, out, scratch);
  });
  GT_CHECK_LAUNCH();
}

// x may be 16-bit: the fp16 loss scale times the gradient of 16-bit logits (Model::set_activation_dtype), each
// element rounded once, as the CPU's f32 product rounded.
void launch_scale_by(cudaStream_t s, DType dtype, void* x, int64_t n, const double* scale) {
  if (n == 0) return;
  with_storage("scale_by", dtype, [&](auto t) {
    using T = decltype(t);
    scale_by_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(x), n, scale);
  });
  GT_CHECK_LAUNCH();
}

GroupTable::~GroupTable() {
  // cudaFree waits for queued kernels that may still read the table. Errors at teardown are not reported.
  if (cudaSetDevice(device) != cudaSuccess) return;
  cudaFree(view.ptrs);
  cudaFree(view.chunks);
  cudaFree(view.row_first);
  cudaFree(view.chunk_sums);
  cudaFree(view.ticket);
}

// per_row may be null.
void launch_sum_squares_group(cudaStream_t s, const GroupTable& t, int column, double* out, double* per_row) {
  if (t.view.num_chunks == 0) return;
  if (t.view.is_double)
    sum_squares_group_kernel<double><<<group_grid(t), kThreads, 0, s>>>(t.view, column, out, per_row);
  else
    sum_squares_group_kernel<float><<<group_grid(t), kThreads, 0, s>>>(t.view, column, out, per_row);
  GT_CHECK_LAUNCH();
}

// `dh`: the hyperparameters in device memory (graph mode), or null; h's flags pick the kernel either way (they do not
// change between steps).
void launch_sgd_group(cudaStream_t s, const SgdHyper& h, const RateTable& rates, const SgdHyper* dh,
                      const GroupTable& t, const double* stats, double max_norm) {
  if (t.view.num_chunks == 0) return;
  const bool momentum = h.momentum != 0;
  auto go = [&](auto zero) {
    using T = decltype(zero);
    if (!momentum)
      sgd_group_kernel<T, false, false><<<group_grid(t), kThreads, 0, s>>>(h, rates, dh, t.view, stats, max_norm);
    else if (h.nesterov)
      sgd_group_kernel<T, true, true><<<group_grid(t), kThreads, 0, s>>>(h, rates, dh, t.view, stats, max_norm);
    else
      sgd_group_kernel<T, true, false><<<group_grid(t), kThreads, 0, s>>>(h, rates, dh, t.view, stats, max_norm);
  };
  if (t.view.is_double)
    go(double{});
  else
    go(float{});
  GT_CHECK_LAUNCH();
}

void launch_adam_group(cudaStream_t s, const AdamHyper& h, const RateTable& rates, const AdamHyper* dh, bool amsgrad,
                       const GroupTable& t, const double* stats, double max_norm) {
  if (t.view.num_chunks == 0) return;
  auto go = [&](auto zero) {
    using T = decltype(zero);
    if (amsgrad)
      adam_group_kernel<T, true><<<group_grid(t), kThreads, 0, s>>>(h, rates, dh, t.view, stats, max_norm);
    else
      adam_group_kernel<T, false><<<group_grid(t), kThreads, 0, s>>>(h, rates, dh, t.view, stats, max_norm);
  };
  if (t.view.is_double)
    go(double{});
  else
    go(float{});
  GT_CHECK_LAUNCH();
}

void launch_accumulate_step(cudaStream_t s, const double* stats, double* window) {
  accumulate_kernel<<<1, 1, 0, s>>>(stats, window);
  GT_CHECK_LAUNCH();
}

// The group's device table, made on first use: the tensors of a group never move, so neither do their pointers.
const GroupTable& table_of(ops::TensorGroup& g) {
  if (g.device_table) return *static_cast<const GroupTable*>(g.device_table.get());
  const Tensor& first = g.rows.at(0).at(0);
  auto t = std::make_shared<GroupTable>();
  t->device = first.device().index;
  t->view.width = static_cast<int32_t>(g.rows[0].size());
  t->view.rows = static_cast<int32_t>(g.rows.size());
  t->view.is_double = first.dtype() == DType::f64;
  std::vector<void*> ptrs;
  std::vector<GroupChunk> chunks;
  std::vector<int64_t> row_first;
  for (size_t r = 0; r < g.rows.size(); ++r) {
    for (const Tensor& x : g.rows[r]) ptrs.push_back(x.defined() ? x.raw() : nullptr);
    row_first.push_back(static_cast<int64_t>(chunks.size()));
    const int64_t n = g.rows[r][0].numel();
    const int32_t group = g.row_group.empty() ? 0 : g.row_group[r];
    for (int64_t b = 0; b < n; b += kGroupChunk)
      chunks.push_back({static_cast<int32_t>(r), group, b, std::min(n, b + kGroupChunk)});
  }
  row_first.push_back(static_cast<int64_t>(chunks.size()));
  t->view.num_chunks = static_cast<int64_t>(chunks.size());
  const cudaStream_t s = stream(t->device);
  GT_CHECK_CUDA(cudaMalloc(&t->view.ptrs, ptrs.size() * sizeof(void*)));
  GT_CHECK_CUDA(cudaMalloc(&t->view.chunks, std::max<size_t>(chunks.size(), 1) * sizeof(GroupChunk)));
  GT_CHECK_CUDA(cudaMalloc(&t->view.row_first, row_first.size() * sizeof(int64_t)));
  GT_CHECK_CUDA(cudaMalloc(&t->view.chunk_sums, std::max<size_t>(chunks.size(), 1) * sizeof(double)));
  GT_CHECK_CUDA(cudaMalloc(&t->view.ticket, sizeof(unsigned int)));
  GT_CHECK_CUDA(cudaMemsetAsync(t->view.ticket, 0, sizeof(unsigned int), s));
  GT_CHECK_CUDA(cudaMemcpyAsync(t->view.row_first, row_first.data(), row_first.size() * sizeof(int64_t),
                                cudaMemcpyHostToDevice, s));
  GT_CHECK_CUDA(cudaMemcpyAsync(t->view.ptrs, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice, s));
  if (!chunks.empty())
    GT_CHECK_CUDA(
        cudaMemcpyAsync(t->view.chunks, chunks.data(), chunks.size() * sizeof(GroupChunk), cudaMemcpyHostToDevice, s));
  GT_CHECK_CUDA(cudaStreamSynchronize(s));  // the host vectors go out of scope
  g.device_table = t;
  return *t;
}

}  // namespace

void sum_squares(const Tensor& grad, Tensor& out) {
  const int device = grad.device().index;
  launch_sum_squares(stream(device), reduce_scratch(device), is_f64("sum_squares", grad), grad.raw(), grad.numel(),
                     out.data<double>());
}

void scale_by(Tensor& x, const Tensor& scale) {
  launch_scale_by(stream(x.device().index), x.dtype(), x.raw(), x.numel(), scale.data<double>());
}

void sum_squares_group(ops::TensorGroup& g, size_t column, Tensor& out, Tensor& per_row) {
  const GroupTable& t = table_of(g);
  launch_sum_squares_group(stream(t.device), t, static_cast<int>(column), out.data<double>(),
                           per_row.defined() ? per_row.data<double>() : nullptr);
}

namespace {

// The kernels' rate table: `rates`, or h's own rate for group 0 when there are none.
template <class Hyper>
RateTable rate_table(const Hyper& h, std::span<const ops::GroupRate> rates) {
  RateTable out{};
  out.rate[0] = {h.lr, h.weight_decay};
  std::copy(rates.begin(), rates.end(), out.rate);
  return out;
}

}  // namespace

void sgd_step_group(const SgdHyper& h, ops::TensorGroup& g, const Tensor& stats, double max_norm,
                    std::span<const ops::GroupRate> rates) {
  const GroupTable& t = table_of(g);
  const auto* dh = g.hyper.defined() ? static_cast<const SgdHyper*>(g.hyper.raw()) : nullptr;
  launch_sgd_group(stream(t.device), h, rate_table(h, rates), dh, t, stats.data<double>(), max_norm);
}

void adam_step_group(const AdamHyper& h, bool amsgrad, ops::TensorGroup& g, const Tensor& stats, double max_norm,
                     std::span<const ops::GroupRate> rates) {
  const GroupTable& t = table_of(g);
  const auto* dh = g.hyper.defined() ? static_cast<const AdamHyper*>(g.hyper.raw()) : nullptr;
  launch_adam_group(stream(t.device), h, rate_table(h, rates), dh, amsgrad, t, stats.data<double>(), max_norm);
}

void accumulate_step(const Tensor& stats, Tensor& window) {
  launch_accumulate_step(stream(stats.device().index), stats.data<double>(), window.data<double>());
}

void update_loss_scale(const Tensor& stats, Tensor& state, const LossScaleHyper& h) {
  loss_scale_kernel<<<1, 1, 0, stream(stats.device().index)>>>(stats.data<double>(), state.data<double>(), h);
  GT_CHECK_LAUNCH();
}

}  // namespace gt::cuda
