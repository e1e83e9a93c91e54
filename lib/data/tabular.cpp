// CSV and NPY data files.
#include "core/map_guard.h"
#include "core/quote.h"
#include "data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace gt {
namespace {

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  for (char ch : line) {
    if (ch == ',') {
      out.push_back(field);
      field.clear();
    } else if (ch != '\r') {
      field += ch;
    }
  }
  out.push_back(field);
  for (auto& f : out) {  // trim spaces and tabs
    const size_t a = f.find_first_not_of(" \t"), b = f.find_last_not_of(" \t");
    f = a == std::string::npos ? "" : f.substr(a, b - a + 1);
  }
  return out;
}

bool parse_number(const std::string& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtod(s.c_str(), &end);
  // The whole string, not just up to a NUL byte: "1\0x" is not a number.
  return end == s.c_str() + s.size() && errno != ERANGE && std::isfinite(v);
}

struct NpyLayout {
  std::string descr;
  std::vector<int64_t> shape;
  size_t item = 0, count = 0;  ///< bytes per element, elements
  size_t offset = 0;           ///< where the data starts in the file
};

// Reads and checks an NPY header, and that the file holds exactly the data it promises; `in` is left at the data.
NpyLayout read_npy_layout(std::ifstream& in, const std::string& path) {
  if (!in) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw DataError(fmt::format("{}: not an NPY file (bad magic)", path));
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) throw DataError(fmt::format("{}: truncated NPY header", path));
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) throw DataError(fmt::format("{}: truncated NPY header", path));
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    throw DataError(fmt::format("{}: NPY format version {} is not supported (1 to 3 are)", path, major));
  }
  if (header_len > (1u << 20)) throw DataError(fmt::format("{}: NPY header of {} bytes", path, header_len));
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) throw DataError(fmt::format("{}: truncated NPY header", path));

  auto value_of = [&](const std::string& key) -> std::string {
    const size_t k = header.find("'" + key + "'");
    if (k == std::string::npos) throw DataError(fmt::format("{}: NPY header has no '{}'", path, key));
    const size_t colon = header.find(':', k);
    if (colon == std::string::npos) throw DataError(fmt::format("{}: malformed NPY header", path));
    return header.substr(colon + 1);
  };
  NpyLayout arr;
  {
    const std::string d = value_of("descr");
    const size_t q1 = d.find('\''), q2 = d.find('\'', q1 + 1);
    if (q1 == std::string::npos || q2 == std::string::npos) throw DataError(fmt::format("{}: malformed descr", path));
    arr.descr = d.substr(q1 + 1, q2 - q1 - 1);
  }
  if (value_of("fortran_order").find("True") < value_of("fortran_order").find(','))
    throw DataError(fmt::format("{}: Fortran-ordered arrays are not supported (save with np.ascontiguousarray)", path));
  {
    const std::string s = value_of("shape");
    const size_t open = s.find('('), close = s.find(')');
    if (open == std::string::npos || close == std::string::npos)
      throw DataError(fmt::format("{}: malformed shape in NPY header", path));
    std::stringstream ss(s.substr(open + 1, close - open - 1));
    for (std::string dim; std::getline(ss, dim, ',');) {
      if (dim.find_first_not_of(" ") == std::string::npos) continue;
      double v = 0;
      if (!parse_number(dim.substr(dim.find_first_not_of(" ")), v) || v < 0 || v != std::floor(v) || v > 1e12)
        throw DataError(fmt::format("{}: bad dimension {} in NPY shape", path, quote_value(dim)));
      arr.shape.push_back(static_cast<int64_t>(v));
    }
  }
  static const std::vector<std::pair<std::string, size_t>> kTypes = {{"<f4", 4}, {"<f8", 8}, {"|u1", 1},
                                                                     {"<u1", 1}, {"<i8", 8}, {"<i4", 4}};
  size_t item = 0;
  for (const auto& [name, size] : kTypes)
    if (arr.descr == name) item = size;
  if (!item)
    throw DataError(fmt::format("{}: NPY dtype '{}' is not supported (float32, float64, uint8, int32, int64 are)", path,
                                arr.descr));
  if (arr.shape.empty()) throw DataError(fmt::format("{}: a 0-dimensional array holds no samples", path));
  size_t count = 1;
  constexpr size_t kMaxCount = size_t{1} << 34;
  for (int64_t d : arr.shape) {
    // Checked before multiplying: (2^34, 2^30) would wrap around to 0 elements.
    if (d != 0 && count > kMaxCount / static_cast<size_t>(d))
      throw DataError(fmt::format("{}: the NPY shape claims over 16 G elements", path));
    count *= static_cast<size_t>(d);
  }
  // Compare with what the file holds before allocating: a header may promise far more than any memory.
  const std::streampos data_start = in.tellg();
  in.seekg(0, std::ios::end);
  const auto available = static_cast<size_t>(in.tellg() - data_start);
  in.seekg(data_start);
  if (available < count * item)
    throw DataError(fmt::format("{}: truncated: the header promises {} bytes of data, the file has {}", path,
                                count * item, available));
  // More than the header promises is a file written wrongly (or two files run together): refused, not ignored.
  if (available > count * item)
    throw DataError(fmt::format("{}: {} bytes after the {} bytes of data the header promises", path,
                                available - count * item, count * item));
  arr.item = item;
  arr.count = count;
  arr.offset = static_cast<size_t>(data_start);
  return arr;
}

}  // namespace

