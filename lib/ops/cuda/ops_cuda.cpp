// Tensor entry points of the CUDA backend: pick the device, then call the launchers in launch.h.
#include "ops/cuda/ops_cuda.h"

#include <algorithm>
#include <vector>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/group.h"
#include "ops/cuda/launch.h"

namespace gt::cuda {

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  launch_activation_forward(stream(x.device().index), a, x.dtype() == DType::f64, x.raw(), y.raw(), x.numel());
}

void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  launch_activation_backward(stream(x.device().index), a, x.dtype() == DType::f64, x.raw(), y.raw(), dy.raw(), dx.raw(),
                             x.numel());
}

namespace {

// Opaque pointer of an optional tensor: null when it is undefined.
void* raw_or_null(const Tensor& t) { return t.defined() ? t.raw() : nullptr; }

// The kernels take f32 or f64 (like the CPU's for_float_type); says whether it is f64.
bool is_f64(const char* op, const Tensor& t) {
  GT_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, "{} on CUDA takes f32 or f64 tensors, got {}", op,
           dtype_name(t.dtype()));
  return t.dtype() == DType::f64;
}

}  // namespace

void add_row_bias(Tensor& y, const Tensor& bias) {
  launch_add_row_bias(stream(y.device().index), is_f64("add_row_bias", y), y.raw(), bias.raw(), y.dim(0), y.dim(1));
}

void sum_rows(const Tensor& dy, Tensor& db, double beta) {
  launch_sum_rows(stream(dy.device().index), is_f64("sum_rows", dy), dy.raw(), db.raw(), dy.dim(0), dy.dim(1), beta);
}

void sum_squares(const Tensor& grad, Tensor& out) {
  launch_sum_squares(stream(grad.device().index), is_f64("sum_squares", grad), grad.raw(), grad.numel(),
                     out.data<double>());
}

void scale_by(Tensor& x, const Tensor& scale) {
  launch_scale_by(stream(x.device().index), is_f64("scale_by", x), x.raw(), x.numel(), scale.data<double>());
}

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  launch_add(stream(y.device().index), is_f64("add", y), a.raw(), b.raw(), y.raw(), y.numel());
}

void copy_blocks(const Tensor& src, Tensor& dst, int64_t outer, int64_t src_inner, int64_t dst_inner,
                 int64_t dst_offset) {
  launch_strided_copy(stream(dst.device().index), dtype_size(src.dtype()), src.raw(), dst.raw(), outer, src_inner,
                      src_inner, 0, dst_inner, dst_offset);
}

void split_blocks(const Tensor& whole, Tensor& part, int64_t outer, int64_t part_inner, int64_t whole_inner,
                  int64_t offset) {
  launch_strided_copy(stream(part.device().index), dtype_size(whole.dtype()), whole.raw(), part.raw(), outer,
                      part_inner, whole_inner, offset, part_inner, 0);
}

void cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing, double scale, Tensor& dlogits,
                   Tensor& stats) {
  launch_cross_entropy(stream(logits.device().index), is_f64("cross_entropy", logits), logits.raw(),
                       labels.data<int32_t>(), logits.dim(0), logits.dim(1), label_smoothing, scale,
                       raw_or_null(dlogits), stats.data<double>());
}

void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats) {
  const int64_t batch = pred.dim(0), d = pred.numel() / std::max<int64_t>(batch, 1);
  launch_mse(stream(pred.device().index), is_f64("mse", pred), pred.raw(), target.raw(), batch, d, scale,
             raw_or_null(dpred), stats.data<double>());
}

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y) {
  const int64_t d = gamma.numel();
  launch_layernorm_forward(stream(x.device().index), is_f64("layernorm_forward", x), x.raw(), gamma.raw(), beta.raw(),
                           x.numel() / d, d, eps, save_mean.raw(), save_invstd.raw(), y.raw());
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta) {
  const int64_t d = gamma.numel();
  launch_layernorm_backward(stream(x.device().index), is_f64("layernorm_backward", x), x.raw(), gamma.raw(),
                            save_mean.raw(), save_invstd.raw(), dy.raw(), x.numel() / d, d, raw_or_null(dx),
                            dgamma.raw(), dbeta.raw(), beta);
}

void softmax_forward(const Tensor& x, int64_t d, Tensor& y) {
  launch_softmax_forward(stream(x.device().index), is_f64("softmax_forward", x), x.raw(), x.numel() / d, d, y.raw());
}

void softmax_backward(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx) {
  launch_softmax_backward(stream(y.device().index), is_f64("softmax_backward", y), y.raw(), dy.raw(), y.numel() / d, d,
                          dx.raw());
}

void dropout(const Tensor& x, double p, uint64_t key, uint64_t step, Tensor& y) {
  launch_dropout(stream(x.device().index), is_f64("dropout", x), x.raw(), p, key, step, y.raw(), x.numel());
}

void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y) {
  launch_embedding_forward(stream(weight.device().index), is_f64("embedding_forward", weight), idx.raw(), weight.raw(),
                           idx.numel(), weight.dim(0), weight.dim(1), y.raw());
}

void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta) {
  launch_embedding_backward(stream(dweight.device().index), is_f64("embedding_backward", dweight), idx.raw(), dy.raw(),
                            idx.numel(), dweight.dim(0), dweight.dim(1), dweight.raw(), beta);
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
    GT_CHECK_CUDA(
        cudaMemcpyAsync(t->view.chunks, chunks.data(), chunks.size() * sizeof(GroupChunk), cudaMemcpyHostToDevice, s));
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
