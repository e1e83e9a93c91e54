// llm.c interchange commands: checkpoint file ↔ experiment folder (config.yaml + model.safetensors).
#include "train/llmc.h"

#include "core/atomic_file.h"
#include "core/ownership.h"
#include "data/tokens.h"
#include "graph/model.h"
#include "io/llmc.h"
#include "io/safetensors.h"
#include "text/load.h"
#include "train/checkpoint.h"
#include "train/experiment.h"
#include "train/resume.h"
#include "train/run_dir.h"
#include "train/settings.h"
#include "train/setup.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace gt {
namespace fs = std::filesystem;

namespace {

/// `text` with only [A-Za-z0-9._-] kept (others become '_'), at most `max` characters: safe in a YAML comment or
/// as a run name whatever the file was called.
std::string plain(const std::string& text, size_t max) {
  std::string s;
  for (const char c : text.substr(0, max))
    s += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ? c : '_';
  return s;
}

}  // namespace

LlmcImport import_llmc(const std::string& bin, const std::string& out_dir, bool force, const std::string& tokenizer) {
  const fs::path dir = out_dir;
  LlmcImport r;
  r.config = (dir / "config.yaml").string();
  r.weights = (dir / "model.safetensors").string();
  // The folder is this import's: new or empty, or an earlier import replaced (--force); the checkpoint is never one
  // of the files replaced.
  check_output_folder("--out", out_dir, Owner::import, force ? Reuse::replace : Reuse::never, "--force replaces it");
  refuse_input_inside("--out", out_dir, {bin});
  if (!tokenizer.empty()) refuse_input_inside("--out", out_dir, {tokenizer});
  const LlmcCheckpoint c = read_llmc(bin);
  const LlmcHeader& h = c.header;
  const std::string stem = plain(fs::path(bin).stem().string(), 64);
  std::string config = llmc_config_yaml(h, "llmc_" + stem, plain(fs::path(bin).filename().string(), 120));
  // The tokenizer: loaded (a bad file stops here, before the folder is touched), then kept under its own tools' name.
  std::string tok_name;
  if (!tokenizer.empty()) {
    const std::unique_ptr<Tokenizer> tok = load_tokenizer(tokenizer);
    if (tok->vocab_size() > static_cast<uint32_t>(h.vocab_size))
      throw ConfigError(fmt::format("--tokenizer {}: {} tokens, more than the model's vocabulary of {}", tokenizer,
                                    tok->vocab_size(), h.vocab_size));
    tok_name = tok->file_name();
    const std::string line = fmt::format("  vocab_size: {}\n", h.vocab_size);
    config.insert(config.find(line) + line.size(),
                  fmt::format("  tokenizer: {}  # the tokenizer given to import\n",
                              fs::absolute(dir / tok_name).lexically_normal().string()));
  }
  try {  // the GPT as `gputrain check` would size it: a checkpoint within llm.c's limits may still exceed gputrain's
    const ConfigNode root = ConfigNode::load_string(config, r.config);
    Model::build(parse_model_spec(root["model"]), Shape{h.max_seq_len}, DType::f32, Device::cpu(), 0,
                 /*init_params=*/false);
  } catch (const ConfigError& e) {
    throw DataError(fmt::format("{}: a GPT of these sizes is more than gputrain takes: {}", bin, e.what()));
  }
  // llm.c's GPT-2 checkpoints go with its GPT-2 data, uint16 token shards: a larger vocabulary has no data here.
  if (h.vocab_size > limits::kUint16Vocab)
    throw ConfigError(
        fmt::format("{}: a vocabulary of {} tokens; gputrain takes at most {} (llm.c's GPT-2 data holds "
                    "uint16 tokens)",
                    bin, h.vocab_size, limits::kUint16Vocab));
  r.replaced =
      claim_output_folder("--out", out_dir, Owner::import, force ? Reuse::replace : Reuse::never, "--force replaces it")
          .removed;
  std::vector<std::string> files{"config.yaml", "model.safetensors"};
  if (!tok_name.empty()) files.push_back(tok_name);
  write_manifest(out_dir, Owner::import, files, false);
  if (!tok_name.empty()) {
    std::ifstream in(tokenizer, std::ios::binary);
    write_file_atomic((dir / tok_name).string(),
                      std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
  }
  const auto named = llmc_to_named(c);
  std::vector<std::pair<std::string, const Tensor*>> list;
  for (const auto& [name, t] : named) {
    list.emplace_back(name, &t);
    r.params += t.numel();
  }
  write_safetensors(r.weights, list, {{"format", "pt"}, {"gputrain_version", GPUTRAIN_VERSION}, {"source", "llm.c"}});
  write_file_atomic(r.config, config);
  write_manifest(out_dir, Owner::import, files, true);
  r.summary = fmt::format(
      "{}: llm.c GPT-2 (version {}, {}), {} layers, {} heads, {} channels, vocabulary {} padded to {}, {} positions, "
      "{} parameters → {}, {}",
      bin, h.version, h.version == 5 ? "bf16" : "f32", h.num_layers, h.num_heads, h.channels, h.vocab_size,
      h.padded_vocab_size, h.max_seq_len, r.params, r.config, r.weights);
  return r;
}

std::string export_llmc(const std::string& config, const std::vector<std::string>& sets, const std::string& checkpoint,
                        const std::string& out, bool bf16, bool merge_lora) {
  refuse_output_file("--out", out, {config, checkpoint});
  const ConfigNode root = load_config(config, sets);
  root.require("model");
  // Only the model is needed (and train.lora, whose adapters the weights hold): sequences of one token build every
  // GPT (the sizes are in the layers' arguments), and no data file has to exist where the weights are converted.
  ModelSpec spec = parse_model_spec(root["model"]);
  if (root.has("train")) spec.lora = parse_lora_plan(root["train"]["lora"]);
  ModelSpec plain_spec = spec;  // the layout llm.c holds: the adapters folded in
  plain_spec.lora.reset();
  // The layout is checked before any memory is given to the parameters.
  llmc_gpt_header(Model::build(plain_spec, Shape{1}, DType::f32, Device::cpu(), 0, /*init_params=*/false),
                  bf16 ? 5 : 3);
  Model model = Model::build(spec, Shape{1}, DType::f32, Device::cpu(), 0);
  if (model.has_lora() && !merge_lora)
    throw ConfigError(
        fmt::format("{}: the model has LoRA adapters, which llm.c's format does not hold: --merge-lora "
                    "folds them into the weights",
                    config));
  const std::string weights = weights_file(checkpoint, CheckpointConfig{});
  refuse_output_file("--out", out, {weights});  // a folder's weights file, found only now
  load_weights(model, weights);
  model.merge_lora();
  const LlmcCheckpoint c = llmc_from_model(model, bf16 ? 5 : 3);
  write_llmc(out, c);
  const LlmcHeader& h = c.header;
  return fmt::format(
      "{}: GPT-2 with {} layers, {} heads, {} channels, vocabulary {} padded to {}, {} positions → {} "
      "(llm.c version {}, {})",
      weights, h.num_layers, h.num_heads, h.channels, h.vocab_size, h.padded_vocab_size, h.max_seq_len, out, h.version,
      bf16 ? "bf16" : "f32");
}

std::vector<std::pair<std::string, Tensor>> merged_lora_weights(const std::string& resolved_config,
                                                                const std::string& weights) {
  const Experiment exp = parse_experiment_without_data_files(ConfigNode::load_string(resolved_config, weights));
  Model model = Model::build(exp.model, model_input_shape(exp), DType::f32, Device::cpu(), exp.seed);
  if (!model.has_lora())
    throw ConfigError(
        fmt::format("--merge-lora: {} holds no LoRA adapters (its run's config has neither train.lora "
                    "nor a layer's lora:)",
                    weights));
  load_weights(model, weights);
  model.merge_lora();
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : model.state_tensors()) out.emplace_back(name, *t);
  return out;
}

}  // namespace gt
