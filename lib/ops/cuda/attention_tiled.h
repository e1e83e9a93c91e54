// The tiled causal attention for f32 heads of 64, 96 and 128 channels (FlashAttention-2's tiling): a block per
// (batch·head, tile of query rows) with key and value tiles staged in shared memory, the products in f32 FMA or, under
// train.precision tf32, on TF32 tensor cores. ops/cuda/attention.cu asks these first for fp32 and tf32 calls and runs
// its row and warp kernels when they decline.
#pragma once

#include "core/tensor.h"
#include "ops/attention.h"

#include <cstdint>
#include <optional>
#include <string>

namespace gt::cuda {

/// Why the tiled kernels cannot take an attention of `qkv` with `heads` heads and `dropout` in the calling thread's
/// product precision; nullopt when they take it. They take f32 tensors without dropout (the warp kernels draw the
/// CPU's mask), heads of 64, 96 or 128 channels, T of at most 2²⁰ and a product precision of fp32 or tf32 (bf16 and
/// fp16 round their operands where the CPU does: cuDNN or the warp kernels). GPUTRAIN_TILED_ATTENTION=0 declines every
/// call (the warp kernels run it: tests and timings compare the two); unset, empty or `auto` is the default.
std::optional<std::string> tiled_attention_refusal(const Tensor& qkv, int64_t heads,
                                                   const ops::AttentionDropout& dropout);

/// ops::attention_forward for a call the tiled kernels take: out, and lse when it is defined.
void tiled_attention_forward(const Tensor& qkv, int64_t heads, Tensor& out, Tensor& lse);

/// ops::attention_backward for a call the tiled kernels take, given delta = Σ dout·out per query row (filled by the
/// caller): dk and dv by a block per key tile over the query tiles at or after it, dq by a block per query tile over
/// the key tiles at or before it. Every gradient has one writer and a fixed order of sums: no atomics.
void tiled_attention_backward(const Tensor& qkv, const Tensor& lse, const Tensor& dout, int64_t heads,
                              const Tensor& delta, Tensor& dqkv);

/// Calls the tiled kernels ran since the process started (tests: which path a call took).
struct TiledAttentionRuns {
  int64_t forward = 0, backward = 0;
};
TiledAttentionRuns tiled_attention_runs();

}  // namespace gt::cuda
