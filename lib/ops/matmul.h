// Matrix products and the bias ops of a dense layer: matmul, add_row_bias, sum_rows, linear_forward and its fused
// forms, linear_backward_weight. The contract is
// checked in ops/matmul.cpp; ops/cpu/matmul.cpp (OpenBLAS) and ops/cuda/matmul.cu (cuBLASLt, bias kernels) implement
// it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"
#include "ops/math.h"

namespace gt::ops {

/// c = op(a) · op(b) + beta · c for 2-D tensors; op transposes when the flag is set.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double beta);

/// y[r, :] += bias for every row r of the 2-D tensor y.
void add_row_bias(Tensor& y, const Tensor& bias);

/// db = Σ_r dy[r, :] + beta · db.
void sum_rows(const Tensor& dy, Tensor& db, double beta);

/// A dense layer's parameter gradients from its output's gradient dy (rows, out) and its input x (rows, in):
/// dw = dyᵀ · x + beta · dw and, unless db is undefined, db = Σ_r dy[r, :] + beta · db. CPU: matmul then sum_rows,
/// the same bits. CUDA: with beta 0, db summed in the product's epilogue (ops/cuda/matmul.cu).
void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, double beta);

struct HalfMatrix;  // ops/half_storage.h

/// A dense layer's whole backward from dy (rows, out), its input x (rows, in) and weight w (out, in): dw and db as
/// linear_backward_weight (dw undefined: a frozen weight, and db, unless undefined too, = Σ_r dy + beta · db as
/// sum_rows), and unless dx is undefined its input's gradient dx = dy · w. With x_half (not null), x is that 16-bit
/// copy the model kept, which dw's product reads as it is (matmul_half_b; x's tensor only gives the shape then).
/// CPU: those ops, the same bits. CUDA: under a bf16/fp16 product precision dy is rounded to 16 bits once for both
/// products, not once each (a GPT's lm head's dy is its [B·T, V] logits' gradient), with the bits of the ops apart.
void linear_backward(const Tensor& dy, const Tensor& x, const HalfMatrix* x_half, const Tensor& w, Tensor& dw,
                     Tensor& db, Tensor& dx, double beta);

/// A dense layer's forward: y = x · wᵀ, plus bias on every row unless bias is undefined; the same numbers as matmul
/// (beta 0) then add_row_bias, in fewer passes over y where the backend can.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);

/// A dense layer and the activation after it in one pass (a fused chain, graph/model.h's Model::chains):
/// y = act(x · wᵀ + bias), with act relu or gelu_tanh. `h` (undefined: none) receives x · wᵀ + bias, the activation's
/// input, which gelu_tanh's backward reads; without it y holds that sum until each block of it is activated in
/// place. CPU: the same bits as linear_forward then activation_forward, the activation run on each block of the
/// product as our kernels finish it, while the block is in cache (elsewhere after the product). CUDA: in cuBLASLt's
/// epilogue, whose GELU arithmetic is its own (ops/cuda/matmul.cu).
void linear_forward_act(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act, Tensor& h, Tensor& y);

/// A dense layer and the residual add after it in one pass (a fused chain): y = (x · wᵀ + bias) + r; y must not
/// overlap r. CPU: the same bits as linear_forward then add, r (y's shape) added to each block of the product as our
/// kernels finish it (elsewhere after the product). CUDA: r is cuBLASLt's C with beta 1, y its D.
void linear_forward_add(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& r, Tensor& y);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CUDA: matmul through cuBLASLt in the tensors' precision (f32 without TF32, or f64), one cached plan per shape;
// linear_forward, linear_forward_act and linear_forward_add run the bias, the activation and the residual in
// cuBLASLt's epilogue (where it has one for the type and shape; the product, then kernels, otherwise);
// linear_backward_weight sums db there too (CUBLASLT_EPILOGUE_BGRADB) when beta is 0; sum_rows sums in double in a
// fixed order.
//
// 16-bit activations (DType bf16/f16: x, y, h, r, dy, dx, and any of matmul's a, b, c; parameters and their
// gradients stay f32). The 16-bit tensors of one call share one format. Under the product precision of that format
// the CUDA backend takes them as they are: cuBLASLt reads them as its 16-bit operands (an f32 operand is rounded into
// scratch, a weight once per scope) and writes a 16-bit result as its D, summing in f32 and rounding once, with the
// bias (f32) in its epilogue; add_row_bias and sum_rows widen each element (add_row_bias rounds its sum). Anywhere
// else (the CPU, an fp32 or tf32 precision, a 16-bit parameter) the op widens them to f32 and rounds its 16-bit
// results once (ops/wide.h), so the numbers are the f32 op's on the 16-bit values either way, up to the order of the
// sums.
GT_BACKEND_ENTRY_POINTS(matmul, add_row_bias, sum_rows, linear_forward, linear_forward_act, linear_forward_add,
                        linear_backward_weight, linear_backward)
