// Fuzz target: the llm.c checkpoint reader (gt::read_llmc: header validation, checked sizes, f32/bf16 payload),
// which `gputrain import llmc` trusts with model files from anywhere. Every checkpoint it accepts must give a config
// whose GPT builds (or is refused as too large) and maps back to the same header, and tensors that split into
// gputrain's parameters.
#include "fuzz_input.h"
#include "graph/model.h"
#include "io/llmc.h"

#include <optional>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gt::fuzz::ScratchFile file("model.bin");
  file.write({reinterpret_cast<const char*>(data), size});
  gt::LlmcCheckpoint c;
  try {
    c = gt::read_llmc(file.path());
  } catch (const gt::Error&) {
    return 0;
  }
  const gt::LlmcHeader& h = c.header;
  std::optional<gt::Model> built;
  try {  // sizes past gputrain's limits (core/limits.h) are a ConfigError here, which `import llmc` reports
    built.emplace(gt::Model::build(gt::parse_model_spec(gt::ConfigNode::load_string(gt::llmc_model_yaml(h), "fuzz")),
                                   gt::Shape{h.max_seq_len}, gt::DType::f32, gt::Device::cpu(), 0, false));
  } catch (const gt::ConfigError&) {
    return 0;
  }
  const gt::Model& m = *built;
  const gt::LlmcHeader back = gt::llmc_gpt_header(m, h.version);
  if (back.max_seq_len != h.max_seq_len || back.vocab_size != h.vocab_size || back.num_layers != h.num_layers ||
      back.num_heads != h.num_heads || back.channels != h.channels || back.padded_vocab_size != h.padded_vocab_size)
    __builtin_trap();
  int64_t params = 0;
  for (const auto& [name, t] : gt::llmc_to_named(c)) params += t.numel();
  if (params != m.param_count()) __builtin_trap();
  return 0;
}
