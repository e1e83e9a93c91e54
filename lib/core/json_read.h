// Reading JSON: one strict parser behind a small API (the library that does the lexing is chosen in json_read.cpp
// alone). Malformed text, duplicate keys and input beyond the limits are refused, with a message that says where.
#pragma once

#include "core/error.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gt {

struct JsonMember;

/// One JSON value, read into plain containers. Objects keep their members in document order.
struct JsonValue {
  enum class Type { null, boolean, number, string, array, object };
  Type type = Type::null;
  bool boolean = false;
  double number = 0;
  /// The number when it was written as an integer that fits in int64_t (state.json's counters, byte offsets).
  std::optional<int64_t> integer;
  std::string string;
  std::vector<JsonValue> items;
  std::vector<JsonMember> members;

  bool is_null() const { return type == Type::null; }
  bool is_number() const { return type == Type::number; }
  bool is_string() const { return type == Type::string; }
  bool is_array() const { return type == Type::array; }
  bool is_object() const { return type == Type::object; }
  /// The member `key` of an object; nullptr when absent or when this is not an object.
  const JsonValue* find(const std::string& key) const;
  /// The value as JSON text, spaced as core/json.h writes it (`{"a": 1, "b": [2, 3]}`).
  std::string text() const;
};

/// A member of an object (a pair would need JsonValue complete where it is declared).
struct JsonMember {
  std::string key;
  JsonValue value;
};

/// Bounds on what a reader accepts from a file it did not write.
struct JsonLimits {
  size_t max_bytes = size_t{64} << 20;
  int max_depth = 64;  ///< objects and arrays nested inside each other, the outermost counting 1
};

/// Why a text was refused. `detail` says where and what ("at line 1, column 9: …", "duplicate key \"a\"").
class JsonReadError : public DataError {
 public:
  enum class Reason {
    syntax,      ///< not JSON (or cut short)
    duplicate,   ///< an object names a key twice (the JSON spec leaves it open; we refuse)
    limit,       ///< larger or deeper than JsonLimits allow
    not_object,  ///< json_read_object: valid JSON, or nothing at all, but not an object
  };
  JsonReadError(Reason reason, const std::string& detail) : DataError(detail), m_reason(reason) {}
  Reason reason() const { return m_reason; }

 private:
  Reason m_reason;
};

/// Parses one JSON document (any value at the top). Throws JsonReadError.
JsonValue json_read(const std::string& text, const JsonLimits& limits = {});
/// The same for a document that must be an object (metrics rows, summary.json, state.json, safetensors headers);
/// an empty text is Reason::not_object too.
JsonValue json_read_object(const std::string& text, const JsonLimits& limits = {});

}  // namespace gt
