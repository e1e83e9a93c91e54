// Decoding PNG (libpng's simplified API) and JPEG (libjpeg-turbo) with error handlers that return here instead of
// exiting.
#include "data/images.h"

#include "core/checked.h"

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstring>
#include <optional>

namespace gt {

namespace {

// ---- PNG: the simplified API keeps its own setjmp and reports failure in image.message; it never prints.

DecodedImage decode_png(const uint8_t* data, size_t size, int64_t channels, const std::string& name,
                        int64_t max_pixels) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, data, size))
    throw DataError(fmt::format("{}: not a readable PNG: {}", name, image.message));
  struct Free {
    png_image* p;
    ~Free() { png_image_free(p); }
  } free_on_exit{&image};
  const std::optional<int64_t> pixels = checked_mul(int64_t{image.width}, int64_t{image.height});
  if (!pixels || *pixels > max_pixels || *pixels == 0)
    throw DataError(
        fmt::format("{}: a PNG of {} × {} pixels (at most {} are read)", name, image.width, image.height, max_pixels));
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  DecodedImage out;
  out.height = image.height;
  out.width = image.width;
  out.channels = channels;
  // Zeroed: a file with alpha is composited onto this buffer (black), the same on every run.
  out.pixels.assign(PNG_IMAGE_SIZE(image), 0);
  if (!png_image_finish_read(&image, nullptr, out.pixels.data(), 0, nullptr))
    throw DataError(fmt::format("{}: corrupt PNG: {}", name, image.message));
  return out;
}

// ---- JPEG: libjpeg's default error_exit calls exit(); this one longjmps back into jpeg_decode_into. A warning
// (corrupt or missing data, which libjpeg would paper over with grey) counts as an error too.

struct JpegFailure {
  jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* f = reinterpret_cast<JpegFailure*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, f->message);
  std::longjmp(f->jump, 1);
}

void jpeg_emit(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_fail(cinfo);  // a warning: the data is corrupt
}

void jpeg_quiet(j_common_ptr) {}

// A progressive JPEG of thousands of scans takes seconds per file (libjpeg-turbo's own fuzzers cap scans too).
struct JpegProgress {
  jpeg_progress_mgr mgr;  // first
  JpegFailure* failure;
};
constexpr int kMaxJpegScans = 500;

void jpeg_progress(j_common_ptr cinfo) {
  auto* p = reinterpret_cast<JpegProgress*>(cinfo->progress);
  if (cinfo->is_decompressor && reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > kMaxJpegScans) {
    std::snprintf(p->failure->message, sizeof p->failure->message, "more than %d scans", kMaxJpegScans);
    std::longjmp(p->failure->jump, 1);
  }
}

struct JpegJob {
  jpeg_decompress_struct cinfo;
  JpegFailure failure;
  JpegProgress progress;
  const uint8_t* data;
  size_t size;
  int64_t channels, max_pixels;
  DecodedImage out;
  bool too_big = false;
};

// Everything between setjmp and a longjmp lives in *job (no local is left to be clobbered); false on failure.
bool jpeg_decode_into(JpegJob* job) {
  if (setjmp(job->failure.jump)) return false;
  jpeg_create_decompress(&job->cinfo);
  jpeg_mem_src(&job->cinfo, job->data, static_cast<unsigned long>(job->size));
  job->cinfo.progress = &job->progress.mgr;
  jpeg_read_header(&job->cinfo, TRUE);
  const std::optional<int64_t> pixels = checked_mul(int64_t{job->cinfo.image_width}, int64_t{job->cinfo.image_height});
  if (!pixels || *pixels > job->max_pixels || *pixels == 0) {
    job->too_big = true;
    return false;
  }
  job->cinfo.out_color_space = job->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&job->cinfo);
  DecodedImage& out = job->out;
  out.height = job->cinfo.output_height;
  out.width = job->cinfo.output_width;
  out.channels = job->cinfo.output_components;
  const size_t stride = static_cast<size_t>(out.width * out.channels);
  out.pixels.assign(stride * static_cast<size_t>(out.height), 0);
  while (job->cinfo.output_scanline < job->cinfo.output_height) {
    JSAMPROW row = out.pixels.data() + stride * job->cinfo.output_scanline;
    jpeg_read_scanlines(&job->cinfo, &row, 1);
  }
  jpeg_finish_decompress(&job->cinfo);
  return true;
}

DecodedImage decode_jpeg(const uint8_t* data, size_t size, int64_t channels, const std::string& name,
                         int64_t max_pixels) {
  auto job = std::make_unique<JpegJob>();
  std::memset(&job->cinfo, 0, sizeof job->cinfo);
  job->cinfo.err = jpeg_std_error(&job->failure.mgr);
  job->failure.mgr.error_exit = jpeg_fail;
  job->failure.mgr.emit_message = jpeg_emit;
  job->failure.mgr.output_message = jpeg_quiet;
  job->failure.message[0] = '\0';
  job->progress.mgr.progress_monitor = jpeg_progress;
  job->progress.failure = &job->failure;
  job->data = data;
  job->size = size;
  job->channels = channels;
  job->max_pixels = max_pixels;
  const bool ok = jpeg_decode_into(job.get());
  const int64_t width = job->cinfo.image_width, height = job->cinfo.image_height;
  jpeg_destroy_decompress(&job->cinfo);
  if (job->too_big)
    throw DataError(fmt::format("{}: a JPEG of {} × {} pixels (at most {} are read)", name, width, height, max_pixels));
  if (!ok) throw DataError(fmt::format("{}: corrupt JPEG: {}", name, job->failure.message));
  if (job->out.channels != channels) throw DataError(fmt::format("{}: a JPEG of {} channels", name, job->out.channels));
  return std::move(job->out);
}

}  // namespace

DecodedImage decode_image(const uint8_t* data, size_t size, int64_t channels, const std::string& name,
                          int64_t max_pixels) {
  GT_CHECK(channels == 1 || channels == 3, "channels {}", channels);
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size == 0) throw DataError(fmt::format("{}: an empty file", name));
  if (size >= sizeof kPng && std::memcmp(data, kPng, sizeof kPng) == 0)
    return decode_png(data, size, channels, name, max_pixels);
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
    return decode_jpeg(data, size, channels, name, max_pixels);
  throw DataError(fmt::format("{}: neither a PNG nor a JPEG (its first bytes are not either signature)", name));
}

}  // namespace gt
