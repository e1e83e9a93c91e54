// The JSON reader: nlohmann-json lexes and checks the grammar through its SAX interface, and the handler here builds
// the JsonValue tree, refusing duplicate keys (nlohmann would keep the last) and nesting beyond the limit before
// anything is allocated for it.
#include "core/json_read.h"

#include "core/json.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <limits>
#include <unordered_set>

namespace gt {
namespace {

using json = nlohmann::json;

class TreeBuilder : public nlohmann::json_sax<json> {
 public:
  explicit TreeBuilder(int max_depth) : m_max_depth(max_depth) {}

  bool null() override { return put(JsonValue{}); }
  bool boolean(bool v) override {
    JsonValue x;
    x.type = JsonValue::Type::boolean;
    x.boolean = v;
    return put(std::move(x));
  }
  bool number_integer(number_integer_t v) override { return number(static_cast<double>(v), v); }
  bool number_unsigned(number_unsigned_t v) override {
    const bool fits = v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    return number(static_cast<double>(v), fits ? std::optional<int64_t>(static_cast<int64_t>(v)) : std::nullopt);
  }
  bool number_float(number_float_t v, const string_t& /*as written*/) override { return number(v, std::nullopt); }
  bool string(string_t& v) override {
    JsonValue x;
    x.type = JsonValue::Type::string;
    x.string = std::move(v);
    return put(std::move(x));
  }
  bool binary(binary_t& /*v*/) override { return fail(JsonReadError::Reason::syntax, "binary values are not JSON"); }
  bool start_object(std::size_t /*elements*/) override { return open(JsonValue::Type::object); }
  bool key(string_t& k) override {
    Open& o = m_open.back();
    if (!o.keys.insert(k).second)
      return fail(JsonReadError::Reason::duplicate, fmt::format("duplicate key {}", json_quote(k)));
    o.value->members.push_back({std::move(k), JsonValue{}});
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t /*elements*/) override { return open(JsonValue::Type::array); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) override {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error while parsing …": the part
    // after "parse error " says where and what.
    std::string what = e.what();
    if (const size_t at = what.find("parse error "); at != std::string::npos) what = what.substr(at + 12);
    return fail(JsonReadError::Reason::syntax, what);
  }

  JsonValue take_root() { return std::move(m_root); }
  std::optional<JsonReadError> error() const { return m_error; }

 private:
  // A number, with its int64 value when it was written as an integer that fits.
  bool number(double v, std::optional<int64_t> integer) {
    JsonValue x;
    x.type = JsonValue::Type::number;
    x.number = v;
    x.integer = integer;
    return put(std::move(x));
  }
  struct Open {
    JsonValue* value;
    std::unordered_set<std::string> keys;  // objects only
  };

  bool fail(JsonReadError::Reason reason, const std::string& detail) {
    if (!m_error) m_error.emplace(reason, detail);
    return false;
  }
  // Where the next value goes: the root, the open array's next item, or the value of the open object's last key.
  JsonValue* slot() {
    if (m_open.empty()) return &m_root;
    JsonValue* top = m_open.back().value;
    if (top->is_array()) return &top->items.emplace_back();
    return &top->members.back().value;
  }
  bool put(JsonValue v) {
    *slot() = std::move(v);
    return true;
  }
  // Pointers into a parent's vector stay valid while a child is open: the parent grows only after it closes.
  bool open(JsonValue::Type type) {
    if (static_cast<int>(m_open.size()) >= m_max_depth)
      return fail(JsonReadError::Reason::limit,
                  fmt::format("objects and arrays nested deeper than {} levels", m_max_depth));
    JsonValue* v = slot();
    v->type = type;
    m_open.push_back({v, {}});
    return true;
  }
  bool close() {
    m_open.pop_back();
    return true;
  }

  int m_max_depth;
  JsonValue m_root;
  std::vector<Open> m_open;
  std::optional<JsonReadError> m_error;
};

void append_text(const JsonValue& v, std::string& out) {
  switch (v.type) {
    case JsonValue::Type::null: out += "null"; break;
    case JsonValue::Type::boolean: out += v.boolean ? "true" : "false"; break;
    case JsonValue::Type::number: out += v.integer ? std::to_string(*v.integer) : fmt::format("{}", v.number); break;
    case JsonValue::Type::string: out += json_quote(v.string); break;
    case JsonValue::Type::array:
      out += '[';
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i) out += ", ";
        append_text(v.items[i], out);
      }
      out += ']';
      break;
    case JsonValue::Type::object:
      out += '{';
      for (size_t i = 0; i < v.members.size(); ++i) {
        if (i) out += ", ";
        out += json_quote(v.members[i].key) + ": ";
        append_text(v.members[i].value, out);
      }
      out += '}';
      break;
  }
}

const char* type_name(JsonValue::Type t) {
  switch (t) {
    case JsonValue::Type::null: return "null";
    case JsonValue::Type::boolean: return "a boolean";
    case JsonValue::Type::number: return "a number";
    case JsonValue::Type::string: return "a string";
    case JsonValue::Type::array: return "an array";
    case JsonValue::Type::object: return "an object";
  }
  return "?";
}

}  // namespace

const JsonValue* JsonValue::find(const std::string& key) const {
  for (const JsonMember& m : members)
    if (m.key == key) return &m.value;
  return nullptr;
}

std::string JsonValue::text() const {
  std::string out;
  append_text(*this, out);
  return out;
}

JsonValue json_read(const std::string& text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes)
    throw JsonReadError(JsonReadError::Reason::limit,
                        fmt::format("{} bytes, more than the {} this reader takes", text.size(), limits.max_bytes));
  TreeBuilder builder(limits.max_depth);
  // Strict: the whole text is one value, no comments.
  const bool ok = json::sax_parse(text, &builder, json::input_format_t::json, /*strict=*/true,
                                  /*ignore_comments=*/false);
  if (const auto e = builder.error()) throw *e;
  if (!ok) throw JsonReadError(JsonReadError::Reason::syntax, "not JSON");  // every refusal above names its reason
  return builder.take_root();
}

JsonValue json_read_object(const std::string& text, const JsonLimits& limits) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw JsonReadError(JsonReadError::Reason::not_object, "expected a JSON object, got an empty text");
  JsonValue v = json_read(text, limits);
  if (!v.is_object())
    throw JsonReadError(JsonReadError::Reason::not_object,
                        fmt::format("expected a JSON object, got {}", type_name(v.type)));
  return v;
}

}  // namespace gt
