// Fuzz target: the checkpoint state reader (gt::parse_state_json) and its checksum check (gt::check_state_checksum),
// which `--resume`, `eval` and `export` trust with state.json files from anywhere.
#include "core/error.h"
#include "train/checkpoint.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    gt::parse_state_json(std::string(reinterpret_cast<const char*>(data), size), "state.json");
  } catch (const gt::Error&) {
  }
  try {
    gt::check_state_checksum(std::string(reinterpret_cast<const char*>(data), size), "state.json");
  } catch (const gt::Error&) {
  }
  return 0;
}