void check_finite(const Tensor& values, const std::string& path, float scale) {
  const float* p = values.data<float>();
  const int64_t n = values.numel();
  // A branch-free pass first (it vectorises: the per-element branch was a quarter of an MLP run's start over
  // Fashion-MNIST's 47 M values), then the first bad value's position only when there is one. Not finite = exponent
  // bits all ones.
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (!bad) return;
  const int64_t per_sample = n / std::max<int64_t>(1, values.dim(0));
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]))
      throw DataError(
          fmt::format("{}: value {} at sample {} (element {} of it) is not finite{}: training on it could "
                      "only diverge",
                      path, p[i], i / per_sample, i % per_sample,
                      scale != 1.0f ? fmt::format(" after scaling by {}", scale) : std::string()));
}

Dataset read_csv(const std::string& path, const CsvSpec& spec) {
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::vector<std::vector<double>> rows;
  std::vector<std::string> header;
  std::string line;
  int64_t line_no = 0;
  size_t width = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    const auto fields = split_csv_line(line);
    std::vector<double> values(fields.size());
    bool numeric = true;
    for (size_t i = 0; i < fields.size() && numeric; ++i) numeric = parse_number(fields[i], values[i]);
    const bool first = rows.empty() && header.empty();
    if (first && (spec.header == "true" || (spec.header == "auto" && !numeric))) {
      header = fields;
      width = fields.size();
      continue;
    }
    if (width == 0) width = fields.size();
    if (fields.size() != width)
      throw DataError(
          fmt::format("{}:{}: {} fields, but the file's rows have {}", path, line_no, fields.size(), width));
    for (size_t i = 0; i < fields.size(); ++i)
      if (!parse_number(fields[i], values[i]))
        throw DataError(
            fmt::format("{}:{}: field {} ({}) is not a number", path, line_no, i + 1, quote_value(fields[i])));
    rows.push_back(std::move(values));
  }
  if (rows.empty()) throw DataError(fmt::format("{}: no data rows", path));
  if (width < 2) throw DataError(fmt::format("{}: needs at least one feature column and a label column", path));

  // The label column: a header name, an index (negative counts from the end), or the last column.
  int64_t label = static_cast<int64_t>(width) - 1;
  if (!spec.label.empty()) {
    double idx = 0;
    if (parse_number(spec.label, idx) && idx == std::floor(idx)) {
      // In double until it is known to be a column: "1e30" must fail as out of range, not overflow the cast.
      const double column = idx < 0 ? static_cast<double>(width) + idx : idx;
      label = column >= 0 && column < static_cast<double>(width) ? static_cast<int64_t>(column) : -1;
    } else {
      auto it = std::find(header.begin(), header.end(), spec.label);
      if (it == header.end())
        throw DataError(fmt::format("{}: no column named {}{}", path, quote_value(spec.label),
                                    header.empty() ? " (the file has no header row)" : ""));
      label = it - header.begin();
    }
    if (label < 0 || label >= static_cast<int64_t>(width))
      throw DataError(fmt::format("{}: label column {} is outside the {} columns", path, spec.label, width));
  }

  const auto n = static_cast<int64_t>(rows.size()), features = static_cast<int64_t>(width) - 1;
  Dataset ds;
  ds.source = path;
  if (spec.classes) ds.labels_source = path;
  ds.inputs = Tensor::empty(Shape{n, features}, DType::f32);
  float* x = ds.inputs.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    int64_t k = 0;
    for (int64_t c = 0; c < static_cast<int64_t>(width); ++c)
      if (c != label) x[r * features + k++] = static_cast<float>(rows[static_cast<size_t>(r)][static_cast<size_t>(c)]);
  }
  check_finite(ds.inputs, path, 1.0f);
  if (spec.classes) {
    ds.targets = Tensor::empty(Shape{n}, DType::i32);
    int32_t* y = ds.targets.data<int32_t>();
    for (int64_t r = 0; r < n; ++r) {
      const double v = rows[static_cast<size_t>(r)][static_cast<size_t>(label)];
      if (v < 0 || v != std::floor(v) || v > 1e6)
        throw DataError(
            fmt::format("{}: row {}: class label {} is not a non-negative integer (use targets: values "
                        "for regression)",
                        path, r + 1, v));
      y[r] = static_cast<int32_t>(v);
      ds.num_classes = std::max<int64_t>(ds.num_classes, y[r] + 1);
    }
  } else {
    ds.targets = Tensor::empty(Shape{n, 1}, DType::f32);
    for (int64_t r = 0; r < n; ++r)
      ds.targets.data<float>()[r] = static_cast<float>(rows[static_cast<size_t>(r)][static_cast<size_t>(label)]);
    check_finite(ds.targets, path, 1.0f);
  }
  return ds;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const NpyLayout layout = read_npy_layout(in, path);
  NpyArray arr;
  arr.descr = layout.descr;
  arr.shape = layout.shape;
  arr.data.resize(layout.count * layout.item);
  if (!in.read(reinterpret_cast<char*>(arr.data.data()), static_cast<std::streamsize>(arr.data.size())))
    throw DataError(fmt::format("{}: truncated: the header promises {} bytes of data", path, arr.data.size()));
  return arr;
}

