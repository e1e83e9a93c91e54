// Image folders: listing DIR/<class>/<file>, decoding PNG (libpng's simplified API) and JPEG (libjpeg-turbo) with
// error handlers that return here instead of exiting, resizing and cropping into [C, H, W] samples, and the
// memory-mapped cache of the decoded set.
#include "data/images.h"

#include "core/atomic_file.h"
#include "core/checked.h"
#include "core/limits.h"

#include <fcntl.h>
#include <jpeglib.h>
#include <png.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

namespace gt {
namespace fs = std::filesystem;

std::string ImageSpec::key() const {
  return fmt::format("size {}x{} channels {} resize {}x{} center_crop {}x{}", height, width, channels, resize_h,
                     resize_w, crop_h, crop_w);
}

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

// ---- Listing.

bool image_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

struct ImageFile {
  std::string path;
  int32_t label = 0;
  int64_t bytes = 0, mtime_ns = 0;
};

struct Listing {
  std::string dir;
  std::vector<std::string> classes;
  std::vector<ImageFile> files;
};

std::vector<fs::path> sorted_entries(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(it->path());
  if (ec) throw DataError(fmt::format("{}: cannot list the folder: {}", dir.string(), ec.message()));
  std::sort(out.begin(), out.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  return out;
}

Listing list_folder(const std::string& dir) {
  Listing l;
  l.dir = dir;
  int64_t total_bytes = 0;
  for (const fs::path& class_dir : sorted_entries(dir)) {
    std::error_code ec;
    if (!fs::is_directory(class_dir, ec)) continue;  // a README or a label file beside the class folders
    if (static_cast<int64_t>(l.classes.size()) >= limits::kExtent.max)
      throw DataError(fmt::format("{}: more than {} class folders", dir, limits::kExtent.max));
    const auto label = static_cast<int32_t>(l.classes.size());
    l.classes.push_back(class_dir.filename().string());
    for (const fs::path& file : sorted_entries(class_dir)) {
      if (!image_extension(file)) continue;
      struct stat st {};
      if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        // Unreadable or not a file: counted as a bad file when decoding tries it.
        l.files.push_back({file.string(), label, -1, 0});
        continue;
      }
      const auto bytes = static_cast<int64_t>(st.st_size);
      const std::optional<int64_t> sum = checked_add(total_bytes, bytes);
      if (!sum) throw DataError(fmt::format("{}: the files' sizes add up past 64 bits", dir));
      total_bytes = *sum;
      l.files.push_back(
          {file.string(), label, bytes, int64_t{st.st_mtim.tv_sec} * 1000000000 + int64_t{st.st_mtim.tv_nsec}});
      if (static_cast<int64_t>(l.files.size()) > limits::kSamples.max)
        throw DataError(
            fmt::format("{}: more than {} image files ({})", dir, limits::kSamples.max, limits::kSamples.what));
    }
  }
  if (l.classes.empty())
    throw DataError(fmt::format("{}: no class folders (expected {}/<class>/<file>.png|.jpg|.jpeg)", dir, dir));
  if (l.files.empty())
    throw DataError(fmt::format("{}: no .png, .jpg or .jpeg files in its {} class folders", dir, l.classes.size()));
  return l;
}

std::vector<uint8_t> read_bytes(const ImageFile& f) {
  if (f.bytes < 0) throw DataError(fmt::format("{}: not a readable regular file", f.path));
  if (f.bytes == 0) throw DataError(fmt::format("{}: an empty file", f.path));
  if (f.bytes > kMaxImageFileBytes)
    throw DataError(
        fmt::format("{}: {} bytes, more than the {} an image file may have", f.path, f.bytes, kMaxImageFileBytes));
  const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(fmt::format("{}: cannot open: {}", f.path, std::strerror(errno)));
  std::vector<uint8_t> bytes(static_cast<size_t>(f.bytes));
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = errno;
      ::close(fd);
      throw DataError(fmt::format("{}: read {} of {} bytes: {}", f.path, got, bytes.size(),
                                  r < 0 ? std::strerror(err) : "the file shrank while being read"));
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  return bytes;
}

// A decoded set of one folder before it becomes a Dataset.
struct Decoded {
  Tensor inputs, targets;
  int64_t bad_files = 0;
};

// Decodes every file of `l` on every thread, each into its own slot; bad files are then squeezed out in order, so
// the result does not depend on the thread count.
Decoded decode_folder(const Listing& l, const ImageFolderOptions& opts) {
  const ImageSpec& spec = opts.image;
  const int64_t n = static_cast<int64_t>(l.files.size());
  const int64_t per = mul_sizes(mul_sizes(spec.channels, spec.height, "image size"), spec.width, "image size");
  const std::optional<int64_t> total = checked_mul(n, per);
  if (!total || *total > limits::kElements.max)
    throw DataError(fmt::format("{}: {} images of {} values each are more than {} values in memory ({})", l.dir, n, per,
                                limits::kElements.max, limits::kElements.what));
  Tensor x = Tensor::empty(Shape{n, spec.channels, spec.height, spec.width}, DType::f32);
  float* xp = x.data<float>();
  // What went wrong with file i: "" fine, else the message; `wrong_size` marks the errors no setting skips.
  std::vector<std::string> error(static_cast<size_t>(n));
  std::vector<char> wrong_size(static_cast<size_t>(n), 0);
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t i = 0; i < n; ++i) {
    const ImageFile& f = l.files[static_cast<size_t>(i)];
    try {
      const std::vector<uint8_t> bytes = read_bytes(f);
      const DecodedImage img = decode_image(bytes.data(), bytes.size(), spec.channels, f.path);
      try {
        image_to_sample(img, spec, opts.scale, f.path, xp + i * per);
      } catch (const DataError& e) {
        wrong_size[static_cast<size_t>(i)] = 1;
        error[static_cast<size_t>(i)] = e.what();
      }
    } catch (const std::exception& e) {  // DataError, or bad_alloc for one huge image among many
      error[static_cast<size_t>(i)] = e.what();
    }
  }
  for (int64_t i = 0; i < n; ++i)
    if (wrong_size[static_cast<size_t>(i)]) throw DataError(error[static_cast<size_t>(i)]);
  Decoded d;
  int64_t kept = 0;
  std::string first_bad;
  std::vector<int32_t> labels;
  labels.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const std::string& e = error[static_cast<size_t>(i)];
    if (!e.empty()) {
      if (opts.bad_file_error)
        throw DataError(fmt::format("{} (data.on_bad_file: error; `skip` leaves such files out)", e));
      if (d.bad_files++ == 0) first_bad = e;
      continue;
    }
    if (kept != i) std::memmove(xp + kept * per, xp + i * per, static_cast<size_t>(per) * sizeof(float));
    labels.push_back(l.files[static_cast<size_t>(i)].label);
    ++kept;
  }
  if (kept == 0)
    throw DataError(fmt::format("{}: none of its {} image files could be read (first: {})", l.dir, n, first_bad));
  if (d.bad_files > 0) {
    spdlog::warn("images: skipped a bad file: {}{}; data.on_bad_file: error stops at one instead", first_bad,
                 d.bad_files > 1
                     ? fmt::format(" ({} more bad files in {} skipped, not logged each)", d.bad_files - 1, l.dir)
                     : std::string());
    // A class left with no sample still has its output: the model is trained never to predict it, silently.
    std::vector<int64_t> files(l.classes.size(), 0), good(l.classes.size(), 0);
    for (const ImageFile& f : l.files) ++files[static_cast<size_t>(f.label)];
    for (const int32_t y : labels) ++good[static_cast<size_t>(y)];
    std::string empty;
    for (size_t c = 0; c < l.classes.size(); ++c)
      if (files[c] > 0 && good[c] == 0)
        empty += fmt::format("{}{} ({} file{})", empty.empty() ? "" : ", ", l.classes[c], files[c],
                             files[c] == 1 ? "" : "s");
    if (!empty.empty())
      spdlog::warn("images: in {}, every file of class {} was bad: the class has no samples to learn from", l.dir,
                   empty);
  }
  d.inputs = kept == n ? x : x.narrow0(kept).clone();
  d.targets = Tensor::empty(Shape{kept}, DType::i32);
  std::copy(labels.begin(), labels.end(), d.targets.data<int32_t>());
  check_finite(d.inputs, l.dir, opts.scale);
  return d;
}

