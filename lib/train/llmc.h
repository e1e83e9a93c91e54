// `gputrain import llmc` and `gputrain export llmc`: llm.c's GPT-2 checkpoints to a gputrain experiment folder and
// back (io/llmc.h has the format and the layer mapping).
#pragma once

#include "core/tensor.h"

#include <string>
#include <utility>
#include <vector>

namespace gt {

struct LlmcImport {
  std::string config, weights;  ///< the files written
  int64_t params = 0;
  std::string summary;                ///< one line: the sizes read
  std::vector<std::string> replaced;  ///< an earlier import's files, removed (force)
};

/// Reads llm.c checkpoint `bin` and writes `out_dir`/config.yaml (the GPT, token data with placeholder paths,
/// train_gpt2.c's optimizer) and `out_dir`/model.safetensors, each atomically, with the folder's manifest
/// (core/ownership.h). `out_dir` must be new or empty, or an earlier import, which `force` replaces; anything else
/// (another command's output, other files) is a ConfigError, as is a vocabulary past uint16 token ids. A file that is
/// not a valid checkpoint is a DataError naming it. `tokenizer` (a gpt2_tokenizer.bin, a tokenizer.json or a
/// SentencePiece model; "" for none) is copied into the folder under its own name and named by the config's
/// data.tokenizer, so that `generate` prints text; one that does not load, or has more tokens than the model's
/// vocabulary, is a ConfigError.
LlmcImport import_llmc(const std::string& bin, const std::string& out_dir, bool force = false,
                       const std::string& tokenizer = "");

/// Writes the weights `checkpoint` names (as `gputrain eval --checkpoint` takes them) of the GPT in `config` as an
/// llm.c checkpoint `out` (version 3, or 5 with bf16), atomically. Only the config's model section is read, and
/// train.lora: a model with LoRA adapters is written with them folded in when `merge_lora` (llm.c's format holds
/// none), and refused otherwise. A model that is not llm.c's GPT-2 layout is a ConfigError naming the first layer that
/// differs. Returns one summary line.
std::string export_llmc(const std::string& config, const std::vector<std::string>& sets, const std::string& checkpoint,
                        const std::string& out, bool bf16, bool merge_lora = false);

/// The weights file `weights` of a run whose config.resolved.yaml is `resolved_config`, with every LoRA adapter
/// folded into its weight (W + α/r · B·A, in f64 and rounded once) and dropped: the tensors of the plain model, which
/// computes what the adapted one computed. A ConfigError when the model has no adapter.
std::vector<std::pair<std::string, Tensor>> merged_lora_weights(const std::string& resolved_config,
                                                                const std::string& weights);

}  // namespace gt
