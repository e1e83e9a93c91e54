// llm.c's GPT-2 checkpoints (train_gpt2.c's gpt2_build_from_checkpoint): a 256 × int32 header, then the 16
// parameter tensors in llm.c's order, f32 (version 3) or bf16 (version 5), and the mapping between them and
// gputrain's GPT layers (the layout `gputrain import llmc` writes and `gputrain export llmc` accepts).
#pragma once

#include "core/tensor.h"
#include "graph/model.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gt {

inline constexpr int32_t kLlmcMagic = 20240326;
inline constexpr uint64_t kLlmcHeaderBytes = 256 * 4;
/// The most transformer blocks a checkpoint may have: its GPT is 8 layers a block (GPT-2 XL has 48 blocks).
inline constexpr int64_t kLlmcMaxLayers = 10000;

struct LlmcHeader {
  int32_t version = 3;  ///< 3: f32 parameters, 5: bf16
  int64_t max_seq_len = 0, vocab_size = 0, num_layers = 0, num_heads = 0, channels = 0, padded_vocab_size = 0;
  int64_t param_bytes() const { return version == 5 ? 2 : 4; }
};

/// llm.c's 16 parameter tensors in file order: names (wte, wpe, ln1w, …, lnfb) and shapes (weights [out, in]).
std::vector<std::pair<std::string, Shape>> llmc_tensor_shapes(const LlmcHeader& h);

/// Validates the 1024-byte header of a file of `file_bytes` bytes: magic, version 3 or 5, every size positive and
/// bounded (core/limits.h), channels divisible by heads, vocabulary ≤ padded vocabulary, and the file exactly the
/// header plus the parameters. Throws DataError naming `name` and what was expected.
LlmcHeader parse_llmc_header(const uint8_t* header, uint64_t file_bytes, const std::string& name);

/// A checkpoint in memory: the header and the 16 tensors in llm.c's order, as f32 on the CPU.
struct LlmcCheckpoint {
  LlmcHeader header;
  std::vector<std::pair<std::string, Tensor>> tensors;
};

/// Reads and validates a checkpoint file (bf16 widened to f32 exactly). DataError naming the file when it is not one.
LlmcCheckpoint read_llmc(const std::string& path);
/// Writes `c` as header.version says (5: each f32 rounded to the nearest bf16, ties to even), atomically (a
/// temporary, fsync, rename). Throws gt::Error naming the file.
void write_llmc(const std::string& path, const LlmcCheckpoint& c);

/// The `model:` section of llm.c's GPT-2 as gputrain layers (scoped names h.<l>.ln_1, h.<l>.attn, …, lm_head).
std::string llmc_model_yaml(const LlmcHeader& h);
/// A whole experiment for the checkpoint: the model, `data.format: tokens` with placeholder paths and
/// block_size = max_seq_len, cross-entropy, and AdamW as train_gpt2.c runs it.
std::string llmc_config_yaml(const LlmcHeader& h, const std::string& name, const std::string& source);

/// The checkpoint's tensors under gputrain's parameter names (wte.weight, h.0.attn.qkv.weight, …), in the model's
/// order; each is a copy of its slice of llm.c's per-layer stacked tensor.
std::vector<std::pair<std::string, Tensor>> llmc_to_named(const LlmcCheckpoint& c);

/// The header of a GPT-shaped model (built from llmc_model_yaml, any sizes; parameters need not exist): its sizes
/// are read from the layers and the whole layer list compared with llm.c's; the first layer that differs is a
/// ConfigError naming it and what llm.c's has there. `version` 3 or 5 goes into the header.
LlmcHeader llmc_gpt_header(const Model& model, int32_t version);
/// The checkpoint of a GPT-shaped model's parameters (llmc_gpt_header's checks first).
LlmcCheckpoint llmc_from_model(Model& model, int32_t version);

/// bf16 ↔ f32: widening is exact; narrowing rounds to the nearest, ties to even (a NaN stays a quiet NaN).
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);

}  // namespace gt
