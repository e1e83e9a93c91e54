// Op contracts (shapes, dtypes, devices) and dispatch to the backend that owns the tensors.
#include "ops/ops.h"

#include "ops/cpu/ops_cpu.h"
#if GT_WITH_CUDA
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/dnn.h"
#endif

#include <cmath>
#include <initializer_list>

// Names the CUDA twin of an op in builds that have one; compiles to nothing in builds that do not.
#if GT_WITH_CUDA
#define GT_CUDA_CALL(expr) ::gt::cuda::expr
#else
#define GT_CUDA_CALL(expr) (void)0
#endif

namespace gt::ops {
namespace {

// All operands of an op live on one device; returns it. Undefined (optional) tensors are skipped.
Device common_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first)
      first = t;
    else if (!(t->device() == first->device()))
      throw Error(fmt::format("{}: operands on {} and {}", op, first->device().str(), t->device().str()));
  }
  return first ? first->device() : Device::cpu();
}

void same_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first)
      first = t;
    else
      GT_CHECK(t->dtype() == first->dtype(), "{}: operands of {} and {}", op, dtype_name(first->dtype()),
               dtype_name(t->dtype()));
  }
}

// Runs the CPU kernel or the CUDA one; a build without CUDA reports that for a CUDA tensor.
template <class Cpu, class Cuda> void dispatch([[maybe_unused]] const char* op, Device d, Cpu&& cpu_fn, [[maybe_unused]] Cuda&& cuda_fn) {
  if (d.is_cpu()) {
    cpu_fn();
    return;
  }
#if GT_WITH_CUDA
  cuda_fn();
#else
  throw Error(fmt::format("{} on {}: this gputrain was built without the CUDA backend", op, d.str()));
#endif
}

}  // namespace

void matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta) {
  same_dtype("matmul", {&a, &b, &c});
  GT_CHECK(a.rank() == 2 && b.rank() == 2 && c.rank() == 2, "matmul wants 2-D operands");
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const int64_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  GT_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, "matmul {}{} · {}{} → {}", a.shape().str(), ta ? "ᵀ" : "",
           b.shape().str(), tb ? "ᵀ" : "", c.shape().str());
  dispatch("matmul", common_device("matmul", {&a, &b, &c}), [&] { cpu::matmul(a, ta, b, tb, c, beta); },
           [&] { GT_CUDA_CALL(matmul(a, ta, b, tb, c, beta)); });
}

void add_row_bias(Tensor& y, const Tensor& bias) {
  same_dtype("add_row_bias", {&y, &bias});
  GT_CHECK(y.rank() == 2 && bias.numel() == y.dim(1), "bias {} for {}", bias.shape().str(), y.shape().str());
  dispatch("add_row_bias", common_device("add_row_bias", {&y, &bias}), [&] { cpu::add_row_bias(y, bias); },
           [&] { GT_CUDA_CALL(add_row_bias(y, bias)); });
}

void sum_rows(const Tensor& dy, Tensor& db, double beta) {
  same_dtype("sum_rows", {&dy, &db});
  GT_CHECK(dy.rank() == 2 && db.numel() == dy.dim(1), "sum_rows {} into {}", dy.shape().str(), db.shape().str());
  dispatch("sum_rows", common_device("sum_rows", {&dy, &db}), [&] { cpu::sum_rows(dy, db, beta); },
           [&] { GT_CUDA_CALL(sum_rows(dy, db, beta)); });
}

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  same_dtype("activation", {&x, &y});
  GT_CHECK(x.numel() == y.numel(), "activation {} → {}", x.shape().str(), y.shape().str());
  dispatch("activation", common_device("activation", {&x, &y}), [&] { cpu::activation_forward(a, x, y); },
           [&] { GT_CUDA_CALL(activation_forward(a, x, y)); });
}

void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  same_dtype("activation_backward", {&x, &y, &dy, &dx});
  GT_CHECK(x.numel() == y.numel() && dy.numel() == x.numel() && dx.numel() == x.numel(), "activation_backward sizes");
  dispatch("activation_backward", common_device("activation_backward", {&x, &y, &dy, &dx}),
           [&] { cpu::activation_backward(a, x, y, dy, dx); }, [&] { GT_CUDA_CALL(activation_backward(a, x, y, dy, dx)); });
}

