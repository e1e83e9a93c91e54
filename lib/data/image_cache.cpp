// The cache of a decoded image set (data.cache): written after a decode, read instead of one while the folders and
// options match, and checked as decoded data is.
#include "data/image_cache.h"

#include "core/atomic_file.h"
#include "core/checked.h"
#include "core/limits.h"

#include <fcntl.h>
#include <jpeglib.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

namespace gt {

namespace {

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

}  // namespace

namespace image_detail {

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

}  // namespace image_detail

bool is_image_cache(const std::string& path) {
  char magic[sizeof kCacheMagic] = {};
  std::ifstream in(path, std::ios::binary);
  return in.read(magic, sizeof magic) && std::memcmp(magic, kCacheMagic, sizeof magic) == 0;
}

}  // namespace gt
