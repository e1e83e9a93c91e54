// The contract of the matmul family (ops/matmul.h): shapes, dtypes and devices, then the backend's entry point.
#include "ops/matmul.h"

#include "ops/dispatch.h"
#include "ops/half_storage.h"
#include "ops/precision.h"
#include "ops/wide.h"

#include <algorithm>
#include <optional>

namespace gt::ops {
namespace {

// Whether the backend takes a call's 16-bit activations as they are (the CUDA products and bias kernels: cuBLASLt
// reads 16-bit operands and writes a 16-bit D, summing in f32). The 16-bit tensors of one call, activations `acts`
// and parameters `params` alike, share one format (checked here). They go natively on a CUDA device under the product
// precision of that format, with every parameter and every other activation f32; otherwise (the CPU, whose numbers
// stay those of its f32 ops; an fp32 or tf32 precision; a 16-bit parameter; an f64 beside them) the op widens them
// (Wide). False without a 16-bit tensor. A native call's Operands then check its parameters' one dtype (f32) and
// every tensor's one device, the 16-bit activations beside them.
bool native_half(const char* op, std::initializer_list<const Tensor*> acts,
                 std::initializer_list<const Tensor*> params) {
  std::optional<DType> half;
  const Tensor* placed = nullptr;
  bool others_f32 = true;
  for (const auto& list : {acts, params})
    for (const Tensor* t : list) {
      if (!t->defined()) continue;
      if (!placed) placed = t;
      if (!is_half(t->dtype())) {
        others_f32 = others_f32 && t->dtype() == DType::f32;
        continue;
      }
      GT_CHECK(!half || *half == t->dtype(), "{}: 16-bit operands of {} and {} in one call", op, dtype_name(*half),
               dtype_name(t->dtype()));
      half = t->dtype();
    }
  if (!half || placed->device().is_cpu() || !others_f32) return false;
  const bool params_wide =
      std::none_of(params.begin(), params.end(), [](const Tensor* t) { return t->defined() && is_half(t->dtype()); });
  return params_wide && half_format(product_precision()) == half_format_of(*half);
}

}  // namespace

void matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta) {
  const bool native = native_half("matmul", {&a, &b, &c}, {});
  if (!native && any_half({&a, &b, &c})) {  // 16-bit activations widened to f32 (ops/wide.h)
    Wide wide;
    Tensor cw = wide.out(c, beta != 0);
    matmul(wide.in(a), ta, wide.in(b), tb, cw, beta);
    wide.finish();
    return;
  }
  const Operands op = native ? Operands("matmul", {}, {&a, &b, &c}) : Operands("matmul", {&a, &b, &c});
  GT_CHECK(a.rank() == 2 && b.rank() == 2 && c.rank() == 2, "matmul wants 2-D operands");
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const int64_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  GT_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, "matmul {}{} · {}{} → {}", a.shape().str(), ta ? "ᵀ" : "",
           b.shape().str(), tb ? "ᵀ" : "", c.shape().str());
  GT_DISPATCH(op, matmul(a, ta, b, tb, c, beta));
}

void add_row_bias(Tensor& y, const Tensor& bias) {
  const bool native = native_half("add_row_bias", {&y}, {&bias});
  if (!native && any_half({&y, &bias})) {  // 16-bit activations widened to f32 (ops/wide.h)
    Wide wide;
    Tensor yw = wide.out(y, true);
    add_row_bias(yw, wide.in(bias));
    wide.finish();
    return;
  }
  const Operands op = native ? Operands("add_row_bias", {&bias}, {&y}) : Operands("add_row_bias", {&y, &bias});
  GT_CHECK(y.rank() == 2 && bias.numel() == y.dim(1), "bias {} for {}", bias.shape().str(), y.shape().str());
  GT_DISPATCH(op, add_row_bias(y, bias));
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  const bool native = native_half("linear_forward", {&x, &y}, {&w, &bias});
  if (!native && any_half({&x, &w, &bias, &y})) {  // 16-bit activations widened to f32 (ops/wide.h)
    Wide wide;
    Tensor yw = wide.out(y);
    linear_forward(wide.in(x), wide.in(w), wide.in(bias), yw);
    wide.finish();
    return;
  }
  const Operands op =
      native ? Operands("linear_forward", {&w, &bias}, {&x, &y}) : Operands("linear_forward", {&x, &w, &bias, &y});
  GT_CHECK(x.rank() == 2 && w.rank() == 2 && y.rank() == 2 && w.dim(1) == x.dim(1) && y.dim(0) == x.dim(0) &&
               y.dim(1) == w.dim(0),
           "linear_forward {} · {}ᵀ → {}", x.shape().str(), w.shape().str(), y.shape().str());
  GT_CHECK(!bias.defined() || bias.numel() == y.dim(1), "bias {} for {}", bias.shape().str(), y.shape().str());
  GT_DISPATCH(op, linear_forward(x, w, bias, y));
}