void cross_entropy(const Tensor& logits, const Tensor& labels, double eps, double scale, Tensor& dlogits,
                   Tensor& stats) {
  same_dtype("cross_entropy", {&logits, &dlogits});
  GT_CHECK(logits.rank() == 2 && labels.dtype() == DType::i32 && labels.numel() == logits.dim(0),
           "cross_entropy logits {} labels {}", logits.shape().str(), labels.shape().str());
  GT_CHECK(!dlogits.defined() || dlogits.shape() == logits.shape(), "dlogits shape");
  GT_CHECK(stats.dtype() == DType::f64 && stats.numel() >= 2, "stats must be f64[2]");
  dispatch("cross_entropy", common_device("cross_entropy", {&logits, &labels, &dlogits, &stats}),
           [&] { cpu::cross_entropy(logits, labels, eps, scale, dlogits, stats); },
           [&] { GT_CUDA_CALL(cross_entropy(logits, labels, eps, scale, dlogits, stats)); });
}

void mse(const Tensor& pred, const Tensor& target, double scale, Tensor& dpred, Tensor& stats) {
  same_dtype("mse", {&pred, &target, &dpred});
  GT_CHECK(pred.numel() == target.numel() && pred.rank() >= 1, "mse pred {} target {}", pred.shape().str(),
           target.shape().str());
  GT_CHECK(!dpred.defined() || dpred.numel() == pred.numel(), "dpred shape");
  GT_CHECK(stats.dtype() == DType::f64 && stats.numel() >= 2, "stats must be f64[2]");
  dispatch("mse", common_device("mse", {&pred, &target, &dpred, &stats}),
           [&] { cpu::mse(pred, target, scale, dpred, stats); },
           [&] { GT_CUDA_CALL(mse(pred, target, scale, dpred, stats)); });
}

namespace {

// Every row of a group has `width` entries (the optional last one may be undefined) on one device.
Device group_device(const char* op, const TensorGroup& g, size_t width) {
  GT_CHECK(!g.rows.empty(), "{}: empty group", op);
  const Device d = g.rows[0][0].device();
  for (const auto& row : g.rows) {
    GT_CHECK(row.size() == width, "{}: rows of {} tensors, expected {}", op, row.size(), width);
    for (const Tensor& t : row) {
      if (!t.defined()) continue;
      GT_CHECK(t.device() == d, "{}: operands on {} and {}", op, d.str(), t.device().str());
      GT_CHECK(t.numel() == row[0].numel() && t.dtype() == row[0].dtype(), "{}: row of mixed sizes or dtypes", op);
      // The CUDA kernels read every row with the element type of the first.
      GT_CHECK(t.dtype() == g.rows[0][0].dtype(), "{}: rows of {} and {}", op, dtype_name(g.rows[0][0].dtype()),
               dtype_name(t.dtype()));
    }
  }
  return d;
}

void check_stats(const char* op, const Tensor& stats, Device d) {
  GT_CHECK(stats.dtype() == DType::f64 && stats.numel() >= kStepStats && stats.device() == d,
           "{}: step statistics must be f64[{}] on {}", op, static_cast<int64_t>(kStepStats), d.str());
}

// The CPU side of the gate and the clip: the statistics are host memory there.
bool cpu_step_ok(const Tensor& stats) {
  const double* s = stats.data<double>();
  return std::isfinite(s[kLossSum]) && std::isfinite(s[kGradSq]);
}

// Scales the CPU gradients (column 1) by the clip coefficient when it is below 1, as clip_grad_norm_ does.
void cpu_clip(TensorGroup& g, const Tensor& stats, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (std::sqrt(stats.data<double>()[kGradSq]) + 1e-6);
  if (coef >= 1) return;
  Tensor k = Tensor::empty(Shape{1}, DType::f64);
  k.data<double>()[0] = coef;
  for (auto& row : g.rows) cpu::scale_by(row[1], k);
}

}  // namespace

