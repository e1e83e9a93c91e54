// Causal scaled dot-product attention over llm.c's packed layout. ops/attention.cpp checks the contract;
// ops/cpu/attention.cpp and ops/cuda/attention.cu implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"

#include <cstdint>

namespace gt::ops {

/// Dropout on the attention probabilities in training (PyTorch's scaled_dot_product_attention(dropout_p=p),
/// nanoGPT's attn_dropout). The mask is never stored: keep_ij = dropout_keep(key, step, index, p) (ops/math.h) with
/// index = attention_dropout_index(b, h, i, j, heads, T) = ((b·heads + h)·T + i)·T + j, so both backends draw the
/// same mask and the backward regenerates the forward's. p = 0 (the default) is no dropout, with the arithmetic and
/// the speed of attention without it: the mask is not drawn at all. A p outside [0, 1) (or NaN) throws, on either
/// device, before anything runs.
struct AttentionDropout {
  double p = 0;       ///< drop probability, in [0, 1)
  uint64_t key = 0;   ///< the layer's mask stream (drawn at init_params)
  uint64_t step = 0;  ///< LayerContext::step: a new mask each micro-batch
};

/// qkv is [B, T, 3C]: per token the query, key and value rows of C = heads·d, head h at columns [h·d, (h+1)·d) of
/// each (llm.c's and GPT-2's c_attn layout). For each batch, head and query position i, with
/// P_ij = softmax_j(q_i·k_j / √d) over j ≤ i and m_ij = keep_ij / (1 − p) (m_ij = 1 without dropout):
///   out[b, i, h·d:(h+1)·d] = Σ_{j≤i} m_ij P_ij v_j,   lse[b, h, i] = log Σ_{j≤i} exp(q_i·k_j / √d)
/// (lse is that of the softmax before dropout; undefined: not computed, as an evaluation needs none). No [T, T]
/// matrix is kept: the backward recomputes the probabilities from qkv and lse, and the mask from `dropout`.
void attention_forward(const Tensor& qkv, int64_t heads, const AttentionDropout& dropout, Tensor& out, Tensor& lse);

/// Incremental decoding (a key/value cache): qkv [B, L, 3C] holds the packed rows of positions [0, first + n) of B
/// sequences (rows past first + n are not read); out [B, n, C] gets attention_forward's rows for the queries at
/// positions first … first + n − 1, each over the keys at or before it, with the same arithmetic (no dropout: decoding
/// is evaluation), so a row equals the one a forward over the whole prefix computes. No lse: nothing goes backward
/// through it.
void attention_decode(const Tensor& qkv, int64_t heads, int64_t first, Tensor& out);

/// dqkv [B, T, 3C] (overwritten) from dout [B, T, C], given the forward's qkv, out and lse and the same `dropout`
/// (flash-attention's backward: dv_j = Σ_i m_ij P_ij dout_i, dP_ij = m_ij dout_i·v_j, dS_ij = P_ij (dP_ij − D_i)
/// with D_i = dout_i·out_i). delta [B, heads, T] is scratch the caller holds (D per query row).
void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, int64_t heads,
                        const AttentionDropout& dropout, Tensor& delta, Tensor& dqkv);

}  // namespace gt::ops

// The backends' entry points: the ops above call them once the contract holds.
// CPU: threaded over batch × heads; queries in tiles of 64 rows, each tile's scores and products as GEMMs, so at most a
// [64, T] block of scores exists per thread; one thread per (batch, head), so results do not depend on the count.
// CUDA: one warp per query row with an online softmax (no score matrix in device memory); the backward is one warp per
// query row for dq and one per key row for dk and dv, so every sum has one writer and a fixed order (no atomics). Head
// size at most 256. f32 heads of 64, 96 and 128 in fp32 or tf32 without dropout take tiled kernels instead (a block per
// tile of 64 query rows, key tiles in shared memory, sums in f32; ops/cuda/attention_tiled.h), with the same one
// writer per sum.
GT_BACKEND_ENTRY_POINTS(attention_forward, attention_backward, attention_decode)

namespace gt::cpu {
/// Tests: the CPU's f32 attention runs its register blocks for AVX2 (4 rows of two 32-byte vectors, compiled per
/// instruction set) even where AVX-512 runs its own (8 rows of one 64-byte vector) when `narrow` is true, the CPU's
/// choice again when false. Not for use while attention runs.
void force_attention_narrow(bool narrow);
}  // namespace gt::cpu
