// safetensors: an 8-byte little-endian header length, a JSON header of names, dtypes, shapes and byte ranges,
// then the raw little-endian data.
#include "io/safetensors.h"

#include "core/atomic_file.h"
#include "core/json.h"
#include "core/json_read.h"
#include "core/quote.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace gt {
namespace {

const char* dtype_tag(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  return "?";
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\": {";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      header += (first ? "" : ", ") + json_quote(k) + ": " + json_quote(v);
      first = false;
    }
    header += "}";
  }
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    std::string shape;
    for (size_t i = 0; i < t->rank(); ++i) shape += (i ? ", " : "") + std::to_string(t->dim(i));
    header += fmt::format("{}{}: {{\"dtype\": \"{}\", \"shape\": [{}], \"data_offsets\": [{}, {}]}}",
                          header.size() > 1 ? ", " : "", json_quote(name), dtype_tag(t->dtype()), shape, offset,
                          offset + t->bytes());
    offset += t->bytes();
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';  // the data starts 8-byte aligned

  AtomicFile file(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  file.write(len, 8);
  file.write(header);
  for (const auto& [name, t] : tensors) {
    Tensor host = *t;
    if (!t->device().is_cpu()) {
      host = Tensor::empty(t->shape(), t->dtype());
      host.copy_from(*t);
    }
    file.write(host.raw(), host.bytes());
  }
  file.commit();
}

std::vector<std::pair<std::string, Tensor>> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint8_t len[8];
  if (!in.read(reinterpret_cast<char*>(len), 8)) throw DataError(fmt::format("{}: truncated safetensors header", path));
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (header_len > file_size - 8 || header_len > (uint64_t{100} << 20))
    throw DataError(fmt::format("{}: header length {} does not fit the {}-byte file", path, header_len, file_size));
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  JsonValue h;
  try {
    // A safetensors header is three levels deep (entries → fields → shape); the limit leaves room and no more.
    h = json_read_object(header, JsonLimits{static_cast<size_t>(header_len), 8});
  } catch (const JsonReadError& e) {
    if (e.reason() == JsonReadError::Reason::not_object)
      throw DataError(fmt::format("{}: the header is not a JSON object", path));
    throw DataError(fmt::format("{}: the header is not valid JSON: {}", path, e.what()));
  }
  const uint64_t data_size = file_size - 8 - header_len;
  std::vector<std::pair<uint64_t, std::pair<std::string, Tensor>>> out;
  for (const JsonMember& member : h.members) {
    const std::string& name = member.key;  // not a structured binding: clang 14 cannot capture one in a lambda
    const JsonValue& e = member.value;
    if (name == "__metadata__") continue;
    auto malformed = [&] {
      return DataError(fmt::format("{}: malformed header entry for {}", path, quote_value(name)));
    };
    const JsonValue* dtype = e.find("dtype");
    const JsonValue* shape = e.find("shape");
    const JsonValue* offsets = e.find("data_offsets");
    if (!dtype || !dtype->is_string() || !shape || !shape->is_array() || !offsets || !offsets->is_array() ||
        offsets->items.size() != 2)
      throw malformed();
    const std::string& tag = dtype->string;
    DType dt = DType::f32;
    if (tag == "F64")
      dt = DType::f64;
    else if (tag == "I32")
      dt = DType::i32;
    else if (tag != "F32")
      throw DataError(fmt::format("{}: tensor {} is {}, which this reader does not take (F32, F64, I32)", path,
                                  quote_value(name), tag));
    std::vector<int64_t> dims;
    for (const JsonValue& d : shape->items) {
      if (!d.integer) throw malformed();
      dims.push_back(*d.integer);
    }
    if (std::any_of(dims.begin(), dims.end(), [](int64_t d) { return d < 0; }))
      throw DataError(fmt::format("{}: tensor {} has a negative dimension in its shape {}", path, quote_value(name),
                                  Shape(dims).str()));
    // The size in bytes, saturating above the data size: a shape must not overflow or allocate what is not there.
    uint64_t bytes = std::find(dims.begin(), dims.end(), int64_t{0}) != dims.end() ? 0 : dtype_size(dt);
    for (const int64_t d : dims) {
      const auto extent = static_cast<uint64_t>(d);
      if (bytes > 0) bytes = bytes > data_size / extent ? data_size + 1 : bytes * extent;
    }
    const JsonValue &first = offsets->items[0], &last = offsets->items[1];
    if (!first.integer || *first.integer < 0 || !last.integer || *last.integer < 0) throw malformed();
    const auto begin = static_cast<uint64_t>(*first.integer), end = static_cast<uint64_t>(*last.integer);
    if (end < begin || end > data_size || bytes > data_size || end - begin != bytes)
      throw DataError(fmt::format("{}: tensor {} claims bytes [{}, {}) of {} for {} of shape {}", path,
                                  quote_value(name), begin, end, data_size, tag, Shape(dims).str()));
    Tensor t = Tensor::empty(Shape(dims), dt);
    in.seekg(static_cast<std::streamoff>(8 + header_len + begin));
    if (!in.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(t.bytes())))
      throw DataError(fmt::format("{}: truncated data of tensor {}", path, quote_value(name)));
    out.push_back({begin, {name, t}});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < out.size(); ++i) {
    const auto& [prev_begin, prev] = out[i - 1];
    const auto& [begin, cur] = out[i];
    if (begin < prev_begin + prev.second.bytes())
      throw DataError(fmt::format("{}: tensors {} and {} overlap (bytes [{}, {}) and [{}, {}))", path,
                                  quote_value(prev.first), quote_value(cur.first), prev_begin,
                                  prev_begin + prev.second.bytes(), begin, begin + cur.second.bytes()));
  }
  std::vector<std::pair<std::string, Tensor>> result;
  for (auto& [offset, entry] : out) result.push_back(std::move(entry));
  return result;
}

}  // namespace gt