Dataset make_dataset(const Listing& l, Decoded d) {
  Dataset ds;
  ds.inputs = std::move(d.inputs);
  ds.targets = std::move(d.targets);
  ds.num_classes = static_cast<int64_t>(l.classes.size());
  ds.class_names = l.classes;
  ds.bad_files = d.bad_files;
  ds.source = l.dir;
  ds.labels_source = l.dir;
  return ds;
}

// ---- The cache: a header (magic, version, the key, the CRC-32 of the payload, each split's N, C, H, W, bad files
// and class names), then the payload: each split's labels and inputs at 64-byte boundaries. It is read whole into
// memory (normalize writes to it; a file cut short under a run is a short read, not a signal), and checked as
// decoded data is: the checksum, the labels, every value finite.

constexpr char kCacheMagic[8] = {'G', 'T', 'I', 'M', 'G', 'C', 'A', 'C'};
constexpr uint64_t kCacheVersion = 2;  // 2: the payload's CRC-32 in the header

uint32_t payload_crc(const uint8_t* data, size_t bytes) {
  uLong crc = crc32_z(0, nullptr, 0);
  return static_cast<uint32_t>(crc32_z(crc, data, bytes));
}

// FNV-1a over what names the source: each split's folder, its files' paths, sizes and modification times.
uint64_t source_digest(const std::vector<const Listing*>& listings) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const Listing* l : listings) {
    mix(l->dir.data(), l->dir.size() + 1);
    for (const ImageFile& f : l->files) {
      mix(f.path.data(), f.path.size() + 1);
      mix(&f.bytes, sizeof f.bytes);
      mix(&f.mtime_ns, sizeof f.mtime_ns);
    }
  }
  return h;
}