void linear_forward_act(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act, Tensor& h, Tensor& y) {
  const bool native = native_half("linear_forward_act", {&x, &h, &y}, {&w, &bias});
  if (!native && any_half({&x, &w, &bias, &h, &y})) {  // 16-bit activations widened to f32 (ops/wide.h)
    Wide wide;
    Tensor hw = wide.out(h), yw = wide.out(y);
    linear_forward_act(wide.in(x), wide.in(w), wide.in(bias), act, hw, yw);
    wide.finish();
    return;
  }
  const Operands op = native ? Operands("linear_forward_act", {&w, &bias}, {&x, &h, &y})
                             : Operands("linear_forward_act", {&x, &w, &bias, &h, &y});
  GT_CHECK(act == Activation::relu || act == Activation::gelu_tanh,
           "linear_forward_act: relu or gelu_tanh, not activation {}", static_cast<int>(act));
  GT_CHECK(x.rank() == 2 && w.rank() == 2 && y.rank() == 2 && w.dim(1) == x.dim(1) && y.dim(0) == x.dim(0) &&
               y.dim(1) == w.dim(0),
           "linear_forward_act {} · {}ᵀ → {}", x.shape().str(), w.shape().str(), y.shape().str());
  GT_CHECK(!h.defined() || h.shape() == y.shape(), "linear_forward_act: h {} for y {}", h.shape().str(),
           y.shape().str());
  GT_CHECK(!bias.defined() || bias.numel() == y.dim(1), "bias {} for {}", bias.shape().str(), y.shape().str());
  GT_DISPATCH(op, linear_forward_act(x, w, bias, act, h, y));
}

void linear_forward_add(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& r, Tensor& y) {
  const bool native = native_half("linear_forward_add", {&x, &r, &y}, {&w, &bias});
  if (!native && any_half({&x, &w, &bias, &r, &y})) {  // 16-bit activations widened to f32 (ops/wide.h)
    Wide wide;
    Tensor yw = wide.out(y);
    linear_forward_add(wide.in(x), wide.in(w), wide.in(bias), wide.in(r), yw);
    wide.finish();
    return;
  }
  const Operands op = native ? Operands("linear_forward_add", {&w, &bias}, {&x, &r, &y})
                             : Operands("linear_forward_add", {&x, &w, &bias, &r, &y});
  GT_CHECK(x.rank() == 2 && w.rank() == 2 && y.rank() == 2 && w.dim(1) == x.dim(1) && y.dim(0) == x.dim(0) &&
               y.dim(1) == w.dim(0),
           "linear_forward_add {} · {}ᵀ → {}", x.shape().str(), w.shape().str(), y.shape().str());
  GT_CHECK(r.numel() == y.numel(), "linear_forward_add: r {} for y {}", r.shape().str(), y.shape().str());
  GT_CHECK(!bias.defined() || bias.numel() == y.dim(1), "bias {} for {}", bias.shape().str(), y.shape().str());
  // (The CPU adds r into blocks of y as they are finished; cuBLASLt reads r as C while it writes y as D.)
  const auto *yb = static_cast<const char*>(y.raw()), *rb = static_cast<const char*>(r.raw());
  GT_CHECK(yb + y.bytes() <= rb || rb + r.bytes() <= yb, "linear_forward_add: y overlaps r");
  GT_DISPATCH(op, linear_forward_add(x, w, bias, r, y));
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, double beta) {
  const bool native = native_half("linear_backward_weight", {&dy, &x}, {&dw, &db});
  if (!native && any_half({&dy, &x, &dw, &db})) {  // 16-bit activations widened to f32 (ops/wide.h)
    Wide wide;
    Tensor dww = wide.out(dw, beta != 0), dbw = wide.out(db, beta != 0);
    linear_backward_weight(wide.in(dy), wide.in(x), dww, dbw, beta);
    wide.finish();
    return;
  }
  const Operands op = native ? Operands("linear_backward_weight", {&dw, &db}, {&dy, &x})
                             : Operands("linear_backward_weight", {&dy, &x, &dw, &db});
  GT_CHECK(dy.rank() == 2 && x.rank() == 2 && dw.rank() == 2 && dy.dim(0) == x.dim(0) && dw.dim(0) == dy.dim(1) &&
               dw.dim(1) == x.dim(1),
           "linear_backward_weight {}ᵀ · {} → {}", dy.shape().str(), x.shape().str(), dw.shape().str());
  GT_CHECK(!db.defined() || db.numel() == dy.dim(1), "bias gradient {} for {}", db.shape().str(), dy.shape().str());
  GT_DISPATCH(op, linear_backward_weight(dy, x, dw, db, beta));
}

