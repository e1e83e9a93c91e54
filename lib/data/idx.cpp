// IDX files (the MNIST family's format), plain or gzip-compressed, through zlib.
#include "data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace gt {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// Reads up to n bytes; returns how many there were before the end of the file.
size_t read_up_to(gzFile f, void* dst, size_t n, const std::string& path) {
  auto* p = static_cast<uint8_t*>(dst);
  size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    const int got = gzread(f, p + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* err = gzerror(f, &code);
      std::string msg = err ? err : "zlib error";
      if (msg.rfind(path + ": ", 0) == 0) msg.erase(0, path.size() + 2);  // zlib prefixes the path
      throw DataError(fmt::format("{}: cannot read: {}", path, msg));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

bool read_exact(gzFile f, void* dst, size_t n, const std::string& path) { return read_up_to(f, dst, n, path) == n; }

}  // namespace

IdxArray read_idx_file(const std::string& path) {
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  uint8_t magic[4];
  if (!read_exact(f.get(), magic, 4, path)) throw DataError(fmt::format("{}: empty or truncated IDX header", path));
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] == 0 || magic[3] > 4)
    throw DataError(fmt::format("{}: not an unsigned-byte IDX file (magic {:02x} {:02x} {:02x} {:02x}, expected "
                                "00 00 08 0N with N in 1..4)",
                                path, magic[0], magic[1], magic[2], magic[3]));
  IdxArray out;
  size_t total = 1;
  for (int d = 0; d < magic[3]; ++d) {
    uint8_t be[4];
    if (!read_exact(f.get(), be, 4, path)) throw DataError(fmt::format("{}: truncated IDX header", path));
    const int64_t dim = (int64_t{be[0]} << 24) | (be[1] << 16) | (be[2] << 8) | be[3];
    if (dim <= 0 || dim > (int64_t{1} << 31)) throw DataError(fmt::format("{}: dimension {} is {}", path, d, dim));
    out.dims.push_back(dim);
    // Checked before multiplying: dimensions 2^31, 8, 2^30 would wrap around to 0 bytes.
    if (total > (size_t{1} << 36) / static_cast<size_t>(dim))
      throw DataError(fmt::format("{}: IDX header claims over 64 GiB of data", path));
    total *= static_cast<size_t>(dim);
  }
  // The buffer grows as data arrives, so a header that promises more than the file holds costs no more memory
  // than the file: chunks start at 1 MiB and double up to 64 MiB (a 64 MiB first chunk made every truncated
  // file cost a 64 MiB memset, which slowed fuzz_idx over tenfold).
  size_t have = 0;
  while (have < total) {
    const size_t chunk = std::min(total - have, std::clamp(have, size_t{1} << 20, size_t{64} << 20));
    if (out.data.capacity() < have + chunk) out.data.reserve(std::min(total, std::max(have + chunk, 2 * have)));
    out.data.resize(have + chunk);
    const size_t got = read_up_to(f.get(), out.data.data() + have, chunk, path);
    have += got;
    if (got < chunk)
      throw DataError(
          fmt::format("{}: truncated: the header promises {} bytes of data, the file has {}", path, total, have));
  }
  return out;
}

Dataset read_idx(const std::string& images_path, const std::string& labels_path, float scale) {
  const IdxArray images = read_idx_file(images_path);
  const IdxArray labels = read_idx_file(labels_path);
  if (images.dims.size() < 2 || images.dims.size() > 4)
    throw DataError(fmt::format("{}: expected images of shape [N, H, W] (or [N, C, H, W]), got {} dimensions",
                                images_path, images.dims.size()));
  if (labels.dims.size() != 1)
    throw DataError(fmt::format("{}: expected labels of shape [N], got {} dimensions", labels_path, labels.dims.size()));
  const int64_t n = images.dims[0];
  if (labels.dims[0] != n)
    throw DataError(fmt::format("{}: {} labels for {} images in {}", labels_path, labels.dims[0], n, images_path));

  std::vector<int64_t> shape{n};
  if (images.dims.size() == 3) shape.push_back(1);  // [N, H, W] → [N, 1, H, W]
  shape.insert(shape.end(), images.dims.begin() + 1, images.dims.end());
  Dataset ds;
  ds.inputs = Tensor::empty(Shape(shape), DType::f32);
  float* x = ds.inputs.data<float>();
  for (size_t i = 0; i < images.data.size(); ++i) x[i] = static_cast<float>(images.data[i]) * scale;
  check_finite(ds.inputs, images_path, scale);
  ds.targets = Tensor::empty(Shape{n}, DType::i32);
  int32_t* y = ds.targets.data<int32_t>();
  int32_t max_label = 0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = labels.data[static_cast<size_t>(i)];
    max_label = std::max(max_label, y[i]);
  }
  ds.num_classes = max_label + 1;
  ds.source = images_path;
  ds.labels_source = labels_path;
  return ds;
}

}  // namespace gt
