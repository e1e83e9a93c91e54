// What code outside ops/ may use of the CUDA backend (the NCCL communicator): a device's compute stream and
// GT_CHECK_CUDA for its own CUDA calls. Needs no CUDA header; only builds with the CUDA backend define these
// (ops/cuda/context.cpp, ops/cuda/cuda_check.cpp).
#pragma once

namespace gt::cuda {

/// The compute stream of `device` (a cudaStream_t): every op on the device queues its work there, in order. Made on
/// first use; makes `device` current for the calling thread.
void* compute_stream(int device);

/// Throws gt::Error naming the failed call, file:line and CUDA's message for `status` (a cudaError_t).
[[noreturn]] void throw_cuda_error(const char* call, const char* file, int line, int status);

}  // namespace gt::cuda

/// Checks a CUDA runtime call: anything but cudaSuccess (0) throws gt::Error naming the call and CUDA's message.
#define GT_CHECK_CUDA(call)                                                                   \
  do {                                                                                        \
    const int gt_status_ = static_cast<int>(call);                                            \
    if (gt_status_ != 0) ::gt::cuda::throw_cuda_error(#call, __FILE__, __LINE__, gt_status_); \
  } while (0)
