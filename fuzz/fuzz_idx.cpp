// Fuzz target: the IDX reader (gt::read_idx) on an image file and a label file, plain or gzip-compressed.
// Input: two little-endian bytes giving the image file's length, the image file, then the label file.
#include "data/dataset.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gt::fuzz::ScratchFile images("images.idx"), labels("labels.idx");
  const auto [a, b] = gt::fuzz::split_two(data, size);
  images.write(a);
  labels.write(b);
  try {
    gt::read_idx(images.path(), labels.path(), 1.0f / 255);
  } catch (const gt::Error&) {
  }
  return 0;
}