void MappedInputs::row(int64_t i, float* out) const {
  const int64_t per = row_numel();
  const uint8_t* src = data + static_cast<size_t>(i * per) * (bytes ? 1 : sizeof(float));
  // The same arithmetic as a read file's conversion: float(value) × scale.
  if (bytes) {
    for (int64_t k = 0; k < per; ++k) out[k] = static_cast<float>(src[k]) * scale;
  } else {
    std::memcpy(out, src, static_cast<size_t>(per) * sizeof(float));
    if (scale != 1.0f)
      for (int64_t k = 0; k < per; ++k) out[k] *= scale;
  }
  uint32_t bad = 0;  // branch-free first (as check_finite), the position only when there is a bad value
  for (int64_t k = 0; k < per; ++k) {
    uint32_t b;
    std::memcpy(&b, out + k, sizeof b);
    bad |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
  }
  if (!bad) return;
  for (int64_t k = 0; k < per; ++k)
    if (!std::isfinite(out[k]))
      throw DataError(
          fmt::format("{}: value {} at sample {} (element {} of it) is not finite{}: training on it could "
                      "only diverge",
                      path, out[k], i, k, scale != 1.0f ? fmt::format(" after scaling by {}", scale) : std::string()));
}

namespace {

// Maps a float32 or uint8 NPY file of inputs; null for another type or a file that is not a regular one (read).
std::shared_ptr<const MappedInputs> map_npy_inputs(const std::string& path, float scale) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return nullptr;  // a pipe, say: read once, in order
  NpyLayout layout;
  {
    std::ifstream in(path, std::ios::binary);
    layout = read_npy_layout(in, path);
  }
  const bool bytes = layout.descr == "|u1" || layout.descr == "<u1";
  if (!bytes && layout.descr != "<f4") return nullptr;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<size_t>(st.st_size) != layout.offset + layout.count * layout.item) {
    ::close(fd);  // not a regular file (or one that changed since its header was read): read it instead
    return nullptr;
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping stays valid
  if (p == MAP_FAILED) throw DataError(fmt::format("{}: cannot map {} bytes: {}", path, size, std::strerror(err)));
  ::madvise(p, size, MADV_RANDOM);  // batches gather shuffled rows: read-ahead would read what is not asked for
  auto map = std::make_shared<Storage>();
  map->ptr = p;
  map->bytes = size;
  map->release = [size](void* q) {
    unguard_mapping(q);
    ::munmap(q, size);
  };
  guard_mapping(p, size, path);  // a file cut short under the run: exit 1 naming it, not "Bus error"
  auto m = std::make_shared<MappedInputs>();
  m->data = static_cast<const uint8_t*>(p) + layout.offset;
  m->map = std::move(map);
  m->bytes = bytes;
  m->scale = scale;
  m->shape = layout.shape.size() == 1 ? Shape{layout.shape[0], 1} : Shape(layout.shape);
  m->path = path;
  return m;
}

}  // namespace