void sum_squares_group(TensorGroup& g, size_t column, Tensor& out, Tensor& per_row) {
  GT_CHECK(out.dtype() == DType::f64 && out.numel() >= 1, "sum_squares_group accumulates into f64");
  GT_CHECK(!per_row.defined() || (per_row.dtype() == DType::f64 && per_row.numel() >= static_cast<int64_t>(g.rows.size())),
           "sum_squares_group: per_row must be f64[{}]", g.rows.size());
  const Device d = common_device("sum_squares_group", {&g.rows.at(0).at(column), &out, &per_row});
  for (const auto& row : g.rows) GT_CHECK(row.at(column).device() == d, "sum_squares_group: mixed devices");
  dispatch("sum_squares_group", d,
           [&] {
             Tensor one = Tensor::empty(Shape{1}, DType::f64);
             for (size_t r = 0; r < g.rows.size(); ++r) {
               one.data<double>()[0] = 0;
               cpu::sum_squares(g.rows[r][column], one);
               out.data<double>()[0] += one.data<double>()[0];
               if (per_row.defined()) per_row.data<double>()[r] += one.data<double>()[0];
             }
           },
           [&] { GT_CUDA_CALL(sum_squares_group(g, column, out, per_row)); });
}

void sgd_step_group(const SgdHyper& h, TensorGroup& g, const Tensor& stats, double max_norm) {
  const Device d = group_device("sgd_step_group", g, 3);
  check_stats("sgd_step_group", stats, d);
  // The CUDA kernel picks the momentum update from h.momentum (as torch.optim.SGD does) and the CPU from the buffer,
  // so the two must agree: a buffer exactly when momentum is on (the Sgd optimizer makes them so).
  for (const auto& row : g.rows)
    GT_CHECK(row[2].defined() == (h.momentum != 0), "sgd_step_group: a momentum buffer per row iff momentum != 0");
  dispatch("sgd_step_group", d,
           [&] {
             if (!cpu_step_ok(stats)) return;
             cpu_clip(g, stats, max_norm);
             for (auto& row : g.rows) cpu::sgd_step(h, row[0], row[1], row[2]);
           },
           [&] { GT_CUDA_CALL(sgd_step_group(h, g, stats, max_norm)); });
}

void adam_step_group(const AdamHyper& h, bool amsgrad, TensorGroup& g, const Tensor& stats, double max_norm) {
  const Device d = group_device("adam_step_group", g, 5);
  check_stats("adam_step_group", stats, d);
  for (const auto& row : g.rows)
    GT_CHECK(!amsgrad || row[4].defined(), "adam_step_group: amsgrad needs the vmax column");
  dispatch("adam_step_group", d,
           [&] {
             if (!cpu_step_ok(stats)) return;
             cpu_clip(g, stats, max_norm);
             for (auto& row : g.rows) cpu::adam_step(h, amsgrad, row[0], row[1], row[2], row[3], row[4]);
           },
           [&] { GT_CUDA_CALL(adam_step_group(h, amsgrad, g, stats, max_norm)); });
}

void accumulate_step(const Tensor& stats, Tensor& window) {
  const Device d = common_device("accumulate_step", {&stats, &window});
  check_stats("accumulate_step", stats, d);
  GT_CHECK(window.dtype() == DType::f64 && window.numel() >= 3, "accumulate_step: window must be f64[3]");
  dispatch("accumulate_step", d,
           [&] {
             double* w = window.data<double>();
             if (cpu_step_ok(stats)) {
               w[0] += stats.data<double>()[kLossSum];
               w[1] += stats.data<double>()[kHits];
             } else {
               w[2] += 1;
             }
           },
           [&] { GT_CUDA_CALL(accumulate_step(stats, window)); });
}

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win, int64_t groups, Tensor& y) {
  same_dtype("conv2d", {&x, &w, &b, &y});
  GT_CHECK(x.rank() == 4 && w.rank() == 4 && y.rank() == 4, "conv2d wants 4-D x, w, y");
  GT_CHECK(x.dim(1) == w.dim(1) * groups && y.dim(1) == w.dim(0) && y.dim(0) == x.dim(0) &&
               y.dim(2) == window_out(x.dim(2), win.kh, win.sh, win.ph, win.dh) &&
               y.dim(3) == window_out(x.dim(3), win.kw, win.sw, win.pw, win.dw),
           "conv2d x {} w {} → y {}", x.shape().str(), w.shape().str(), y.shape().str());
  dispatch("conv2d", common_device("conv2d", {&x, &w, &b, &y}), [&] { cpu::conv2d_forward(x, w, b, win, groups, y); },
           [&] { GT_CUDA_CALL(conv2d_forward(x, w, b, win, groups, y)); });
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Window2d& win, int64_t groups,
                     Tensor& dx, Tensor& dw, Tensor& db, double beta) {
  same_dtype("conv2d_backward", {&x, &w, &dy, &dx, &dw, &db});
  GT_CHECK(dw.shape() == w.shape() && (!dx.defined() || dx.shape() == x.shape()), "conv2d_backward shapes");
  dispatch("conv2d_backward", common_device("conv2d_backward", {&x, &w, &dy, &dx, &dw, &db}),
           [&] { cpu::conv2d_backward(x, w, dy, win, groups, dx, dw, db, beta); },
           [&] { GT_CUDA_CALL(conv2d_backward(x, w, dy, win, groups, dx, dw, db, beta)); });
}

