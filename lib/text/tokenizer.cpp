// The Tokenizer interface's shared part.
#include "text/tokenizer.h"

namespace gt {

std::string Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::string out;
  for (const uint32_t id : ids) out += token_bytes(id);
  return out;
}

}  // namespace gt
