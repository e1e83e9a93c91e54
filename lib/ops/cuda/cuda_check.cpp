// Messages for failed CUDA library calls.
#include "ops/cuda/cuda_check.h"

#include "core/error.h"

namespace gt::cuda {

void throw_cuda_error(const char* call, const char* file, int line, int status) {
  const auto error = static_cast<cudaError_t>(status);
  throw Error(
      fmt::format("{} failed at {}:{}: {} ({})", call, file, line, cudaGetErrorString(error), cudaGetErrorName(error)));
}

void throw_cublas_error(const char* call, const char* file, int line, cublasStatus_t status) {
  throw Error(fmt::format("{} failed at {}:{}: {}", call, file, line, cublasGetStatusString(status)));
}

void throw_cudnn_error(const char* call, const char* file, int line, cudnnStatus_t status) {
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);  // cuDNN 9 keeps the reason of the last failure per thread
  throw Error(fmt::format("{} failed at {}:{}: {}{}{}", call, file, line, cudnnGetErrorString(status),
                          detail[0] ? ": " : "", detail));
}

}  // namespace gt::cuda
