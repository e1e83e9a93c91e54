// cuDNN's fused flash attention for the CUDA attention (ops/attention.h) under a bf16/fp16 product precision: the
// cuDNN frontend's sdpa and sdpa_backward graphs, built once per shape and kept. ops/cuda/attention.cu asks these
// first and runs its own kernels when they decline.
#pragma once

#include "core/half.h"
#include "ops/attention.h"

#include <cstdint>
#include <optional>
#include <string>

namespace gt::cuda {

/// ops::attention_forward through cuDNN: true when cuDNN ran it, false when it cannot take this call (the CUDA
/// kernels then run it; the reason is logged once per reason at info level). It takes a call when the calling
/// thread's product precision is bf16 or fp16 (ops/precision.h), the tensors are f32, there is no dropout, the head
/// size is a multiple of 8 of at most 128, the cuDNN loaded at run time is 9.0 or newer and builds the graph.
/// GPUTRAIN_CUDNN_ATTENTION=0 declines every call; =1 makes a call it cannot take an Error naming why (tests, the GPU
/// check); unset, empty or `auto` is the default.
bool cudnn_attention_forward(const Tensor& qkv, int64_t heads, const ops::AttentionDropout& dropout, Tensor& out,
                             Tensor& lse);

/// ops::attention_backward through cuDNN, under the same conditions (and cuDNN's deterministic backward: the same
/// bits on every run). cuDNN forms delta = Σ dout·out itself: the caller's delta scratch is left as it was.
bool cudnn_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              int64_t heads, const ops::AttentionDropout& dropout, Tensor& dqkv);

/// Why cuDNN cannot take an attention with heads of `head_size` and `dropout` in the calling thread's product
/// precision, from what is known without a device (GPUTRAIN_CUDNN_ATTENTION=0, a build without the cuDNN frontend,
/// an fp32 or tf32 precision, dropout, the head size); nullopt when it may (the device and its cuDNN decide the rest).
std::optional<std::string> cudnn_attention_refusal(int64_t head_size, const ops::AttentionDropout& dropout);

/// The graphs cuDNN runs: the forward with lse (training), the forward without (evaluation), the backward.
enum class CudnnAttentionKind : int64_t { forward_train, forward_eval, backward };

/// Tests without a device: the frontend's own checks (Graph::validate: dimensions, strides, types, the causal band,
/// its support rules for SM version `sm`, e.g. 90) of the graph an attention of this shape would build; the
/// frontend's message when it rejects it, nullopt when it passes. A build without the frontend says so.
std::optional<std::string> cudnn_attention_check_graph(int64_t batch, int64_t t, int64_t heads, int64_t head_size,
                                                       HalfFormat format, CudnnAttentionKind kind, int sm);

/// Whether this build has the cuDNN frontend (scripts/setup.sh fetches it; CMake's CUDNN_FRONTEND_INCLUDE_DIR).
bool cudnn_attention_built();

/// Calls that cuDNN ran since the process started (tests: which path a call took).
struct CudnnAttentionRuns {
  int64_t forward = 0, backward = 0;
};
CudnnAttentionRuns cudnn_attention_runs();

}  // namespace gt::cuda
