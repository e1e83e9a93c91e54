// TensorBoard event files: scalars as TFRecord-framed Event protobufs, written without TensorFlow or protobuf.
#pragma once

#include "core/noncopyable.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gt {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `n` bytes; crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n);
/// The masked CRC that TFRecord stores: rotate right by 15 bits, then add 0xA282EAD8.
uint32_t masked_crc32c(const void* data, size_t n);

/// One TFRecord: length (u64 LE), masked CRC of the length, the data, masked CRC of the data.
std::string tfrecord_frame(const std::string& data);

/// Writes `events.out.tfevents.<unix time>.<host>` in a folder: a file_version event first, then one event per
/// write_scalars call. Each record reaches the file before write_scalars returns, so a running job can be watched.
class TensorBoardWriter : NonCopyable {
 public:
  /// Creates the file in `dir`; throws gt::Error when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();

  /// One Event at `step` holding a Summary.Value{tag, simple_value} per entry (values are stored as float).
  void write_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  /// A SessionLog START event at `step`: TensorBoard then drops the scalars of earlier files at steps ≥ `step`
  /// (a resumed run redoes those steps; metrics.jsonl is cut back the same way).
  void write_session_start(int64_t step);
  const std::string& path() const { return m_path; }

 private:
  void write_record(const std::string& event);
  std::string m_path;
  int m_fd = -1;
};

}  // namespace gt
