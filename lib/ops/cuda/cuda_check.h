// GT_CHECK_CUBLAS and GT_CHECK_CUDNN beside GT_CHECK_CUDA (ops/cuda_context.h): every CUDA library call is
// checked, and a failure names the call, file:line and the library's own message (built in cuda_check.cpp).
#pragma once

#include "ops/cuda_context.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

namespace gt::cuda {
[[noreturn]] void throw_cublas_error(const char* call, const char* file, int line, cublasStatus_t status);
[[noreturn]] void throw_cudnn_error(const char* call, const char* file, int line, cudnnStatus_t status);
}  // namespace gt::cuda

/// cuBLAS and cuBLASLt share one status type.
#define GT_CHECK_CUBLAS(call)                                                                                       \
  do {                                                                                                              \
    const cublasStatus_t gt_status_ = (call);                                                                       \
    if (gt_status_ != CUBLAS_STATUS_SUCCESS) ::gt::cuda::throw_cublas_error(#call, __FILE__, __LINE__, gt_status_); \
  } while (0)

#define GT_CHECK_CUDNN(call)                                                                                      \
  do {                                                                                                            \
    const cudnnStatus_t gt_status_ = (call);                                                                      \
    if (gt_status_ != CUDNN_STATUS_SUCCESS) ::gt::cuda::throw_cudnn_error(#call, __FILE__, __LINE__, gt_status_); \
  } while (0)

/// After a kernel launch: reports a bad launch configuration at the launch site.
#define GT_CHECK_LAUNCH() GT_CHECK_CUDA(cudaGetLastError())