void pool2d_forward(PoolKind kind, const Tensor& x, const Window2d& win, Tensor& y) {
  same_dtype("pool2d", {&x, &y});
  GT_CHECK(x.rank() == 4 && y.rank() == 4 && y.dim(0) == x.dim(0) && y.dim(1) == x.dim(1), "pool2d shapes");
  dispatch("pool2d", common_device("pool2d", {&x, &y}), [&] { cpu::pool2d_forward(kind, x, win, y); },
           [&] { GT_CUDA_CALL(pool2d_forward(kind, x, win, y)); });
}

void pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Window2d& win, Tensor& dx) {
  same_dtype("pool2d_backward", {&x, &dy, &dx});
  GT_CHECK(dx.shape() == x.shape(), "pool2d_backward shapes");
  dispatch("pool2d_backward", common_device("pool2d_backward", {&x, &dy, &dx}),
           [&] { cpu::pool2d_backward(kind, x, dy, win, dx); }, [&] { GT_CUDA_CALL(pool2d_backward(kind, x, dy, win, dx)); });
}

void sum_squares(const Tensor& grad, Tensor& out) {
  GT_CHECK(out.dtype() == DType::f64 && out.numel() >= 1, "sum_squares accumulates into f64");
  dispatch("sum_squares", common_device("sum_squares", {&grad, &out}), [&] { cpu::sum_squares(grad, out); },
           [&] { GT_CUDA_CALL(sum_squares(grad, out)); });
}

void scale_by(Tensor& x, const Tensor& scale) {
  GT_CHECK(scale.dtype() == DType::f64 && scale.numel() >= 1, "scale_by takes an f64 scale");
  dispatch("scale_by", common_device("scale_by", {&x, &scale}), [&] { cpu::scale_by(x, scale); },
           [&] { GT_CUDA_CALL(scale_by(x, scale)); });
}

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  same_dtype("add", {&a, &b, &y});
  GT_CHECK(a.numel() == y.numel() && b.numel() == y.numel(), "add {} + {} → {}", a.shape().str(), b.shape().str(),
           y.shape().str());
  dispatch("add", common_device("add", {&a, &b, &y}), [&] { cpu::add(a, b, y); }, [&] { GT_CUDA_CALL(add(a, b, y)); });
}

void copy_blocks(const Tensor& src, Tensor& dst, int64_t outer, int64_t src_inner, int64_t dst_inner,
                 int64_t dst_offset) {
  same_dtype("copy_blocks", {&src, &dst});
  GT_CHECK(src.numel() == outer * src_inner && dst.numel() == outer * dst_inner && dst_offset + src_inner <= dst_inner,
           "copy_blocks sizes");
  dispatch("copy_blocks", common_device("copy_blocks", {&src, &dst}),
           [&] { cpu::copy_blocks(src, dst, outer, src_inner, dst_inner, dst_offset); },
           [&] { GT_CUDA_CALL(copy_blocks(src, dst, outer, src_inner, dst_inner, dst_offset)); });
}

