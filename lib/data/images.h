// Image folders (`data.format: images`): PNG and JPEG files under DIR/<class>/, decoded with libpng and
// libjpeg-turbo into [N, C, H, W] f32 samples, the checksummed cache of a decoded set (`data.cache`), and the
// per-channel normalisation of image samples (`data.normalize`).
#pragma once

#include "data/dataset.h"

#include <cstdint>
#include <string>
#include <vector>

namespace gt {

/// data.image: what every sample becomes. Order: decode, resize, center crop; the result must be size.
struct ImageSpec {
  int64_t height = 0, width = 0;       ///< size: every sample's [H, W]
  int64_t channels = 3;                ///< 1: grey, 3: RGB (a file of the other kind is converted)
  int64_t resize_h = 0, resize_w = 0;  ///< resize: [H, W] exactly; resize_w 0: the shorter side to resize_h; 0: none
  int64_t crop_h = 0, crop_w = 0;      ///< center_crop [H, W]; 0: none
  /// The options as one line (the cache's key holds it).
  std::string key() const;
};

/// data.normalize: x = (x − mean[c]) / std[c] per channel, after data.scale. Empty: off.
struct NormalizeSpec {
  std::vector<double> mean, std;
  std::string where;  ///< "data.normalize.mean (exp.yaml:12:11)", for a channel count known only at load time
  bool any() const { return !mean.empty(); }
};

/// One decoded image: rows of interleaved channels, (H, W, C) bytes.
struct DecodedImage {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

/// The most pixels a file may declare; one claiming more is a bad file (a 1 KiB hostile PNG can claim 2^31 × 2^31).
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;
/// The most bytes one image file may have.
inline constexpr int64_t kMaxImageFileBytes = int64_t{1} << 30;

/// Decodes a PNG or a JPEG (told apart by their signatures) held in memory into `channels` (1 or 3) channels. A
/// corrupt, truncated or unsupported file, or one declaring more than `max_pixels`, throws DataError naming `name`.
/// libpng and libjpeg report errors here through handlers that return to this function: nothing exits or aborts.
DecodedImage decode_image(const uint8_t* data, size_t size, int64_t channels, const std::string& name,
                          int64_t max_pixels = kMaxImagePixels);

/// Makes `img` the sample of `spec`: resize (bilinear, pixel centres aligned as PIL and torchvision do without
/// antialiasing), center crop, then the size it must have, written as [C, H, W] floats × scale into `out`
/// (C·H·W floats). Throws DataError naming `name` when the result is not spec's size.
void image_to_sample(const DecodedImage& img, const ImageSpec& spec, float scale, const std::string& name, float* out);

/// How read_image_folders reads.
struct ImageFolderOptions {
  ImageSpec image;
  float scale = 1;
  bool bad_file_error = false;  ///< data.on_bad_file: error — a bad file stops the run, naming it
  std::string cache;            ///< data.cache: "" for none
};

/// Reads the training folder and, when `test_dir` is not "", the test folder: DIR/<class>/<file>.png|.jpg|.jpeg,
/// classes and files in name order, labels the class's index. The test folder's classes must be the training
/// folder's. Decodes on every thread; bad files are skipped (one warning per folder, the rest counted in
/// Dataset::bad_files) or, under bad_file_error, a DataError naming the file. With a cache, a file whose key matches
/// the folders and options is read instead of decoding, once its checksum, labels and values check; anything else is
/// decoded and (re)written, with a warning when the cache was damaged (a checksum, a NaN or Inf, a cut).
void read_image_folders(const std::string& train_dir, const std::string& test_dir, const ImageFolderOptions& opts,
                        Dataset& train, Dataset& test);

/// Whether `path` is a file gputrain's image cache wrote (its magic), of any format version: the only kind of file
/// data.cache may replace.
bool is_image_cache(const std::string& path);

/// Applies `spec` to the inputs [N, C, ...] of `data` (once, at load time). A channel count other than the
/// number of means is a ConfigError naming spec.where.
void normalize_inputs(Dataset& data, const NormalizeSpec& spec);

}  // namespace gt