std::string options_key(const ImageFolderOptions& opts, const std::string& train_dir, const std::string& test_dir) {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &opts.scale, sizeof scale_bits);
  return fmt::format("{}; scale bits {:08x}; train {}; test {}; libpng {}; libjpeg {}", opts.image.key(), scale_bits,
                     train_dir, test_dir, PNG_LIBPNG_VER_STRING, JPEG_LIB_VERSION);
}

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }
void put_str(std::string& s, const std::string& v) {
  put_u64(s, v.size());
  s += v;
}

// Reads the header; every read is bounds-checked (the file may be cut short, or not a cache at all).
struct CacheReader {
  const uint8_t* p;
  size_t size, pos = 0;
  bool ok = true;
  uint64_t u64() {
    uint64_t v = 0;
    if (size - pos < sizeof v) {
      ok = false;
      return 0;
    }
    std::memcpy(&v, p + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    if (!ok || n > size - pos) {
      ok = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(p + pos), n);
    pos += n;
    return s;
  }
};

struct SplitHeader {
  int64_t n = 0, c = 0, h = 0, w = 0, bad_files = 0;
  std::vector<std::string> classes;
};

void write_cache(const std::string& path, const std::string& options, uint64_t digest,
                 const std::vector<const Dataset*>& splits) {
  static const char zeros[64] = {};
  // The payload's checksum first (the header holds it), over the same bytes in the same order as written below.
  uLong crc = crc32_z(0, nullptr, 0);
  for (const Dataset* d : splits)
    for (const Tensor* t : {&d->targets, &d->inputs}) {
      crc = crc32_z(crc, static_cast<const Bytef*>(t->raw()), t->bytes());
      crc = crc32_z(crc, reinterpret_cast<const Bytef*>(zeros), align64(t->bytes()) - t->bytes());
    }
  std::string header(kCacheMagic, sizeof kCacheMagic);
  put_u64(header, kCacheVersion);
  put_str(header, options);
  put_u64(header, digest);
  put_u64(header, static_cast<uint32_t>(crc));
  put_u64(header, splits.size());
  for (const Dataset* d : splits) {
    for (int64_t v : {d->inputs.dim(0), d->inputs.dim(1), d->inputs.dim(2), d->inputs.dim(3), d->bad_files})
      put_u64(header, static_cast<uint64_t>(v));
    put_u64(header, d->class_names.size());
    for (const std::string& c : d->class_names) put_str(header, c);
  }
  // Every rank of a data-parallel run decodes the same folders and writes the same bytes here, processes and the
  // threads of one: a temporary of its own each, so no writer truncates another's, and whichever rename lands last
  // leaves the same file.
  AtomicFile f(path, fmt::format(".{}-{}.tmp", ::getpid(), std::hash<std::thread::id>{}(std::this_thread::get_id())));
  f.write(header);
  f.write(zeros, align64(header.size()) - header.size());
  for (const Dataset* d : splits)
    for (const Tensor* t : {&d->targets, &d->inputs}) {
      f.write(t->raw(), t->bytes());
      f.write(zeros, align64(t->bytes()) - t->bytes());
    }
  f.commit();
}

// The cached splits, or the reason the cache cannot serve (missing, unreadable, stale, damaged).
struct CacheRead {
  std::vector<Dataset> splits;
  std::string why_not;
  bool damaged = false;  ///< a cache of this build's format whose contents do not check: warned, not just logged
};

// The whole file into CPU storage, or the reason it could not be read.
std::shared_ptr<Storage> read_whole(int fd, size_t bytes, std::string& why_not) {
  auto storage = allocate_storage(std::max<size_t>(bytes, 1), Device::cpu());
  auto* p = static_cast<uint8_t*>(storage->ptr);
  for (size_t done = 0; done < bytes;) {
    const ssize_t got = ::pread(fd, p + done, bytes - done, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      why_not =
          got < 0 ? fmt::format("it cannot be read: {}", std::strerror(errno)) : "it was cut short while being read";
      return nullptr;
    }
    done += static_cast<size_t>(got);
  }
  return storage;
}

CacheRead read_cache(const std::string& path, const std::string& options, uint64_t digest,
                     const std::vector<const Listing*>& listings) {
  CacheRead r;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    r.why_not = errno == ENOENT ? "there is none yet" : fmt::format("it cannot be opened: {}", std::strerror(errno));
    return r;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(sizeof kCacheMagic)) {
    ::close(fd);
    r.why_not = "it is not a cache file (too short or not a regular file)";
    return r;
  }
  const auto bytes = static_cast<size_t>(st.st_size);
  const std::shared_ptr<Storage> storage = read_whole(fd, bytes, r.why_not);
  ::close(fd);
  if (!storage) return r;
  const auto* data = static_cast<const uint8_t*>(storage->ptr);
  CacheReader in{data, bytes};
  in.pos = sizeof kCacheMagic;
  if (std::memcmp(data, kCacheMagic, sizeof kCacheMagic) != 0) {
    r.why_not = "it is not a gputrain image cache (wrong magic)";
    return r;
  }
  if (const uint64_t v = in.u64(); v != kCacheVersion) {
    r.why_not = fmt::format("it has format version {}, this build writes {}", v, kCacheVersion);
    return r;
  }
  const std::string cached_options = in.str();
  const uint64_t cached_digest = in.u64();
  if (in.ok && cached_options != options) {
    r.why_not = fmt::format("it was made with other options ({}; now {})", cached_options, options);
    return r;
  }
  if (in.ok && cached_digest != digest) {
    r.why_not = "files in the folders were added, removed, changed or touched since it was written";
    return r;
  }
  r.damaged = true;  // from here on, a reason not to use it means the file is not what this build wrote
  const uint64_t crc = in.u64();
  const uint64_t count = in.u64();
  std::vector<SplitHeader> heads;
  for (uint64_t s = 0; in.ok && s < count && s < 2; ++s) {
    SplitHeader h;
    for (int64_t* v : {&h.n, &h.c, &h.h, &h.w, &h.bad_files}) *v = static_cast<int64_t>(in.u64());
    const uint64_t classes = in.u64();
    for (uint64_t c = 0; in.ok && c < classes; ++c) h.classes.push_back(in.str());
    heads.push_back(std::move(h));
  }
  if (!in.ok || count != listings.size()) {
    r.why_not = "its header is cut short or damaged";
    return r;
  }
  const size_t payload = align64(in.pos);
  if (payload > bytes || payload_crc(data + payload, bytes - payload) != crc) {
    r.why_not = "its contents do not match their checksum (the file was changed or damaged)";
    return r;
  }
  size_t pos = payload;
  for (size_t s = 0; s < heads.size(); ++s) {
    const SplitHeader& h = heads[s];
    const Listing& l = *listings[s];
    const std::optional<int64_t> values = checked_mul(checked_mul(checked_mul(h.n, h.c), h.h), h.w);
    if (!values || *values > limits::kElements.max || h.n <= 0 || h.classes != l.classes) {
      r.why_not = "its header is damaged";
      return r;
    }
    const size_t label_bytes = static_cast<size_t>(h.n) * sizeof(int32_t);
    const size_t input_bytes = static_cast<size_t>(*values) * sizeof(float);
    if (pos > bytes || align64(label_bytes) > bytes - pos || input_bytes > bytes - pos - align64(label_bytes)) {
      r.why_not = "it is cut short";
      return r;
    }
    Dataset ds;
    ds.targets = Tensor::over_storage(storage, pos, Shape{h.n}, DType::i32);
    pos += align64(label_bytes);
    ds.inputs = Tensor::over_storage(storage, pos, Shape{h.n, h.c, h.h, h.w}, DType::f32);
    pos += align64(input_bytes);
    const int32_t* y = ds.targets.data<int32_t>();
    for (int64_t i = 0; i < h.n; ++i)
      if (y[i] < 0 || y[i] >= static_cast<int64_t>(h.classes.size())) {
        r.why_not = "its labels are damaged";
        return r;
      }
    try {  // as every reader checks its decoded values: a NaN or Inf would train to nothing, silently
      check_finite(ds.inputs, path, 1.0f);
    } catch (const DataError& e) {
      r.why_not = e.what();
      return r;
    }
    ds.num_classes = static_cast<int64_t>(h.classes.size());
    ds.class_names = h.classes;
    ds.bad_files = h.bad_files;
    ds.source = l.dir;
    ds.labels_source = l.dir;
    r.splits.push_back(std::move(ds));
  }
  return r;
}

