// Launchers of the small kernels the cuDNN wrappers need where cuDNN has no call (dnn_kernels.cu). nvcc-safe: raw
// pointers only, no core/ headers. Each queues its work on `s` and returns.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gt::cuda {

/// Batch norm in evaluation: save_mean = running_mean, save_invstd = 1/√(running_var + eps), per channel, as the
/// CPU stores them for the backward pass. `is_double` picks f64 over f32 for every pointer.
void launch_bn_eval_stats(cudaStream_t s, bool is_double, const void* running_mean, const void* running_var,
                          double eps, void* save_mean, void* save_invstd, int64_t channels);

/// Batch-norm backward through fixed statistics (evaluation mode) over x viewed as (batch, channels, spatial):
///   dx = γ·invstd·dy (skipped when dx is null),
///   dgamma = Σ dy·(x − mean)·invstd + beta·dgamma,  dbeta = Σ dy + beta·dbeta  (sums over batch and spatial).
void launch_bn_eval_backward(cudaStream_t s, bool is_double, const void* x, const void* gamma, const void* save_mean,
                             const void* save_invstd, const void* dy, void* dx, void* dgamma, void* dbeta, double beta,
                             int64_t batch, int64_t channels, int64_t spatial);

}  // namespace gt::cuda
