// GT_CHECK_CUDA and friends: every CUDA library call is checked, and a failure names the call, the file:line
// and the library's own message.
#pragma once

#include "core/error.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#define GT_CHECK_CUDA(call)                                                                              \
  do {                                                                                                   \
    const cudaError_t gt_status_ = (call);                                                               \
    if (gt_status_ != cudaSuccess)                                                                       \
      throw ::gt::Error(::fmt::format("{} failed at {}:{}: {} ({})", #call, __FILE__, __LINE__,          \
                                      cudaGetErrorString(gt_status_), cudaGetErrorName(gt_status_)));    \
  } while (0)

#define GT_CHECK_CUBLAS(call)                                                                            \
  do {                                                                                                   \
    const cublasStatus_t gt_status_ = (call);                                                            \
    if (gt_status_ != CUBLAS_STATUS_SUCCESS)                                                             \
      throw ::gt::Error(::fmt::format("{} failed at {}:{}: {}", #call, __FILE__, __LINE__,               \
                                      cublasGetStatusString(gt_status_)));                               \
  } while (0)
