// Which tokenizer a file holds: JSON (gputrain's byte descriptor, or Hugging Face's tokenizer.json), llm.c's
// gpt2_tokenizer.bin, or a SentencePiece model (binary).
#include "text/load.h"

#include "core/error.h"
#include "core/json_read.h"
#include "text/byte_tokenizer.h"
#include "text/hf_bpe.h"
#include "text/llmc_tokenizer.h"
#include "text/sentencepiece.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gt {
namespace {

constexpr size_t kMaxTokenizerBytes = size_t{1} << 30;

std::string read_whole(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError(fmt::format("{}: {}", path,
                                  std::filesystem::exists(path, ec) ? "not a regular file" : "no such tokenizer file"));
  if (std::filesystem::file_size(path, ec) > kMaxTokenizerBytes)
    throw ConfigError(fmt::format("{}: larger than {} bytes: not a tokenizer", path, kMaxTokenizerBytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool looks_like_json(const std::string& bytes) {
  for (const char c : bytes) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    return c == '{';
  }
  return false;
}

std::unique_ptr<Tokenizer> json_tokenizer(const std::string& bytes, const std::string& path) {
  JsonValue v;
  try {
    v = json_read_object(bytes);
  } catch (const JsonReadError& e) {
    throw ConfigError(fmt::format("{}: not a tokenizer: {}", path, e.what()));
  }
  if (is_byte_descriptor(bytes)) {
    const JsonValue* n = v.find("vocab_size");
    if (n && !(n->integer && *n->integer == 256))
      throw ConfigError(fmt::format("{}: a byte descriptor whose vocab_size is {}, expected 256", path, n->text()));
    return std::make_unique<ByteTokenizer>();
  }
  // Hugging Face's tokenizer.json: an object with "model" (and "added_tokens", "pre_tokenizer", …).
  if (v.find("model")) return parse_hf_tokenizer(bytes, path);
  const JsonValue* type = v.find("type");
  throw ConfigError(fmt::format("{}: a JSON file that is no tokenizer gputrain reads{}", path,
                                type ? fmt::format(" (type {})", type->text()) : std::string()));
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const std::string bytes = read_whole(path);
  if (bytes.empty()) throw ConfigError(fmt::format("{}: an empty file: not a tokenizer", path));
  if (looks_like_json(bytes)) return json_tokenizer(bytes, path);
  // llm.c's gpt2_tokenizer.bin starts with its magic, 20240328 as a little-endian uint32; a SentencePiece model
  // (a protocol buffer) never does.
  constexpr unsigned char kLlmcMagic[4] = {0xC8, 0xD7, 0x34, 0x01};
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kLlmcMagic, 4) == 0) return load_llmc_tokenizer(path);
  return std::make_unique<SentencePieceTokenizer>(bytes, path);
}

std::string tokenizer_file_in(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* name : {"tokenizer.model", kByteDescriptorName, kOldByteDescriptorName})
    if (fs::is_regular_file(fs::path(dir) / name, ec)) return (fs::path(dir) / name).string();
  return "";
}

}  // namespace gt
