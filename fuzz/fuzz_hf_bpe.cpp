// Fuzz target: tokenizer.json files (gt::load_hf_tokenizer: the JSON, the model, normalizer and pre-tokenizers,
// regex patterns from the file) and the text encoded with what they give. Input: two parts (fuzz_input.h's
// split_two), the file and the text. Every tokenizer it accepts must encode without crashing or running away (the
// patterns' backtracking is bounded), give ids inside its vocabulary that decode, and give the same ids again from
// its word cache.
#include "core/error.h"
#include "fuzz_input.h"
#include "text/hf_bpe.h"

#include <memory>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gt::fuzz::ScratchFile file("tokenizer.json");
  const auto [json, text] = gt::fuzz::split_two(data, size);
  file.write(json);
  std::unique_ptr<gt::Tokenizer> tok;
  try {
    tok = gt::load_hf_tokenizer(file.path());
  } catch (const gt::ConfigError&) {
    return 0;
  }
  std::vector<uint32_t> ids;
  try {
    ids = tok->encode(text);
  } catch (const gt::DataError&) {  // a pattern past its backtracking limits
    return 0;
  }
  for (const uint32_t id : ids)
    if (id >= tok->vocab_size()) __builtin_trap();
  (void)tok->decode(ids);
  if (tok->encode(text) != ids) __builtin_trap();
  return 0;
}
