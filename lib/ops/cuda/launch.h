// Kernel launchers on raw device pointers. nvcc compiles the kernels behind these, and nvcc's front end
// cannot take fmt's consteval format checks, so nothing here may include core/ headers; ops_cuda.cpp maps
// tensors to these calls. Every launcher queues its work on `s` (context.h: the device's stream) and returns.
#pragma once

#include "ops/math.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace gt::cuda {

/// `is_double` picks f64 over f32 for every pointer of the call.
void launch_activation_forward(cudaStream_t s, Activation a, bool is_double, const void* x, void* y, int64_t n);
void launch_activation_backward(cudaStream_t s, Activation a, bool is_double, const void* x, const void* y,
                                const void* dy, void* dx, int64_t n);

// reduce.cu
/// y (rows, cols) += bias (cols) on every row.
void launch_add_row_bias(cudaStream_t s, bool is_double, void* y, const void* bias, int64_t rows, int64_t cols);
/// db (cols) = Σ_r dy (rows, cols) + beta · db, summed in double in a fixed order.
void launch_sum_rows(cudaStream_t s, bool is_double, const void* dy, void* db, int64_t rows, int64_t cols, double beta);
/// out[0] (f64) += Σ g².
void launch_sum_squares(cudaStream_t s, bool is_double, const void* g, int64_t n, double* out);
/// x ← x · scale[0], the f64 scale read on the device.
void launch_scale_by(cudaStream_t s, bool is_double, void* x, int64_t n, const double* scale);
/// y = a + b (y may alias a or b).
void launch_add(cudaStream_t s, bool is_double, const void* a, const void* b, void* y, int64_t n);
/// For o in [0, outer): `run` elements of `elem_size` bytes from src[o·src_stride + src_off] to
/// dst[o·dst_stride + dst_off] (strides and offsets in elements).
void launch_strided_copy(cudaStream_t s, size_t elem_size, const void* src, void* dst, int64_t outer, int64_t run,
                         int64_t src_stride, int64_t src_off, int64_t dst_stride, int64_t dst_off);

// loss.cu
/// logits (batch, k), labels (batch, int32); stats[0] += Σ loss, stats[1] += Σ hits; dlogits may be null.
void launch_cross_entropy(cudaStream_t s, bool is_double, const void* logits, const int32_t* labels, int64_t batch,
                          int64_t k, double label_smoothing, double scale, void* dlogits, double* stats);
/// pred, target (batch, d); stats[0] += Σ_b mean_d (pred − target)²; dpred may be null.
void launch_mse(cudaStream_t s, bool is_double, const void* pred, const void* target, int64_t batch, int64_t d,
                double scale, void* dpred, double* stats);

// norm.cu
void launch_layernorm_forward(cudaStream_t s, bool is_double, const void* x, const void* gamma, const void* beta,
                              int64_t rows, int64_t d, double eps, void* save_mean, void* save_invstd, void* y);
/// dx may be null (only the parameter gradients then).
void launch_layernorm_backward(cudaStream_t s, bool is_double, const void* x, const void* gamma, const void* save_mean,
                               const void* save_invstd, const void* dy, int64_t rows, int64_t d, void* dx,
                               void* dgamma, void* dbeta, double beta);
void launch_softmax_forward(cudaStream_t s, bool is_double, const void* x, int64_t rows, int64_t d, void* y);
void launch_softmax_backward(cudaStream_t s, bool is_double, const void* y, const void* dy, int64_t rows, int64_t d,
                             void* dx);

// misc.cu
void launch_dropout(cudaStream_t s, bool is_double, const void* x, double p, uint64_t key, uint64_t step, void* y,
                    int64_t n);
/// idx (n) holds row numbers as floats; weight (vocab, dim); y (n, dim).
void launch_embedding_forward(cudaStream_t s, bool is_double, const void* idx, const void* weight, int64_t n,
                              int64_t vocab, int64_t dim, void* y);
void launch_embedding_backward(cudaStream_t s, bool is_double, const void* idx, const void* dy, int64_t n,
                               int64_t vocab, int64_t dim, void* dweight, double beta);

}  // namespace gt::cuda