std::string class_list_text(const std::vector<std::string>& classes) {
  constexpr size_t kShown = 12;
  std::string out = "[";
  for (size_t i = 0; i < std::min(classes.size(), kShown); ++i) out += (i ? ", " : "") + classes[i];
  if (classes.size() > kShown) out += fmt::format(", … {} in all", classes.size());
  return out + "]";
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

void image_to_sample(const DecodedImage& img, const ImageSpec& spec, float scale, const std::string& name, float* out) {
  const int64_t c = img.channels;
  int64_t h = img.height, w = img.width;
  // Resized pixels, (H, W, C) floats; none when the file is used as it is (then the bytes convert exactly).
  std::vector<float> resized;
  if (spec.resize_h > 0) {
    int64_t rh = spec.resize_h, rw = spec.resize_w;
    if (rw == 0) {  // the shorter side to resize_h, the longer in proportion (truncated, as torchvision does)
      if (h <= w) {
        rw = std::max<int64_t>(
            1, static_cast<int64_t>(static_cast<double>(rh) * static_cast<double>(w) / static_cast<double>(h)));
      } else {
        rw = rh;
        rh = std::max<int64_t>(
            1, static_cast<int64_t>(static_cast<double>(rw) * static_cast<double>(h) / static_cast<double>(w)));
      }
    }
    const std::optional<int64_t> values = checked_mul(checked_mul(rh, rw), c);
    if (!values || *values > kMaxImagePixels * 3)
      throw DataError(fmt::format("{}: resizing {} × {} gives {} × {}, too large", name, h, w, rh, rw));
    if (rh != h || rw != w) {
      resized.resize(static_cast<size_t>(*values));
      // Bilinear with pixel centres aligned (align_corners = false): source y = (y + 0.5)·h/rh − 0.5, clamped.
      const double sy = static_cast<double>(h) / static_cast<double>(rh);
      const double sx = static_cast<double>(w) / static_cast<double>(rw);
      for (int64_t y = 0; y < rh; ++y) {
        const double fy = std::clamp((static_cast<double>(y) + 0.5) * sy - 0.5, 0.0, static_cast<double>(h - 1));
        const auto y0 = static_cast<int64_t>(fy);
        const int64_t y1 = std::min(y0 + 1, h - 1);
        const double wy = fy - static_cast<double>(y0);
        for (int64_t x = 0; x < rw; ++x) {
          const double fx = std::clamp((static_cast<double>(x) + 0.5) * sx - 0.5, 0.0, static_cast<double>(w - 1));
          const auto x0 = static_cast<int64_t>(fx);
          const int64_t x1 = std::min(x0 + 1, w - 1);
          const double wx = fx - static_cast<double>(x0);
          for (int64_t k = 0; k < c; ++k) {
            auto px = [&](int64_t yy, int64_t xx) {
              return static_cast<double>(img.pixels[static_cast<size_t>((yy * w + xx) * c + k)]);
            };
            const double v =
                (1 - wy) * ((1 - wx) * px(y0, x0) + wx * px(y0, x1)) + wy * ((1 - wx) * px(y1, x0) + wx * px(y1, x1));
            resized[static_cast<size_t>((y * rw + x) * c + k)] = static_cast<float>(v);
          }
        }
      }
      h = rh;
      w = rw;
    }
  }
  int64_t top = 0, left = 0, oh = h, ow = w;
  if (spec.crop_h > 0) {
    if (spec.crop_h > h || spec.crop_w > w)
      throw DataError(fmt::format("{}: {} × {}{} is smaller than data.image.center_crop [{}, {}]", name, h, w,
                                  resized.empty() ? "" : " after resizing", spec.crop_h, spec.crop_w));
    top = (h - spec.crop_h + 1) / 2;  // round((h − crop)/2), as torchvision's center_crop
    left = (w - spec.crop_w + 1) / 2;
    oh = spec.crop_h;
    ow = spec.crop_w;
  }
  if (oh != spec.height || ow != spec.width)
    throw DataError(fmt::format("{}: the image is {} × {}{}, not data.image.size [{}, {}]{}", name, oh, ow,
                                resized.empty() && spec.crop_h == 0 ? "" : " after resize and crop", spec.height,
                                spec.width, spec.resize_h == 0 ? " (data.image.resize makes every image fit)" : ""));
  for (int64_t k = 0; k < c; ++k)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x = 0; x < ow; ++x) {
        const size_t at = static_cast<size_t>(((y + top) * w + (x + left)) * c + k);
        // As every reader scales: the pixel as a float, times scale.
        const float v = resized.empty() ? static_cast<float>(img.pixels[at]) : resized[at];
        out[(k * oh + y) * ow + x] = v * scale;
      }
}