void split_blocks(const Tensor& whole, Tensor& part, int64_t outer, int64_t part_inner, int64_t whole_inner,
                  int64_t offset) {
  same_dtype("split_blocks", {&whole, &part});
  GT_CHECK(part.numel() == outer * part_inner && whole.numel() == outer * whole_inner && offset + part_inner <= whole_inner,
           "split_blocks sizes");
  dispatch("split_blocks", common_device("split_blocks", {&whole, &part}),
           [&] { cpu::split_blocks(whole, part, outer, part_inner, whole_inner, offset); },
           [&] { GT_CUDA_CALL(split_blocks(whole, part, outer, part_inner, whole_inner, offset)); });
}

void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y) {
  same_dtype("batchnorm", {&x, &gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd, &y});
  GT_CHECK(x.rank() >= 2 && x.dim(1) == gamma.numel() && y.numel() == x.numel(), "batchnorm x {} gamma {}",
           x.shape().str(), gamma.shape().str());
  dispatch("batchnorm",
           common_device("batchnorm", {&x, &gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd, &y}),
           [&] {
             cpu::batchnorm_forward(x, gamma, beta, running_mean, running_var, momentum, eps, training, save_mean,
                                    save_invstd, y);
           },
           [&] {
             GT_CUDA_CALL(batchnorm_forward(x, gamma, beta, running_mean, running_var, momentum, eps, training,
                                            save_mean, save_invstd, y));
           });
}

void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta) {
  same_dtype("batchnorm_backward", {&x, &gamma, &dy, &dx, &dgamma, &dbeta});
  GT_CHECK(dy.numel() == x.numel() && (!dx.defined() || dx.numel() == x.numel()), "batchnorm_backward sizes");
  dispatch("batchnorm_backward",
           common_device("batchnorm_backward", {&x, &gamma, &save_mean, &save_invstd, &dy, &dx, &dgamma, &dbeta}),
           [&] { cpu::batchnorm_backward(x, gamma, save_mean, save_invstd, dy, training, dx, dgamma, dbeta, beta); },
           [&] {
             GT_CUDA_CALL(batchnorm_backward(x, gamma, save_mean, save_invstd, dy, training, dx, dgamma, dbeta, beta));
           });
}

int64_t batchnorm_forward_sync(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                               Tensor& running_var, double momentum, double eps, Tensor& save_mean,
                               Tensor& save_invstd, Tensor& y, const SumOverRanks& sum_over_ranks) {
  same_dtype("batchnorm_sync", {&x, &gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd, &y});
  GT_CHECK(x.rank() >= 2 && x.dim(1) == gamma.numel() && y.numel() == x.numel(), "batchnorm x {} gamma {}",
           x.shape().str(), gamma.shape().str());
  const Device d =
      common_device("batchnorm_sync", {&x, &gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd, &y});
  if (!d.is_cpu()) throw Error(fmt::format("dist.sync_batchnorm: synchronised batch norm on {} is not built", d.str()));
  return cpu::batchnorm_forward_sync(x, gamma, beta, running_mean, running_var, momentum, eps, save_mean, save_invstd,
                                     y, sum_over_ranks);
}

