// Per-device CUDA state shared by every op: the stream all work runs on, the cuBLASLt and cuDNN handles bound to
// it, and a scratch workspace. Internal to the CUDA backend; ops/cuda_context.h is what other folders see of it.
//
// One stream per device keeps the whole step in order without a host synchronisation: kernels, library calls and
// asynchronous copies queue behind each other. The stream is a blocking one, so the synchronous cudaMemcpy and
// cudaMemset that Tensor::copy_from and zero_ use (legacy default stream) are ordered with it too.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>

namespace gt::cuda {

/// Set by ops/cuda/backend.cpp when it installs the CUDA device hooks of core/backend.h (at static initialisation).
/// Each device's context checks it, which keeps backend.cpp linked into every program that runs CUDA.
extern const bool g_device_hooks_installed;

/// The stream of `device`, created on first use (and makes `device` current for the calling thread).
cudaStream_t stream(int device);
cublasLtHandle_t lt_handle(int device);
/// A cuDNN handle whose stream is stream(device).
cudnnHandle_t cudnn_handle(int device);
/// At least `bytes` of device scratch memory for the next library call on stream(device). The buffer only grows;
/// since every user runs on the same stream, one call's use is over before the next one's starts.
void* workspace(int device, size_t bytes);

/// Where reductions that must give the same bits on every run (the loss and gradient-norm sums) gather their blocks'
/// partial sums: kReduceBlocks values of each of kReduceValues sums, and the ticket counter that tells the last block
/// (kern::add_in_block_order). One per device, made with its stream (so never inside a graph capture), kept for the
/// process's life; the kernels on the device's stream use it one at a time, and each leaves the ticket at 0.
struct ReduceScratch {
  static constexpr int kBlocks = 1024, kValues = 2;
  double* partials = nullptr;  ///< [kValues][kBlocks]
  unsigned int* ticket = nullptr;
};
ReduceScratch reduce_scratch(int device);

}  // namespace gt::cuda
