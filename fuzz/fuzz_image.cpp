// Fuzz target: the image decoders (gt::decode_image: libpng and libjpeg-turbo behind error handlers that return
// instead of exiting) and the resize and crop of the decoded image into a sample.
// Input: one byte of options (bit 0: RGB instead of grey; bit 1: resize to 8 × 8; bit 2: also center crop 4 × 4),
// then the file's bytes.
#include "data/images.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t options = data[0];
  gt::ImageSpec spec;
  spec.channels = options & 1 ? 3 : 1;
  try {
    // A smaller pixel limit than the reader's: the same code paths, without gigabyte allocations per input.
    const gt::DecodedImage img = gt::decode_image(data + 1, size - 1, spec.channels, "fuzz", int64_t{1} << 22);
    spec.height = img.height;
    spec.width = img.width;
    if (options & 2) spec.height = spec.width = spec.resize_h = spec.resize_w = 8;
    if (options & 4) spec.height = spec.width = spec.crop_h = spec.crop_w = 4;
    std::vector<float> out(static_cast<size_t>(spec.channels * spec.height * spec.width));
    gt::image_to_sample(img, spec, 1.0f / 255, "fuzz", out.data());
  } catch (const gt::Error&) {
  }
  return 0;
}
