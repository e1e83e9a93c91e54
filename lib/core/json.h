// Writing JSON: the lines of metrics.jsonl, summary.json, state.json, safetensors headers and Chrome traces.
// (Reading is core/json_read.h.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gt {

/// Builds one JSON object, key by key, in insertion order. Non-finite numbers become null.
class JsonObject {
 public:
  JsonObject& add(const std::string& key, double v);
  JsonObject& add(const std::string& key, int64_t v);
  JsonObject& add(const std::string& key, int v) { return add(key, static_cast<int64_t>(v)); }
  JsonObject& add(const std::string& key, const std::string& v);
  JsonObject& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonObject& add(const std::string& key, std::optional<double> v);
  JsonObject& add_null(const std::string& key);
  JsonObject& add_bool(const std::string& key, bool v);
  /// A nested object.
  JsonObject& add(const std::string& key, const JsonObject& v);
  /// A list of objects.
  JsonObject& add(const std::string& key, const std::vector<JsonObject>& items);
  std::string str() const { return "{" + m_body + "}"; }
  /// The finite numbers added at the top level, in order (what a TensorBoard sink plots).
  const std::vector<std::pair<std::string, double>>& numbers() const { return m_numbers; }
  /// The string added under `key`, or "" when there is none.
  std::string string_field(const std::string& key) const;

 private:
  void key(const std::string& k);
  std::string m_body;
  std::vector<std::pair<std::string, double>> m_numbers;
  std::vector<std::pair<std::string, std::string>> m_strings;
};

/// JSON string literal with escapes.
std::string json_quote(const std::string& s);

}  // namespace gt
