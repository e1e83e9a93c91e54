// Fuzz target: the safetensors reader (gt::read_safetensors), which `gputrain eval` and resuming trust with
// weights from anywhere.
#include "fuzz_input.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gt::fuzz::ScratchFile file("weights.safetensors");
  file.write({reinterpret_cast<const char*>(data), size});
  try {
    gt::read_safetensors(file.path());
  } catch (const gt::Error&) {
  }
  return 0;
}