void linear_backward(const Tensor& dy, const Tensor& x, const HalfMatrix* x_half, const Tensor& w, Tensor& dw,
                     Tensor& db, Tensor& dx, double beta) {
  const bool native = native_half("linear_backward", {&dy, &x, &dx}, {&w, &dw, &db});
  if (!native && any_half({&dy, &x, &w, &dw, &db, &dx})) {  // 16-bit activations widened to f32 (ops/wide.h)
    Wide wide;
    Tensor dww = wide.out(dw, beta != 0), dbw = wide.out(db, beta != 0), dxw = wide.out(dx);
    linear_backward(wide.in(dy), wide.in(x), x_half, wide.in(w), dww, dbw, dxw, beta);
    wide.finish();
    return;
  }
  const Operands op = native ? Operands("linear_backward", {&w, &dw, &db}, {&dy, &x, &dx})
                             : Operands("linear_backward", {&dy, &x, &w, &dw, &db, &dx});
  GT_CHECK(dy.rank() == 2 && x.rank() == 2 && w.rank() == 2 && dy.dim(0) == x.dim(0) && w.dim(0) == dy.dim(1) &&
               w.dim(1) == x.dim(1),
           "linear_backward {} from {} through {}", dy.shape().str(), x.shape().str(), w.shape().str());
  GT_CHECK(!dw.defined() || dw.shape() == w.shape(), "weight gradient {} for {}", dw.shape().str(), w.shape().str());
  GT_CHECK(!db.defined() || db.numel() == dy.dim(1), "bias gradient {} for {}", db.shape().str(), dy.shape().str());
  GT_CHECK(!dx.defined() || dx.shape() == x.shape(), "input gradient {} for {}", dx.shape().str(), x.shape().str());
  GT_CHECK(!x_half || (x_half->rows == x.dim(0) && x_half->cols == x.dim(1) && x_half->data),
           "linear_backward: a 16-bit input of [{}, {}] for {}", x_half ? x_half->rows : 0, x_half ? x_half->cols : 0,
           x.shape().str());
  GT_DISPATCH(op, linear_backward(dy, x, x_half, w, dw, db, dx, beta));
}

void sum_rows(const Tensor& dy, Tensor& db, double beta) {
  const bool native = native_half("sum_rows", {&dy}, {&db});
  if (!native && any_half({&dy, &db})) {  // 16-bit activations widened to f32 (ops/wide.h)
    Wide wide;
    Tensor dbw = wide.out(db, beta != 0);
    sum_rows(wide.in(dy), dbw, beta);
    wide.finish();
    return;
  }
  const Operands op = native ? Operands("sum_rows", {&db}, {&dy}) : Operands("sum_rows", {&dy, &db});
  GT_CHECK(dy.rank() == 2 && db.numel() == dy.dim(1), "sum_rows {} into {}", dy.shape().str(), db.shape().str());
  GT_DISPATCH(op, sum_rows(dy, db, beta));
}

}  // namespace gt::ops