void read_image_folders(const std::string& train_dir, const std::string& test_dir, const ImageFolderOptions& opts,
                        Dataset& train, Dataset& test) {
  const auto start = std::chrono::steady_clock::now();
  const Listing train_list = list_folder(train_dir);
  std::optional<Listing> test_list;
  if (!test_dir.empty()) {
    test_list = list_folder(test_dir);
    if (test_list->classes != train_list.classes)
      throw DataError(
          fmt::format("the test folder {} has the classes {} but the training folder {} has {}: both "
                      "must hold the same class folders",
                      test_dir, class_list_text(test_list->classes), train_dir, class_list_text(train_list.classes)));
  }
  std::vector<const Listing*> listings{&train_list};
  if (test_list) listings.push_back(&*test_list);
  const std::string options = options_key(opts, train_dir, test_dir);
  const uint64_t digest = source_digest(listings);
  if (!opts.cache.empty()) {
    CacheRead cached = read_cache(opts.cache, options, digest, listings);
    if (cached.why_not.empty()) {
      train = std::move(cached.splits.at(0));
      if (test_list) test = std::move(cached.splits.at(1));
      spdlog::info("images: {} from cache {}", train.size() + test.size(), opts.cache);
      if (train.bad_files + test.bad_files > 0)  // said at every run, as a decode would say it
        spdlog::warn("images: {} bad files were skipped when the cache {} was made (decode without it to see them)",
                     train.bad_files + test.bad_files, opts.cache);
      return;
    }
    if (cached.damaged)
      spdlog::warn("images: the cache {} is damaged ({}); decoding the folders again and rewriting it", opts.cache,
                   cached.why_not);
    else
      spdlog::info("images: decoding, not reading the cache {}: {}", opts.cache, cached.why_not);
  }
  train = make_dataset(train_list, decode_folder(train_list, opts));
  if (test_list) test = make_dataset(*test_list, decode_folder(*test_list, opts));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("images: {} decoded from {} in {:.3f} s ({} classes{})", train.size() + test.size(),
               test_list ? train_dir + " and " + test_dir : train_dir, seconds, train.num_classes,
               train.bad_files + test.bad_files > 0
                   ? fmt::format(", {} bad files skipped", train.bad_files + test.bad_files)
                   : std::string());
  if (opts.cache.empty()) return;
  std::vector<const Dataset*> splits{&train};
  if (test_list) splits.push_back(&test);
  try {
    write_cache(opts.cache, options, digest, splits);
  } catch (const Error& e) {
    spdlog::warn("images: could not write the cache: {}; the next run decodes again", e.what());
  }
}

