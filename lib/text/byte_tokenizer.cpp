// Byte-level tokens, and the descriptor that says a folder holds them.
#include "text/byte_tokenizer.h"

#include "core/error.h"
#include "core/json_read.h"

#include <fmt/format.h>

namespace gt {

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
  return ids;
}

std::string ByteTokenizer::token_bytes(uint32_t id) const {
  if (id >= 256) throw DataError(fmt::format("token {}: not below the byte vocabulary's 256", id));
  return std::string(1, static_cast<char>(id));
}

bool is_byte_descriptor(const std::string& text) {
  JsonValue v;
  try {
    v = json_read_object(text);
  } catch (const JsonReadError&) {
    return false;
  }
  const JsonValue* type = v.find("type");
  return type && type->is_string() && type->string == "bytes";
}

}  // namespace gt
