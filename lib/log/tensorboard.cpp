// TensorBoard event files: the protobuf messages are encoded by hand, since only four fields are ever written.
//
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   SessionLog { enum Status START = 1; Status status = 1; }   (Event.session_log = 7)
//   Value   { string tag = 1; float simple_value = 2; }
#include "log/tensorboard.h"

#include "core/error.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace gt {
namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf wire format: a key is (field << 3) | wire type; 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void put_key(std::string& out, int field, int wire) { put_varint(out, static_cast<uint64_t>(field) << 3 | wire); }
template <typename T>
void put_le(std::string& out, T v) {  // the fixed-width types are little-endian on the wire (and on x86/arm64)
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
void put_wall_time(std::string& event) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  put_key(event, 1, 1);
  put_le(event, now);
}

// An Event at `step` (field 2) with its wall time and `payload` in field `field` (5: a Summary, 7: a SessionLog).
std::string step_event(int64_t step, int field, const std::string& payload) {
  std::string event;
  put_wall_time(event);
  put_key(event, 2, 0);
  put_varint(event, static_cast<uint64_t>(step));
  put_bytes(event, field, payload);
  return event;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

std::string tfrecord_frame(const std::string& data) {
  std::string out;
  put_le(out, static_cast<uint64_t>(data.size()));
  put_le(out, masked_crc32c(out.data(), 8));
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()));
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const auto unix_s =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  m_path = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{}.{}", unix_s, host)).string();
  // A resumed run in the same second would reuse the name: append, TensorBoard reads the records in order.
  m_fd = ::open(m_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (m_fd < 0) throw Error(fmt::format("{}: cannot open for writing: {}", m_path, std::strerror(errno)));
  std::string event;
  put_wall_time(event);
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (m_fd >= 0) ::close(m_fd);
}

void TensorBoardWriter::write_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, v] : scalars) {
    std::string value;
    put_bytes(value, 1, tag);
    put_key(value, 2, 5);
    put_le(value, static_cast<float>(v));
    put_bytes(summary, 1, value);
  }
  write_record(step_event(step, 5, summary));
}

void TensorBoardWriter::write_session_start(int64_t step) {
  std::string session_log;
  put_key(session_log, 1, 0);
  put_varint(session_log, 1);  // START
  write_record(step_event(step, 7, session_log));
}

void TensorBoardWriter::write_record(const std::string& event) {
  const std::string rec = tfrecord_frame(event);
  // One write per record with O_APPEND: a reader never sees half a record followed by another.
  const ssize_t w = ::write(m_fd, rec.data(), rec.size());
  if (w != static_cast<ssize_t>(rec.size()))
    throw Error(fmt::format("{}: write failed: {}", m_path, w < 0 ? std::strerror(errno) : "short write"));
}

}  // namespace gt
