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
/// momentum may be null (no momentum buffer).
void launch_sgd(cudaStream_t s, const SgdHyper& h, bool is_double, void* param, const void* grad, void* momentum,
                int64_t n);

}  // namespace gt::cuda
