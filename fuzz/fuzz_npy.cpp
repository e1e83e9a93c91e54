// Fuzz target: the NPY reader (gt::read_npy_pair, which reads both files with gt::read_npy).
// Input: two little-endian bytes giving the inputs file's length, the inputs file, then the targets file.
#include "data/dataset.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gt::fuzz::ScratchFile inputs("inputs.npy"), targets("targets.npy");
  const auto [a, b] = gt::fuzz::split_two(data, size);
  inputs.write(a);
  targets.write(b);
  try {
    gt::read_npy_pair(inputs.path(), targets.path(), 0.5f);
  } catch (const gt::Error&) {
  }
  return 0;
}