double NpyArray::at(size_t i) const {
  const uint8_t* p = data.data();
  if (descr == "<f4") return reinterpret_cast<const float*>(p)[i];
  if (descr == "<f8") return reinterpret_cast<const double*>(p)[i];
  if (descr == "<i8") return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
  if (descr == "<i4") return reinterpret_cast<const int32_t*>(p)[i];
  return p[i];
}

Dataset read_npy_pair(const std::string& inputs_path, const std::string& targets_path, float scale) {
  const std::shared_ptr<const MappedInputs> mapped = map_npy_inputs(inputs_path, scale);
  const NpyArray x = mapped ? NpyArray{} : read_npy(inputs_path);
  const NpyArray y = read_npy(targets_path);
  const std::vector<int64_t> x_shape = mapped ? mapped->shape.dims() : x.shape;
  const int64_t n = x_shape[0];
  if (n == 0) throw DataError(fmt::format("{}: no samples (the first dimension is 0)", inputs_path));
  // A zero-size sample dimension would reach the layers as a sample of no values (a division by zero in linear,
  // pooling and the losses): refused here, naming the file.
  for (const auto& [shape, path] : {std::pair{&x_shape, &inputs_path}, std::pair{&y.shape, &targets_path}})
    for (size_t d = 1; d < shape->size(); ++d)
      if ((*shape)[d] == 0)
        throw DataError(fmt::format("{}: dimension {} of the shape {} is 0: a sample must hold at least one value",
                                    *path, d, Shape(*shape).str()));
  if (y.shape[0] != n)
    throw DataError(fmt::format("{}: {} targets for {} samples in {}", targets_path, y.shape[0], n, inputs_path));
  Dataset ds;
  ds.source = inputs_path;
  if (mapped) {
    // Checked finite once here, row by row through the map (its pages stay evictable), so a bad value is refused
    // before the run starts; the loader checks each batch's rows again as it converts them.
    std::vector<float> row(static_cast<size_t>(mapped->row_numel()));
    for (int64_t i = 0; i < n; ++i) mapped->row(i, row.data());
    ds.mapped = mapped;
    // No conversion needed: the tensor views the mapped values (the loader still checks them per batch).
    if (!mapped->bytes && mapped->scale == 1.0f &&
        (mapped->data - static_cast<const uint8_t*>(mapped->map->ptr)) % 64 == 0) {
      auto view = std::make_shared<Storage>();
      view->ptr = const_cast<uint8_t*>(mapped->data);  // PROT_READ: nothing writes a data set's inputs
      view->bytes = static_cast<size_t>(mapped->shape.numel()) * sizeof(float);
      view->release = [keep = mapped->map](void*) {};
      ds.inputs = Tensor::over_storage(std::move(view), 0, mapped->shape, DType::f32);
    }
  } else {
    ds.inputs = Tensor::empty(Shape(x.shape), DType::f32);
    if (x.shape.size() == 1) ds.inputs = ds.inputs.view(Shape{n, 1});
    float* px = ds.inputs.data<float>();
    for (int64_t i = 0; i < ds.inputs.numel(); ++i) px[i] = static_cast<float>(x.at(static_cast<size_t>(i))) * scale;
    check_finite(ds.inputs, inputs_path, scale);
  }
  const bool integer = y.descr == "<i8" || y.descr == "<i4" || y.descr == "|u1" || y.descr == "<u1";
  if (integer) {
    if (y.shape.size() != 1)
      throw DataError(fmt::format("{}: integer targets are class labels of shape [N], got {} dimensions", targets_path,
                                  y.shape.size()));
    ds.labels_source = targets_path;
    ds.targets = Tensor::empty(Shape{n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) {
      const double v = y.at(static_cast<size_t>(i));
      if (v < 0 || v > 1e6)
        throw DataError(fmt::format("{}: label {} at index {} is not a class index", targets_path, v, i));
      ds.targets.data<int32_t>()[i] = static_cast<int32_t>(v);
      ds.num_classes = std::max<int64_t>(ds.num_classes, static_cast<int64_t>(v) + 1);
    }
  } else {
    ds.targets = Tensor::empty(y.shape.size() == 1 ? Shape{n, 1} : Shape(y.shape), DType::f32);
    for (int64_t i = 0; i < ds.targets.numel(); ++i)
      ds.targets.data<float>()[i] = static_cast<float>(y.at(static_cast<size_t>(i)));
    check_finite(ds.targets, targets_path, 1.0f);
  }
  return ds;
}

}  // namespace gt
