// llm.c checkpoints that tests write: the tiny GPT of the PyTorch test with seeded random weights.
#pragma once

#include "core/rng.h"
#include "io/llmc.h"

#include <cstdint>
#include <utility>

namespace gt::test {

/// The tiny GPT of the PyTorch test: 2 layers, 2 heads, 16 channels, vocabulary 60 padded to 64, 8 positions.
inline LlmcHeader tiny_llmc(int32_t version) {
  LlmcHeader h;
  h.version = version;
  h.max_seq_len = 8;
  h.vocab_size = 60;
  h.num_layers = 2;
  h.num_heads = 2;
  h.channels = 16;
  h.padded_vocab_size = 64;
  return h;
}

/// A checkpoint of `h`'s sizes whose every parameter is drawn from N(0, 1) by a Philox stream of `seed`.
inline LlmcCheckpoint random_checkpoint(const LlmcHeader& h, uint64_t seed) {
  LlmcCheckpoint c;
  c.header = h;
  Rng rng(seed, 3);
  for (const auto& [name, shape] : llmc_tensor_shapes(h)) {
    Tensor t = Tensor::empty(shape, DType::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng.normal());
    c.tensors.emplace_back(name, std::move(t));
  }
  return c;
}

}  // namespace gt::test