bool is_image_cache(const std::string& path) {
  char magic[sizeof kCacheMagic] = {};
  std::ifstream in(path, std::ios::binary);
  return in.read(magic, sizeof magic) && std::memcmp(magic, kCacheMagic, sizeof magic) == 0;
}

void normalize_inputs(Dataset& data, const NormalizeSpec& spec) {
  if (!spec.any() || data.size() == 0) return;
  const Shape shape = data.inputs.shape();
  const int64_t channels = shape.rank() >= 2 ? shape[1] : 1;
  if (channels != static_cast<int64_t>(spec.mean.size()))
    throw ConfigError(fmt::format("{}: {} values, but the samples of {} have {} channel{}", spec.where,
                                  spec.mean.size(), data.source, channels, channels == 1 ? "" : "s"));
  const int64_t per = channels > 0 ? shape.numel() / shape[0] / channels : 0;
  float* x = data.inputs.data<float>();
  const int64_t n = shape[0];
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < channels; ++c) {
      const double m = spec.mean[static_cast<size_t>(c)], s = spec.std[static_cast<size_t>(c)];
      float* v = x + (i * channels + c) * per;
      for (int64_t j = 0; j < per; ++j) v[j] = static_cast<float>((static_cast<double>(v[j]) - m) / s);
    }
}

}  // namespace gt
