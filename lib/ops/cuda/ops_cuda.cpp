// Tensor entry points of the CUDA backend: pick the device, then call the launchers in launch.h.
#include "ops/cuda/ops_cuda.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/group.h"
#include "ops/cuda/launch.h"

#include <vector>

namespace gt::cuda {

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  launch_activation_forward(stream(x.device().index), a, x.dtype() == DType::f64, x.raw(), y.raw(), x.numel());
}

void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  launch_activation_backward(stream(x.device().index), a, x.dtype() == DType::f64, x.raw(), y.raw(), dy.raw(), dx.raw(), x.numel());
}

void sgd_step(const SgdHyper& h, Tensor& param, const Tensor& grad, Tensor& momentum) {
  launch_sgd(stream(param.device().index), h, param.dtype() == DType::f64, param.raw(), grad.raw(), momentum.defined() ? momentum.raw() : nullptr,
             param.numel());
}

namespace {

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
  for (size_t r = 0; r < g.rows.size(); ++r) {
    for (const Tensor& x : g.rows[r]) ptrs.push_back(x.defined() ? x.raw() : nullptr);
    const int64_t n = g.rows[r][0].numel();
    for (int64_t b = 0; b < n; b += kGroupChunk)
      chunks.push_back({static_cast<int32_t>(r), b, std::min(n, b + kGroupChunk)});
  }
  t->view.num_chunks = static_cast<int64_t>(chunks.size());
  const cudaStream_t s = stream(t->device);
  GT_CHECK_CUDA(cudaMalloc(&t->view.ptrs, ptrs.size() * sizeof(void*)));
  GT_CHECK_CUDA(cudaMalloc(&t->view.chunks, std::max<size_t>(chunks.size(), 1) * sizeof(GroupChunk)));
  GT_CHECK_CUDA(cudaMemcpyAsync(t->view.ptrs, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice, s));
  if (!chunks.empty())
    GT_CHECK_CUDA(cudaMemcpyAsync(t->view.chunks, chunks.data(), chunks.size() * sizeof(GroupChunk),
                                  cudaMemcpyHostToDevice, s));
  GT_CHECK_CUDA(cudaStreamSynchronize(s));  // the host vectors go out of scope
  g.device_table = t;
  return *t;
}

}  // namespace

void sum_squares_group(ops::TensorGroup& g, size_t column, Tensor& out, Tensor& per_row) {
  const GroupTable& t = table_of(g);
  launch_sum_squares_group(stream(t.device), t, static_cast<int>(column), out.data<double>(),
                           per_row.defined() ? per_row.data<double>() : nullptr);
}

void sgd_step_group(const SgdHyper& h, ops::TensorGroup& g, const Tensor& stats, double max_norm) {
  const GroupTable& t = table_of(g);
  launch_sgd_group(stream(t.device), h, t, stats.data<double>(), max_norm);
}

void adam_step_group(const AdamHyper& h, bool amsgrad, ops::TensorGroup& g, const Tensor& stats, double max_norm) {
  const GroupTable& t = table_of(g);
  launch_adam_group(stream(t.device), h, amsgrad, t, stats.data<double>(), max_norm);
}

void accumulate_step(const Tensor& stats, Tensor& window) {
  launch_accumulate_step(stream(stats.device().index), stats.data<double>(), window.data<double>());
}

}  // namespace gt::cuda