void batchnorm_backward_sync(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                             const Tensor& dy, int64_t global_count, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                             double beta, const SumOverRanks& sum_over_ranks) {
  same_dtype("batchnorm_sync_backward", {&x, &gamma, &dy, &dx, &dgamma, &dbeta});
  GT_CHECK(dy.numel() == x.numel() && (!dx.defined() || dx.numel() == x.numel()), "batchnorm_backward sizes");
  const Device d =
      common_device("batchnorm_sync_backward", {&x, &gamma, &save_mean, &save_invstd, &dy, &dx, &dgamma, &dbeta});
  if (!d.is_cpu()) throw Error(fmt::format("dist.sync_batchnorm: synchronised batch norm on {} is not built", d.str()));
  cpu::batchnorm_backward_sync(x, gamma, save_mean, save_invstd, dy, global_count, dx, dgamma, dbeta, beta,
                               sum_over_ranks);
}

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y) {
  same_dtype("layernorm", {&x, &gamma, &beta, &save_mean, &save_invstd, &y});
  GT_CHECK(gamma.numel() > 0 && x.numel() % gamma.numel() == 0 && beta.numel() == gamma.numel() &&
               y.numel() == x.numel() && save_mean.numel() >= x.numel() / gamma.numel() &&
               save_invstd.numel() >= x.numel() / gamma.numel(),
           "layernorm sizes: x {} gamma {} beta {} y {}", x.shape().str(), gamma.shape().str(), beta.shape().str(),
           y.shape().str());
  dispatch("layernorm", common_device("layernorm", {&x, &gamma, &beta, &save_mean, &save_invstd, &y}),
           [&] { cpu::layernorm_forward(x, gamma, beta, eps, save_mean, save_invstd, y); },
           [&] { GT_CUDA_CALL(layernorm_forward(x, gamma, beta, eps, save_mean, save_invstd, y)); });
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta) {
  same_dtype("layernorm_backward", {&x, &gamma, &dy, &dx, &dgamma, &dbeta});
  GT_CHECK(gamma.numel() > 0 && x.numel() % gamma.numel() == 0 && dy.numel() == x.numel() &&
               (!dx.defined() || dx.numel() == x.numel()) && dgamma.numel() == gamma.numel() &&
               dbeta.numel() == gamma.numel() && save_mean.numel() >= x.numel() / gamma.numel() &&
               save_invstd.numel() >= x.numel() / gamma.numel(),
           "layernorm_backward sizes: x {} gamma {} dy {}", x.shape().str(), gamma.shape().str(), dy.shape().str());
  dispatch("layernorm_backward",
           common_device("layernorm_backward", {&x, &gamma, &save_mean, &save_invstd, &dy, &dx, &dgamma, &dbeta}),
           [&] { cpu::layernorm_backward(x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta, beta); },
           [&] { GT_CUDA_CALL(layernorm_backward(x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta, beta)); });
}

void softmax_forward(const Tensor& x, int64_t d, Tensor& y) {
  same_dtype("softmax", {&x, &y});
  GT_CHECK(d > 0 && x.numel() % d == 0 && y.numel() == x.numel(), "softmax sizes");
  dispatch("softmax", common_device("softmax", {&x, &y}), [&] { cpu::softmax_forward(x, d, y); },
           [&] { GT_CUDA_CALL(softmax_forward(x, d, y)); });
}

void softmax_backward(const Tensor& y, const Tensor& dy, int64_t d, Tensor& dx) {
  same_dtype("softmax_backward", {&y, &dy, &dx});
  GT_CHECK(d > 0 && y.numel() % d == 0 && dy.numel() == y.numel() && dx.numel() == y.numel(),
           "softmax_backward sizes");
  dispatch("softmax_backward", common_device("softmax_backward", {&y, &dy, &dx}),
           [&] { cpu::softmax_backward(y, dy, d, dx); }, [&] { GT_CUDA_CALL(softmax_backward(y, dy, d, dx)); });
}

void dropout(const Tensor& x, double p, uint64_t key, uint64_t step, Tensor& y) {
  same_dtype("dropout", {&x, &y});
  GT_CHECK(x.numel() == y.numel() && p >= 0 && p < 1, "dropout sizes or p");
  dispatch("dropout", common_device("dropout", {&x, &y}), [&] { cpu::dropout(x, p, key, step, y); },
           [&] { GT_CUDA_CALL(dropout(x, p, key, step, y)); });
}

void embedding_forward(const Tensor& idx, const Tensor& weight, Tensor& y) {
  same_dtype("embedding", {&idx, &weight, &y});
  GT_CHECK(weight.rank() == 2 && y.numel() == idx.numel() * weight.dim(1), "embedding sizes");
  dispatch("embedding", common_device("embedding", {&idx, &weight, &y}),
           [&] { cpu::embedding_forward(idx, weight, y); }, [&] { GT_CUDA_CALL(embedding_forward(idx, weight, y)); });
}

void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& dweight, double beta) {
  same_dtype("embedding_backward", {&idx, &dy, &dweight});
  GT_CHECK(dweight.rank() == 2 && dy.numel() == idx.numel() * dweight.dim(1), "embedding_backward sizes");
  dispatch("embedding_backward", common_device("embedding_backward", {&idx, &dy, &dweight}),
           [&] { cpu::embedding_backward(idx, dy, dweight, beta); },
           [&] { GT_CUDA_CALL(embedding_backward(idx, dy, dweight, beta)); });
}

}  // namespace gt::ops
