// The JSON writer: keys in insertion order, strings escaped, non-finite numbers as null.
#include "core/json.h"

#include <fmt/format.h>

#include <cmath>

namespace gt {

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        else
          out += c;
    }
  }
  return out + "\"";
}

void JsonObject::key(const std::string& k) {
  if (!m_body.empty()) m_body += ", ";
  m_body += json_quote(k) + ": ";
}
JsonObject& JsonObject::add(const std::string& k, double v) {
  key(k);
  m_body += std::isfinite(v) ? fmt::format("{}", v) : "null";
  if (std::isfinite(v)) m_numbers.emplace_back(k, v);
  return *this;
}
JsonObject& JsonObject::add(const std::string& k, int64_t v) {
  key(k);
  m_body += std::to_string(v);
  m_numbers.emplace_back(k, static_cast<double>(v));
  return *this;
}
JsonObject& JsonObject::add(const std::string& k, const std::string& v) {
  key(k);
  m_body += json_quote(v);
  m_strings.emplace_back(k, v);
  return *this;
}
std::string JsonObject::string_field(const std::string& k) const {
  for (const auto& [name, v] : m_strings)
    if (name == k) return v;
  return "";
}
JsonObject& JsonObject::add(const std::string& k, std::optional<double> v) { return v ? add(k, *v) : add_null(k); }
JsonObject& JsonObject::add_bool(const std::string& k, bool v) {
  key(k);
  m_body += v ? "true" : "false";
  return *this;
}
JsonObject& JsonObject::add(const std::string& k, const JsonObject& v) {
  key(k);
  m_body += v.str();
  return *this;
}
JsonObject& JsonObject::add(const std::string& k, const std::vector<JsonObject>& items) {
  key(k);
  m_body += "[";
  for (size_t i = 0; i < items.size(); ++i) m_body += (i ? ", " : "") + items[i].str();
  m_body += "]";
  return *this;
}
JsonObject& JsonObject::add_null(const std::string& k) {
  key(k);
  m_body += "null";
  return *this;
}

}  // namespace gt
