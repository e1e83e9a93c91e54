// Causal scaled dot-product attention over llm.c's packed layout. ops/attention.cpp checks the contract;
// ops/cpu/attention.cpp and ops/cuda/attention.cu implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"

namespace gt::ops {

/// qkv is [B, T, 3C]: per token the query, key and value rows of C = heads·d, head h at columns [h·d, (h+1)·d) of
/// each (llm.c's and GPT-2's c_attn layout). For each batch, head and query position i:
///   out[b, i, h·d:(h+1)·d] = Σ_{j≤i} softmax_j(q_i·k_j / √d) v_j,   lse[b, h, i] = log Σ_{j≤i} exp(q_i·k_j / √d).
/// No [T, T] matrix is kept: the backward recomputes the probabilities from qkv and lse.
void attention_forward(const Tensor& qkv, int64_t heads, Tensor& out, Tensor& lse);

/// Incremental decoding (a key/value cache): qkv [B, L, 3C] holds the packed rows of positions [0, first + n) of B
/// sequences (rows past first + n are not read); out [B, n, C] gets attention_forward's rows for the queries at
/// positions first … first + n − 1, each over the keys at or before it, with the same arithmetic, so a row equals
/// the one a forward over the whole prefix computes. No lse: nothing goes backward through it.
void attention_decode(const Tensor& qkv, int64_t heads, int64_t first, Tensor& out);

/// dqkv [B, T, 3C] (overwritten) from dout [B, T, C], given the forward's qkv, out and lse. delta [B, heads, T] is
/// scratch the caller holds (Σ dout·out per query row).
void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, int64_t heads,
                        Tensor& delta, Tensor& dqkv);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CPU: threaded over batch × heads; queries in tiles of 64 rows, each tile's scores and products as GEMMs, so at most a
// [64, T] block of scores exists per thread; one thread per (batch, head), so results do not depend on the count.
// CUDA: one warp per query row with an online softmax (no score matrix in device memory); the backward is one warp per
// query row for dq and one per key row for dk and dv, so every sum has one writer and a fixed order (no atomics). Head
// size at most 256.
GT_BACKEND_ENTRY_POINTS(attention_forward, attention_backward, attention_decode)
