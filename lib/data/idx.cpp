// IDX files (the MNIST family's format), plain or gzip-compressed, through zlib.
#include "data/dataset.h"

#include "core/noncopyable.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

namespace gt {
namespace {

// A file read to its very end: through zlib's inflate when it starts with the gzip magic (1f 8b), else as it is.
// gzread stopped where the caller stopped, so a corrupt CRC or length in the gzip trailer, and any bytes after the
// data the header promised, went unseen; `finish` reads on to the end and checks both.
class ByteSource : NonCopyable {
 public:
  explicit ByteSource(const std::string& path) : m_path(path), m_in(path, std::ios::binary) {
    if (!m_in) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    fill();
    m_gzip = m_z.avail_in >= 2 && m_buf[0] == 0x1f && m_buf[1] == 0x8b;
    if (m_gzip && inflateInit2(&m_z, 15 + 16) != Z_OK)  // 15-bit window, gzip wrapper only
      throw DataError(fmt::format("{}: cannot read: zlib could not start", path));
  }
  ~ByteSource() {
    if (m_gzip) inflateEnd(&m_z);
  }

  // Up to n bytes; fewer only where the data ends.
  size_t read(uint8_t* dst, size_t n) {
    if (!m_gzip) {
      size_t done = 0;
      while (done < n) {
        if (m_z.avail_in == 0 && !fill()) break;
        const size_t k = std::min<size_t>(n - done, m_z.avail_in);
        std::memcpy(dst + done, m_z.next_in, k);
        m_z.next_in += k;
        m_z.avail_in -= static_cast<uInt>(k);
        done += k;
      }
      return done;
    }
    size_t done = 0;
    while (done < n && !m_ended) {
      if (m_z.avail_in == 0 && !fill()) break;  // the compressed file ends inside a member: truncated
      const auto chunk = static_cast<uInt>(std::min<size_t>(n - done, 1u << 30));
      m_z.next_out = dst + done;
      m_z.avail_out = chunk;
      const int r = inflate(&m_z, Z_NO_FLUSH);  // checks the CRC-32 and ISIZE of a member as it ends
      done += chunk - m_z.avail_out;
      if (r == Z_STREAM_END) {
        next_member();
      } else if (r != Z_OK && r != Z_BUF_ERROR) {
        throw DataError(fmt::format("{}: cannot read: {}", m_path, m_z.msg ? m_z.msg : "zlib error"));
      }
    }
    return done;
  }

  // Reads to the end: nothing may follow the `promised` bytes of data, and a gzip stream must end whole.
  void finish(size_t promised) {
    uint8_t extra[256];
    if (size_t more = read(extra, sizeof extra); more > 0) {
      while (more > 0 && more < (size_t{1} << 30)) {  // count it, up to a bound: a message, not a scan of 10 GB
        const size_t got = read(extra, sizeof extra);
        if (got == 0) break;
        more += got;
      }
      throw DataError(fmt::format("{}: {}{} bytes after the {} bytes of data the header promises", m_path,
                                  more >= (size_t{1} << 30) ? "over " : "", more, promised));
    }
    if (m_gzip && !m_ended)
      throw DataError(fmt::format("{}: truncated gzip stream: it ends before its CRC and length", m_path));
  }

 private:
  bool fill() {
    m_in.read(reinterpret_cast<char*>(m_buf), sizeof m_buf);
    m_z.next_in = m_buf;
    m_z.avail_in = static_cast<uInt>(m_in.gcount());
    if (m_in.bad()) throw DataError(fmt::format("{}: cannot read: {}", m_path, std::strerror(errno)));
    return m_z.avail_in > 0;
  }

  // After a member: another one may follow (gzip allows concatenated members); anything else is refused.
  void next_member() {
    if (m_z.avail_in == 0 && !fill()) {
      m_ended = true;
      return;
    }
    if (m_z.next_in[0] != 0x1f)
      throw DataError(fmt::format("{}: data after the end of the gzip stream (not another gzip member)", m_path));
    if (inflateReset(&m_z) != Z_OK) throw DataError(fmt::format("{}: cannot read: zlib could not restart", m_path));
  }

  std::string m_path;
  std::ifstream m_in;
  uint8_t m_buf[1 << 16];
  z_stream m_z{};
  bool m_gzip = false, m_ended = false;
};

bool read_exact(ByteSource& f, void* dst, size_t n) { return f.read(static_cast<uint8_t*>(dst), n) == n; }

}  // namespace

IdxArray read_idx_file(const std::string& path) {
  auto owned = std::make_unique<ByteSource>(path);  // on the heap: its buffer is 64 KiB
  ByteSource& f = *owned;
  uint8_t magic[4];
  if (!read_exact(f, magic, 4)) throw DataError(fmt::format("{}: empty or truncated IDX header", path));
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] == 0 || magic[3] > 4)
    throw DataError(
        fmt::format("{}: not an unsigned-byte IDX file (magic {:02x} {:02x} {:02x} {:02x}, expected "
                    "00 00 08 0N with N in 1..4)",
                    path, magic[0], magic[1], magic[2], magic[3]));
  IdxArray out;
  size_t total = 1;
  for (int d = 0; d < magic[3]; ++d) {
    uint8_t be[4];
    if (!read_exact(f, be, 4)) throw DataError(fmt::format("{}: truncated IDX header", path));
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
  // Reserved at once when the file could hold it (deflate expands at most 1032-fold), so the 47 MB of a
  // Fashion-MNIST set are not copied through six doublings.
  std::error_code size_error;
  const uintmax_t file_bytes = std::filesystem::file_size(path, size_error);
  if (!size_error && total <= std::min<uintmax_t>(file_bytes, uintmax_t{1} << 36) * 1032) out.data.reserve(total);
  size_t have = 0;
  while (have < total) {
    const size_t chunk = std::min(total - have, std::clamp(have, size_t{1} << 20, size_t{64} << 20));
    if (out.data.capacity() < have + chunk) out.data.reserve(std::min(total, std::max(have + chunk, 2 * have)));
    out.data.resize(have + chunk);
    const size_t got = f.read(out.data.data() + have, chunk);
    have += got;
    if (got < chunk)
      throw DataError(
          fmt::format("{}: truncated: the header promises {} bytes of data, the file has {}", path, total, have));
  }
  f.finish(total);
  return out;
}

Dataset read_idx(const std::string& images_path, const std::string& labels_path, float scale) {
  const IdxArray images = read_idx_file(images_path);
  const IdxArray labels = read_idx_file(labels_path);
  if (images.dims.size() < 2 || images.dims.size() > 4)
    throw DataError(fmt::format("{}: expected images of shape [N, H, W] (or [N, C, H, W]), got {} dimensions",
                                images_path, images.dims.size()));
  if (labels.dims.size() != 1)
    throw DataError(
        fmt::format("{}: expected labels of shape [N], got {} dimensions", labels_path, labels.dims.size()));
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
