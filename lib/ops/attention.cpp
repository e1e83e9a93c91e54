// The contract of causal attention (ops/attention.h): shapes, dtypes and devices, then the backend's entry point.
#include "ops/attention.h"

#include "ops/dispatch.h"
#include "ops/wide.h"

#include <array>

namespace gt::ops {
namespace {

// qkv [B, T, 3C] with C divisible by heads; returns {B, T, C}.
std::array<int64_t, 3> check_qkv(const Tensor& qkv, int64_t heads) {
  GT_CHECK(qkv.shape().rank() == 3 && qkv.dim(2) % 3 == 0, "attention takes qkv of [B, T, 3C], got {}",
           qkv.shape().str());
  const int64_t c = qkv.dim(2) / 3;
  GT_CHECK(heads > 0 && c % heads == 0, "attention: {} channels do not split into {} heads", c, heads);
  return {qkv.dim(0), qkv.dim(1), c};
}

// 16-bit activations (Model::set_activation_dtype): the tensors that may hold them are f32 or one 16-bit dtype, the
// statistics (lse, delta) f32. On the CPU the op runs in f32 (ops/wide.h); CUDA takes them as they are (cuDNN's flash
// attention reads and writes 16 bits).
void check_half_call(const char* op, std::initializer_list<const Tensor*> values,
                     std::initializer_list<const Tensor*> stats) {
  DType half = DType::f32;
  for (const Tensor* t : values) {
    if (!t->defined() || t->dtype() == DType::f32) continue;
    GT_CHECK(is_half(t->dtype()) && (half == DType::f32 || half == t->dtype()), "{}: operands of {} and {}", op,
             dtype_name(half), dtype_name(t->dtype()));
    half = t->dtype();
  }
  for (const Tensor* t : stats)
    GT_CHECK(!t->defined() || t->dtype() == DType::f32, "{}: f32 statistics beside 16-bit operands, got {}", op,
             dtype_name(t->dtype()));
}

void check_dropout(const AttentionDropout& dropout) {
  GT_CHECK(dropout.p >= 0 && dropout.p < 1, "attention: dropout probability {} is not in [0, 1)", dropout.p);
}

}  // namespace

void attention_forward(const Tensor& qkv, int64_t heads, const AttentionDropout& dropout, Tensor& out, Tensor& lse) {
  const bool half = any_half({&qkv, &out});
  if (half) check_half_call("attention", {&qkv, &out}, {&lse});
  if (half && qkv.device().is_cpu()) {
    Wide wide;
    Tensor ow = wide.out(out);
    attention_forward(wide.in(qkv), heads, dropout, ow, lse);
    wide.finish();
    return;
  }
  const Operands op = half ? Operands("attention", {}, {&qkv, &out, &lse}) : Operands("attention", {&qkv, &out, &lse});
  const auto [b, t, c] = check_qkv(qkv, heads);
  check_dropout(dropout);
  GT_CHECK(out.numel() == b * t * c && (!lse.defined() || lse.numel() == b * heads * t),
           "attention: out {} lse {} for qkv {}", out.shape().str(), lse.shape().str(), qkv.shape().str());
  GT_DISPATCH(op, attention_forward(qkv, heads, dropout, out, lse));
}

void attention_decode(const Tensor& qkv, int64_t heads, int64_t first, Tensor& out) {
  if (any_half({&qkv, &out})) {  // (a decoding cache is the layer's own, f32: only a caller elsewhere gets here)
    check_half_call("attention_decode", {&qkv, &out}, {});
    Wide wide;
    Tensor ow = wide.out(out, true);  // (rows past the call's are not written)
    attention_decode(wide.in(qkv), heads, first, ow);
    wide.finish();
    return;
  }
  const Operands op("attention_decode", {&qkv, &out});
  const auto [b, len, c] = check_qkv(qkv, heads);
  GT_CHECK(out.shape().rank() == 3 && out.dim(0) == b && out.dim(2) == c,
           "attention_decode: out {} for qkv {} (expected [{}, n, {}])", out.shape().str(), qkv.shape().str(), b, c);
  const int64_t n = out.dim(1);
  GT_CHECK(first >= 0 && first <= len && n <= len - first,
           "attention_decode: positions [{}, {}) do not fit the {} rows of qkv {}", first, first + n, len,
           qkv.shape().str());
  GT_DISPATCH(op, attention_decode(qkv, heads, first, out));
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, int64_t heads,
                        const AttentionDropout& dropout, Tensor& delta, Tensor& dqkv) {
  const bool half = any_half({&qkv, &out, &dout, &dqkv});
  if (half) check_half_call("attention_backward", {&qkv, &out, &dout, &dqkv}, {&lse, &delta});
  if (half && qkv.device().is_cpu()) {
    Wide wide;
    Tensor dw = wide.out(dqkv);
    attention_backward(wide.in(qkv), wide.in(out), lse, wide.in(dout), heads, dropout, delta, dw);
    wide.finish();
    return;
  }
  const Operands op = half ? Operands("attention_backward", {&lse, &delta}, {&qkv, &out, &dout, &dqkv})
                           : Operands("attention_backward", {&qkv, &out, &lse, &dout, &delta, &dqkv});
  const auto [b, t, c] = check_qkv(qkv, heads);
  check_dropout(dropout);
  GT_CHECK(out.numel() == b * t * c && dout.numel() == out.numel() && lse.numel() == b * heads * t &&
               delta.numel() == lse.numel() && dqkv.numel() == qkv.numel(),
           "attention_backward sizes");
  GT_DISPATCH(op, attention_backward(qkv, out, lse, dout, heads, dropout, delta, dqkv));
}

}  // namespace gt::ops
