// Key tables: the names and typed reads the section parsers take from them, and their JSON Schema.
#include "config/schema.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <set>

namespace gt {

using ojson = nlohmann::ordered_json;

SectionSpec plain_section(std::vector<KeySpec> keys, std::string doc, std::string extra_json) {
  SectionSpec s;
  s.variants.push_back({{}, std::move(keys)});
  s.doc = std::move(doc);
  s.extra_json = std::move(extra_json);
  return s;
}

std::vector<KeySpec> concat_keys(std::initializer_list<std::vector<KeySpec>> parts) {
  std::vector<KeySpec> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<std::string> key_names(const std::vector<KeySpec>& keys) {
  std::vector<std::string> names;
  for (const KeySpec& k : keys) names.push_back(k.name);
  return names;
}

const std::vector<KeySpec>& section_keys(const SectionSpec& section, const std::string& value) {
  for (const auto& v : section.variants)
    if (v.when.empty() || std::find(v.when.begin(), v.when.end(), value) != v.when.end()) return v.keys;
  throw Error(fmt::format("the key table of {} has no variant for \"{}\"", section.discriminator, value));
}

const KeySpec& key_spec(const std::vector<KeySpec>& keys, const std::string& name) {
  for (const KeySpec& k : keys)
    if (k.name == name) return k;
  throw Error(fmt::format("no key \"{}\" in its section's key table", name));
}

namespace {

// A default's text as the number it stands for; the tables' own text, so a bad one is a bug (tests parse them all).
double fallback_number(const KeySpec& key) {
  char* end = nullptr;
  const double v = std::strtod(key.fallback.c_str(), &end);
  if (key.fallback.empty() || *end != '\0')
    throw Error(fmt::format("key {}: default \"{}\" is not a number", key.name, key.fallback));
  return v;
}

int64_t fallback_int(const KeySpec& key) {
  char* end = nullptr;
  const long long v = std::strtoll(key.fallback.c_str(), &end, 10);
  if (key.fallback.empty() || *end != '\0')
    throw Error(fmt::format("key {}: default \"{}\" is not an integer", key.name, key.fallback));
  return v;
}

int64_t to_int(double v) { return v <= -1e300 ? INT64_MIN : v >= 1e300 ? INT64_MAX : static_cast<int64_t>(v); }

}  // namespace

int64_t read_size(const ConfigNode& n, const KeySpec& key) {
  if (!key.limit) throw Error(fmt::format("key {}: a size without a limit in its table", key.name));
  return n.as_size(to_int(key.min), *key.limit);
}

double read_double(const ConfigNode& n, const KeySpec& key) {
  return n.as_double(key.min, key.max, !key.min_exclusive);
}

int64_t get_size(const ConfigNode& section, const KeySpec& key) {
  const ConfigNode n = section[key.name];
  return n.defined() ? read_size(n, key) : fallback_int(key);
}

int64_t get_int(const ConfigNode& section, const KeySpec& key) {
  const ConfigNode n = section[key.name];
  return n.defined() ? n.as_int(to_int(key.min), to_int(key.max)) : fallback_int(key);
}

double get_double(const ConfigNode& section, const KeySpec& key) {
  const ConfigNode n = section[key.name];
  return n.defined() ? read_double(n, key) : fallback_number(key);
}

std::string expected_words(const KeySpec& key) {
  const auto integer_words = [&key]() -> std::string {
    if (key.min == 1) return "a positive integer";
    if (key.min == 0) return "a non-negative integer";
    return key.min > -1e300 ? fmt::format("an integer ≥ {}", to_int(key.min)) : "an integer";
  };
  switch (key.kind) {
    case KeyKind::integer:
      return key.max < 1e300 ? fmt::format("an integer in [{}, {}]", to_int(key.min), to_int(key.max))
                             : integer_words();
    case KeyKind::size: return integer_words();
    case KeyKind::number:
      if (key.max < 1e300 && key.min > -1e300)
        return fmt::format("a number in {}{}, {}]", key.min_exclusive ? "(" : "[", key.min, key.max);
      if (key.min > -1e300) return fmt::format("a number {} {}", key.min_exclusive ? ">" : "≥", key.min);
      return "a number";
    case KeyKind::boolean: return "true or false";
    case KeyKind::string: return "a string";
    case KeyKind::choice: {
      std::string list;
      for (const std::string& c : key.choices) list += (list.empty() ? "" : ", ") + c;
      return "one of: " + list;
    }
    case KeyKind::list: return "a list";
    case KeyKind::map: return "a map";
    case KeyKind::any_of: {
      std::string words;
      for (const KeySpec& alt : key.items) words += (words.empty() ? "" : " or ") + expected_words(alt);
      return words.empty() ? "a value" : words;
    }
    case KeyKind::custom: return "a value";
  }
  return "a value";
}

void expect_keys(const ConfigNode& section, const std::vector<KeySpec>& keys) {
  section.expect_keys(key_names(keys));
  // null is no default: `momentum: ~` (or `momentum:`) would read as the key left out, silently. Only the keys whose
  // null means something (none; a value found from the data) take it.
  for (const KeySpec& k : keys)
    if (!k.nullable && section.null_at(k.name))
      section[k.name].fail(fmt::format("expected {}, got null{}", expected_words(k),
                                       k.required ? "" : " (leave the key out for its default)"));
}

bool get_bool(const ConfigNode& section, const KeySpec& key) {
  const ConfigNode n = section[key.name];
  if (n.defined()) return n.as_bool();
  if (key.fallback != "true" && key.fallback != "false")
    throw Error(fmt::format("key {}: default \"{}\" is not true or false", key.name, key.fallback));
  return key.fallback == "true";
}

namespace {

ojson section_schema(const SectionSpec& section);

// Adds the members written in `extra` ("a": 1, "b": […]) to the object `s`.
void merge_members(ojson& s, const std::string& extra) {
  if (extra.empty()) return;
  const ojson members = ojson::parse("{" + extra + "}");
  for (const auto& [k, v] : members.items()) s[k] = v;
}

// A choice as the YAML reader of an editor sees it: `true` and `false` are booleans there, though the config reads
// every scalar as text.
ojson choice_value(const std::string& c) {
  if (c == "true") return true;
  if (c == "false") return false;
  return c;
}

ojson default_value(const KeySpec& key) {
  if (key.fallback == "null") return nullptr;
  switch (key.kind) {
    case KeyKind::integer:
    case KeyKind::size: return fallback_int(key);
    case KeyKind::number: return fallback_number(key);
    case KeyKind::boolean: return key.fallback == "true";
    case KeyKind::choice: return choice_value(key.fallback);
    case KeyKind::any_of: {  // a number where one alternative is one ("1" of "int or [h, w]"), else the text
      char* end = nullptr;
      const double v = std::strtod(key.fallback.c_str(), &end);
      if (*end != '\0') return key.fallback;
      return key.fallback.find_first_not_of("-0123456789") == std::string::npos ? ojson(fallback_int(key)) : ojson(v);
    }
    default: return key.fallback;
  }
}

ojson key_schema(const KeySpec& key) {
  ojson s = ojson::object();
  switch (key.kind) {
    case KeyKind::integer:
      s["type"] = "integer";
      if (key.min > -1e300) s["minimum"] = to_int(key.min);
      if (key.max < 1e300) s["maximum"] = to_int(key.max);
      break;
    case KeyKind::size:
      s["type"] = "integer";
      s["minimum"] = to_int(key.min);
      if (key.limit) s["maximum"] = key.limit->max;
      break;
    case KeyKind::number:
      s["type"] = "number";
      if (key.min > -1e300) s[key.min_exclusive ? "exclusiveMinimum" : "minimum"] = key.min;
      if (key.max < 1e300) s["maximum"] = key.max;
      break;
    case KeyKind::boolean: s["type"] = "boolean"; break;
    case KeyKind::string:
      s["type"] = "string";
      if (!key.pattern.empty()) s["pattern"] = key.pattern;
      if (key.max_length > 0) s["maxLength"] = key.max_length;
      break;
    case KeyKind::choice: {
      ojson values = ojson::array();
      for (const auto& c : key.choices) {
        values.push_back(c);
        if (c == "true" || c == "false") values.push_back(choice_value(c));
      }
      s["enum"] = values;
      break;
    }
    case KeyKind::list:
      s["type"] = "array";
      if (!key.items.empty()) s["items"] = key_schema(key.items.front());
      if (key.min_items > 0) s["minItems"] = key.min_items;
      if (key.max_items > 0) s["maxItems"] = key.max_items;
      break;
    case KeyKind::map: s = section_schema(*key.section); break;
    case KeyKind::any_of: {
      ojson alts = ojson::array();
      for (const KeySpec& k : key.items) alts.push_back(key_schema(k));
      s["anyOf"] = alts;
      break;
    }
    case KeyKind::custom: break;
  }
  merge_members(s, key.extra_json);
  if (key.nullable) {
    if (key.kind == KeyKind::choice)
      s["enum"].push_back(nullptr);
    else
      s = ojson{{"anyOf", ojson::array({s, ojson{{"type", "null"}}})}};
  }
  if (!key.doc.empty()) s["description"] = key.doc;
  if (!key.fallback.empty()) s["default"] = default_value(key);
  return s;
}

ojson keys_schema(const std::vector<KeySpec>& keys, const std::string& doc) {
  ojson s{{"type", "object"}};
  if (!doc.empty()) s["description"] = doc;
  ojson props = ojson::object(), required = ojson::array();
  for (const KeySpec& k : keys) {
    props[k.name] = key_schema(k);
    if (k.required) required.push_back(k.name);
  }
  s["properties"] = props;
  if (!required.empty()) s["required"] = required;
  s["additionalProperties"] = false;
  return s;
}

ojson section_schema(const SectionSpec& section) {
  ojson s;
  if (section.discriminator.empty()) {
    s = keys_schema(section.variants.at(0).keys, section.doc);
  } else {
    // The discriminator with every value, then one if/then per variant holding that variant's whole key list (so
    // additionalProperties sees them all).
    ojson values = ojson::array(), branches = ojson::array();
    for (const auto& v : section.variants)
      for (const auto& w : v.when) values.push_back(w);
    const KeySpec& disc = key_spec(section.variants.at(0).keys, section.discriminator);
    ojson disc_schema = key_schema(disc);
    disc_schema["enum"] = values;
    s = ojson{{"type", "object"}};
    if (!section.doc.empty()) s["description"] = section.doc;
    s["properties"] = ojson{{section.discriminator, disc_schema}};
    s["required"] = ojson::array({section.discriminator});
    for (const auto& v : section.variants) {
      ojson when = ojson::array();
      for (const auto& w : v.when) when.push_back(w);
      ojson then = keys_schema(v.keys, "");
      merge_members(then, v.extra_json);
      branches.push_back(ojson{{"if", ojson{{"properties", ojson{{section.discriminator, ojson{{"enum", when}}}}},
                                            {"required", ojson::array({section.discriminator})}}},
                               {"then", then}});
    }
    s["allOf"] = branches;
  }
  merge_members(s, section.extra_json);
  return s;
}

}  // namespace

std::string key_json_schema(const KeySpec& key) { return key_schema(key).dump(); }
std::string section_json_schema(const SectionSpec& section) { return section_schema(section).dump(); }

namespace {

// The Markdown reference: the key tables as they are, a table per map reached through them, depth first.

const char* kind_word(KeyKind kind) {
  switch (kind) {
    case KeyKind::integer:
    case KeyKind::size: return "integer";
    case KeyKind::number: return "number";
    case KeyKind::boolean: return "boolean";
    case KeyKind::string: return "string";
    case KeyKind::choice: return "choice";
    case KeyKind::list: return "list";
    case KeyKind::map: return "map";
    case KeyKind::any_of: return "one of";
    case KeyKind::custom: return "custom";
  }
  return "value";
}

// A table cell: one line, no column break.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

std::string range_words(const KeySpec& key) {
  switch (key.kind) {
    case KeyKind::string:
      if (!key.pattern.empty()) return fmt::format("matches `{}`", key.pattern);
      return key.max_length > 0 ? fmt::format("at most {} characters", key.max_length) : "";
    case KeyKind::list: {
      const std::string item = key.items.empty() ? "" : range_words(key.items.front());
      std::string words = item.empty() ? "a list" : "a list, each item " + item;
      if (key.max_items > 0 && key.min_items == key.max_items) return words + fmt::format(", {} items", key.max_items);
      if (key.max_items > 0) return words + fmt::format(", {} to {} items", key.min_items, key.max_items);
      if (key.min_items > 0) return words + fmt::format(", at least {}", key.min_items);
      return words;
    }
    case KeyKind::map: return "a map (its table below)";
    case KeyKind::any_of: {
      std::string words;
      for (const KeySpec& alt : key.items) words += (words.empty() ? "" : "; or ") + range_words(alt);
      return words;
    }
    case KeyKind::custom: return "";
    default: return expected_words(key);
  }
}

// A map reached from a table: its path, and the variants of the tables above it that reach it ("format: idx").
struct Nested {
  std::string path;
  const SectionSpec* section;
  std::vector<std::string> within;
};

// The maps a key's value may be: itself, a list's item, one of its alternatives. A map that another variant of the
// same table reached already gets this variant added to its `within`.
void nested_sections(const KeySpec& key, const std::string& path, const std::string& within, std::vector<Nested>& out) {
  if (key.kind == KeyKind::map && key.section) {
    auto seen = std::find_if(out.begin(), out.end(), [&](const Nested& n) { return n.section == key.section; });
    if (seen == out.end()) seen = out.insert(out.end(), Nested{path, key.section, {}});
    if (("`, `" + seen->path + "`, `").find("`, `" + path + "`, `") == std::string::npos)
      seen->path += "`, `" + path;  // data.train and data.test: one table, both names in its heading
    if (!within.empty() && std::find(seen->within.begin(), seen->within.end(), within) == seen->within.end())
      seen->within.push_back(within);
  }
  if (key.kind == KeyKind::list || key.kind == KeyKind::any_of)
    for (const KeySpec& item : key.items)
      nested_sections(item, key.kind == KeyKind::list ? path + "[]" : path, within, out);
}

void keys_markdown(const std::vector<KeySpec>& keys, std::string& out) {
  out += "| key | type | default | range / choices | description |\n|---|---|---|---|---|\n";
  for (const KeySpec& k : keys) {
    std::string fallback = k.required ? "required" : k.fallback.empty() ? "" : "`" + k.fallback + "`";
    if (k.nullable && k.fallback != "null") fallback += fallback.empty() ? "null allowed" : " (null allowed)";
    const std::string doc = !k.doc.empty() || k.kind != KeyKind::map || !k.section ? k.doc : k.section->doc;
    out += fmt::format("| `{}` | {} | {} | {} | {} |\n", k.name, kind_word(k.kind), cell(fallback),
                       cell(range_words(k)), cell(doc));
  }
}

void section_markdown_to(const Nested& at, std::set<const SectionSpec*>& done, std::string& out) {
  if (!done.insert(at.section).second) return;  // a section reached twice (a repeat block's layers) is one table
  const SectionSpec& s = *at.section;
  std::string within;
  for (const std::string& w : at.within) within += (within.empty() ? " — in " : ", ") + w;
  std::vector<Nested> below;
  for (const auto& v : s.variants) {
    std::string when;
    for (const auto& w : v.when) when += (when.empty() ? "" : ", ") + w;
    if (!when.empty()) when = "`" + s.discriminator + ": " + when + "`";
    out += fmt::format("### {}{}{}\n\n", at.path.empty() ? "Top level" : "`" + at.path + "`",
                       when.empty() ? "" : " — " + when, within);
    if (!s.doc.empty()) out += cell(s.doc) + ".\n\n";
    keys_markdown(v.keys, out);
    out += "\n";
    for (const KeySpec& k : v.keys) nested_sections(k, at.path.empty() ? k.name : at.path + "." + k.name, when, below);
  }
  for (Nested& n : below) {
    if (n.within.size() == s.variants.size()) n.within.clear();  // reached from every variant: it is the section's
    section_markdown_to(n, done, out);
  }
}

}  // namespace

std::string section_markdown(const SectionSpec& section, const std::string& name) {
  std::string out;
  std::set<const SectionSpec*> done;
  section_markdown_to({name, &section, {}}, done, out);
  return out;
}

}  // namespace gt
