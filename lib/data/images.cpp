// Image folders: listing DIR/<class>/<file>, decoding every file on every thread (image_decode.cpp), resizing and
// cropping into [C, H, W] samples, the cache of the decoded set (image_cache.cpp), and normalisation.
#include "data/images.h"
#include "data/image_cache.h"

#include "core/checked.h"
#include "core/limits.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

namespace gt {
namespace fs = std::filesystem;
using namespace image_detail;

std::string ImageSpec::key() const {
  return fmt::format("size {}x{} channels {} resize {}x{} center_crop {}x{}", height, width, channels, resize_h,
                     resize_w, crop_h, crop_w);
}

namespace {

// ---- Listing.

bool image_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

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

}  // namespace

std::string image_detail::class_list_text(const std::vector<std::string>& classes) {
  constexpr size_t kShown = 12;
  std::string out = "[";
  for (size_t i = 0; i < std::min(classes.size(), kShown); ++i) out += (i ? ", " : "") + classes[i];
  if (classes.size() > kShown) out += fmt::format(", … {} in all", classes.size());
  return out + "]";
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