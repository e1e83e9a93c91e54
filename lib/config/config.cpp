// Config nodes with paths and positions, typed reads, key validation with "did you mean", and --set overrides.
#include "config/config.h"
#include "core/quote.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/ranges.h>

namespace gt {

ConfigNode::ConfigNode(YAML::Node node, std::string path, std::shared_ptr<const ConfigSource> source, YAML::Mark mark)
    : m_node(std::move(node)), m_path(std::move(path)), m_source(std::move(source)), m_mark(mark) {}

namespace {

// What yaml-cpp 0.7 lets through but a config must not hold: a key that is a list or a map (it would fail later as
// "bad conversion", naming no key), the same key twice in one map (yaml-cpp keeps one of them silently), and a quoted
// string that is never closed (yaml-cpp reads it to the end of the text without a word).
struct TreeCheck {
  const std::string& text;                     // the YAML text, to find closing quotes in
  std::shared_ptr<const ConfigSource> source;  // for the messages
  std::string assignment;                      // the `--set` whose value `text` is; "" for a file
  mutable int64_t nodes = 0;                   // visited so far, aliases followed: bounds a "billion laughs"

  void quote(const YAML::Node& n) const {
    const int pos = n.Mark().pos;
    if (n.Tag() != "!" || pos < 0 || static_cast<size_t>(pos) >= text.size()) return;
    const char q = text[static_cast<size_t>(pos)];
    if (q != '"' && q != '\'') return;
    for (size_t i = static_cast<size_t>(pos) + 1; i < text.size(); ++i) {
      if (q == '"' && text[i] == '\\') {
        ++i;
      } else if (text[i] == q) {
        if (q == '"' || i + 1 == text.size() || text[i + 1] != '\'') return;
        ++i;  // '' is a quote inside a single-quoted string
      }
    }
    if (!assignment.empty()) refuse("the value is not valid YAML: the quoted string is never closed");
    throw ConfigError(fmt::format("{}:{}:{}: invalid YAML: the quoted string is never closed", source->file,
                                  n.Mark().line + 1, n.Mark().column + 1));
  }

  // Throws `why`, naming the `--set` the text came from, or the file.
  [[noreturn]] void refuse(const std::string& why) const {
    if (!assignment.empty()) throw ConfigError(fmt::format("--set {}: {}", quote_if_needed(assignment), why));
    throw ConfigError(fmt::format("{}: {}", source->file, why));
  }

  void check(const YAML::Node& n, const std::string& path, int depth = 0) const {
    // An alias inside its own anchor (`&a [*a]`) makes the tree a cycle: the depth bound stops the walk long before
    // the stack would overflow (a config nests a handful of levels).
    if (depth > 256)
      refuse("the YAML nests deeper than 256 levels once its aliases are followed (an alias inside its own anchor?)");
    // An alias stands for its anchor's whole subtree; nested ones multiply (9 levels of 10 make 10^9 nodes from
    // 1 KiB of text), and every later walk of the tree would pay it. Counting visits bounds this walk and them.
    if (++nodes > limits::kConfigNodes)
      refuse(
          fmt::format("the YAML expands to more than {} nodes once its aliases are followed (a config has a few "
                      "hundred; nested aliases multiply)",
                      limits::kConfigNodes));
    if (n.IsScalar()) return quote(n);
    if (n.IsSequence()) {
      for (size_t i = 0; i < n.size(); ++i) check(n[i], fmt::format("{}[{}]", path, i), depth + 1);
      return;
    }
    if (!n.IsMap()) return;
    std::map<std::string, int> seen;  // key → line
    for (const auto& kv : n) {
      if (!kv.first.IsScalar())
        ConfigNode(kv.first, path, source, kv.first.Mark())
            .fail(fmt::format("a key must be a plain name, got {}", kv.first.IsMap()        ? "a map"
                                                                    : kv.first.IsSequence() ? "a list"
                                                                                            : "nothing"));
      quote(kv.first);
      const std::string child = path.empty() ? kv.first.Scalar() : path + "." + kv.first.Scalar();
      if (const auto [first, fresh] = seen.emplace(kv.first.Scalar(), kv.first.Mark().line + 1); !fresh)
        ConfigNode(kv.first, child, source, kv.first.Mark())
            .fail(assignment.empty() ? fmt::format("duplicate key; the first is at line {}", first->second)
                                     : std::string("duplicate key"));
      check(kv.second, child, depth + 1);
    }
  }
};

ConfigNode parse(const std::string& text, const std::string& name) {
  try {
    YAML::Node root = YAML::Load(text);
    auto src = std::make_shared<ConfigSource>();
    src->file = name;
    TreeCheck{text, src, ""}.check(root, "");
    const YAML::Mark mark = root.IsDefined() && !root.IsNull() ? root.Mark() : YAML::Mark();
    return ConfigNode(root, "", src, mark);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}:{}:{}: invalid YAML: {}", name, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

// A scalar written in quotes: yaml-cpp tags it "!" ("?" for a plain one; "" for one made in code, as a resolved
// config's values are). YAML reads it as a string, whatever it looks like.
bool quoted_scalar(const YAML::Node& n) { return n.Tag() == "!"; }

// A number as YAML 1.2 writes one in decimal: [-+]? (digits (. digits?)? | . digits) ([eE] [-+]? digits)?; an
// integer is [-+]? digits. An integer form with a leading zero (010) is refused: YAML 1.1 readers such as PyYAML
// take it for octal 8, YAML 1.2 ones for 10.
bool decimal_number(std::string_view s, bool integer) {
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  const size_t int_start = i;
  while (i < s.size() && digit(s[i])) ++i;
  const size_t int_digits = i - int_start;
  size_t frac_digits = 0;
  bool fraction = false, exponent = false;
  if (!integer && i < s.size() && s[i] == '.') {
    fraction = true;
    for (++i; i < s.size() && digit(s[i]); ++i) ++frac_digits;
  }
  if (int_digits + frac_digits == 0) return false;
  if (!integer && i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    exponent = true;
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    const size_t exp_start = i;
    while (i < s.size() && digit(s[i])) ++i;
    if (i == exp_start) return false;
  }
  if (i != s.size()) return false;
  return fraction || exponent || int_digits < 2 || s[int_start] != '0';
}

// What to write instead of a number YAML reads in another form: " (write it in decimal digits)" for 0x10, 0o17,
// 0b101, 1_000; a note on the leading zero of 010; "" otherwise (a word, 2.5 for an integer: the message says
// enough).
std::string not_decimal_hint(std::string_view s) {
  const size_t i = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  const bool prefixed = s.size() > i + 1 && s[i] == '0' && std::strchr("xXoObB", s[i + 1]) != nullptr;
  if (prefixed || s.find('_') != std::string_view::npos) return " (write it in decimal digits)";
  const bool integer_form = s.find_first_of(".eE") == std::string_view::npos;
  if (integer_form && s.size() > i + 1 && s[i] == '0' && s.find_first_not_of("0123456789", i) == std::string_view::npos)
    return fmt::format(" (write it without the leading zero: YAML 1.1 reads {} as octal)", s);
  return "";
}

}  // namespace

ConfigNode ConfigNode::load_file(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open config file: {}", file, std::strerror(errno)));
  // Only a regular file of bounded size: /dev/zero, a FIFO or a 10 GB file would be read without end.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(file, ec);
  if (fs::is_directory(st)) throw ConfigError(fmt::format("{}: cannot open config file: it is a directory", file));
  if (!fs::is_regular_file(st))
    throw ConfigError(fmt::format("{}: cannot open config file: it is not a regular file (a {})", file,
                                  fs::is_character_file(st) ? "character device"
                                  : fs::is_block_file(st)   ? "block device"
                                  : fs::is_fifo(st)         ? "FIFO"
                                  : fs::is_socket(st)       ? "socket"
                                                            : "special file"));
  std::string text(static_cast<size_t>(limits::kConfigBytes) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));  // the file may grow while it is read: never past the bound
  if (static_cast<int64_t>(text.size()) > limits::kConfigBytes)
    throw ConfigError(fmt::format("{}: the config file is larger than {} bytes (1 MiB), the most gputrain reads", file,
                                  limits::kConfigBytes));
  return parse(text, file);
}

ConfigNode ConfigNode::load_string(const std::string& text, const std::string& name) { return parse(text, name); }

std::string ConfigNode::where() const {
  // An override replaced this node or one of its parents: point at the --set, not at the file; at the latest one
  // (`optimizer={…}` after `optimizer.lr=…` replaced both; a +key's map is blamed on it until a --set goes into it).
  for (auto it = m_source->overrides.rbegin(); it != m_source->overrides.rend(); ++it) {
    const std::string& path = it->first;
    if (m_path == path || (m_path.rfind(path, 0) == 0 && (m_path[path.size()] == '.' || m_path[path.size()] == '[')))
      return "(--set " + quote_if_needed(it->second) + ")";
  }
  if (m_mark.is_null()) return "(" + m_source->file + ")";
  return fmt::format("({}:{}:{})", m_source->file, m_mark.line + 1, m_mark.column + 1);
}

void ConfigNode::fail(const std::string& message) const {
  // The path holds keys as the YAML or a --set spelled them: a control byte in one is shown escaped.
  throw ConfigError(fmt::format("{}: {} {}", m_path.empty() ? "config" : quote_if_needed(m_path), message, where()));
}

ConfigNode ConfigNode::operator[](std::string_view key) const {
  const std::string k(key);
  const std::string child_path = m_path.empty() ? k : m_path + "." + k;
  if (!m_node.IsMap()) return ConfigNode(YAML::Node(YAML::NodeType::Undefined), child_path, m_source, m_mark);
  YAML::Node child = m_node[k];
  if (!child.IsDefined()) return ConfigNode(YAML::Node(YAML::NodeType::Undefined), child_path, m_source, m_mark);
  // A key given null (`lr: ~`) is there to be named: its value's position, or the key's for an empty value (`lr:`
  // at the end of a line, which yaml-cpp places at the next token, on a later line).
  YAML::Mark mark = child.Mark();
  if (child.IsNull())
    for (const auto& kv : m_node)
      if (kv.first.IsScalar() && kv.first.Scalar() == k && (mark.is_null() || mark.line != kv.first.Mark().line))
        mark = kv.first.Mark();
  return ConfigNode(child, child_path, m_source, mark.is_null() ? m_mark : mark);
}

bool ConfigNode::null_at(std::string_view key) const {
  if (!m_node.IsMap()) return false;
  const YAML::Node child = m_node[std::string(key)];
  return child.IsDefined() && child.IsNull();
}

ConfigNode ConfigNode::at(size_t index) const {
  YAML::Node child = m_node[index];
  return ConfigNode(child, fmt::format("{}[{}]", m_path, index), m_source, child.IsDefined() ? child.Mark() : m_mark);
}

bool ConfigNode::has(std::string_view key) const { return m_node.IsMap() && (*this)[key].defined(); }

std::vector<std::string> ConfigNode::keys() const {
  std::vector<std::string> out;
  if (m_node.IsMap())
    for (const auto& kv : m_node) out.push_back(kv.first.as<std::string>());
  return out;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

void ConfigNode::expect_keys(const std::vector<std::string>& allowed) const {
  if (!defined()) return;
  if (!m_node.IsMap()) fail("expected a map, got " + describe_value());
  for (const auto& kv : m_node) {
    const auto key = kv.first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    const ConfigNode bad(kv.first, m_path.empty() ? key : m_path + "." + key, m_source, kv.first.Mark());
    const std::string hint = closest_match(key, allowed);
    bad.fail(fmt::format("unknown key{}; valid keys: {}", hint.empty() ? "" : " (did you mean \"" + hint + "\"?)",
                         fmt::join(allowed, ", ")));
  }
}

void ConfigNode::require(std::string_view key) const {
  if (!m_node.IsMap()) fail("expected a map, got " + describe_value());
  if (!has(key)) (*this)[key].fail(null_at(key) ? "is required, got null" : "is required");
}

std::string ConfigNode::describe_value() const {
  if (!m_node.IsDefined()) return "nothing";
  if (m_node.IsNull()) return "null";
  if (m_node.IsMap()) return "a map";
  if (m_node.IsSequence()) return "a list";
  return quote_value(m_node.Scalar());
}

std::string ConfigNode::as_string() const {
  if (!m_node.IsScalar()) fail("expected a string, got " + describe_value());
  return m_node.Scalar();
}

int64_t ConfigNode::as_int(int64_t min, int64_t max) const {
  const char* what = min == 1 ? "a positive integer" : min == 0 ? "a non-negative integer" : "an integer";
  if (!m_node.IsScalar()) fail(std::string("expected ") + what + ", got " + describe_value());
  const std::string& s = m_node.Scalar();
  if (quoted_scalar(m_node))
    fail(std::string("expected ") + what + ", got the quoted string " + quote_value(s) +
         " (write numbers without quotes)");
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  // The whole scalar, not just up to a NUL byte (YAML writes one as "\0"), and in decimal digits only (strtoll also
  // takes leading blanks; a leading zero is octal to YAML 1.1).
  if (!decimal_number(s, /*integer=*/true) || end != s.c_str() + s.size() || errno == ERANGE)
    fail(std::string("expected ") + what + ", got " + quote_value(s) + not_decimal_hint(s));
  if (v < min || v > max) {
    if (max == INT64_MAX)
      fail(fmt::format("expected {}, got {}", min <= 1 && min >= 0 ? what : fmt::format("an integer ≥ {}", min), v));
    fail(fmt::format("expected an integer in [{}, {}], got {}", min, max, v));
  }
  return v;
}

double ConfigNode::as_double() const {
  if (!m_node.IsScalar()) fail("expected a number, got " + describe_value());
  const std::string& s = m_node.Scalar();
  if (quoted_scalar(m_node))
    fail("expected a finite number, got the quoted string " + quote_value(s) + " (write numbers without quotes)");
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const bool parsed = !s.empty() && end == s.c_str() + s.size();
  if (parsed && !std::isfinite(v)) fail("expected a finite number, got " + quote_value(s));
  // strtod also reads hexadecimal (0x10, 0x1p-3), inf and nan, and skips leading blanks.
  if (!parsed || !decimal_number(s, /*integer=*/false))
    fail("expected a finite number, got " + quote_value(s) + not_decimal_hint(s));
  return v;
}

double ConfigNode::as_double(double min, double max, bool min_inclusive) const {
  const double v = as_double();
  if (v < min || v > max || (!min_inclusive && v == min)) {
    if (max >= 1e300)
      fail(fmt::format("expected a number {} {}, got {}", min_inclusive ? "≥" : ">", min, m_node.Scalar()));
    fail(fmt::format("expected a number in {}{}, {}], got {}", min_inclusive ? "[" : "(", min, max, m_node.Scalar()));
  }
  return v;
}

bool ConfigNode::as_bool() const {
  if (m_node.IsScalar()) {
    const std::string& s = m_node.Scalar();
    if (quoted_scalar(m_node))
      fail("expected true or false, got the quoted string " + quote_value(s) + " (write it without quotes)");
    if (s == "true" || s == "True" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "False" || s == "no" || s == "off") return false;
  }
  fail("expected true or false, got " + describe_value());
}

std::string ConfigNode::as_choice(const std::vector<std::string>& choices) const {
  const std::string s = as_string();
  if (std::find(choices.begin(), choices.end(), s) != choices.end()) return s;
  const std::string hint = closest_match(s, choices);
  fail(fmt::format("unknown value {}{}; choose one of: {}", quote_value(s),
                   hint.empty() ? "" : " (did you mean \"" + hint + "\"?)", fmt::join(choices, ", ")));
}

std::vector<int64_t> ConfigNode::as_int_list(int64_t min) const {
  if (!m_node.IsSequence()) fail("expected a list of integers, got " + describe_value());
  std::vector<int64_t> out;
  for (size_t i = 0; i < size(); ++i) out.push_back(at(i).as_int(min));
  return out;
}

int64_t ConfigNode::as_size(int64_t min, const SizeLimit& limit) const {
  const int64_t v = as_int(min);
  if (v > limit.max)
    fail(fmt::format("expected {} ≤ {} ({}), got {}",
                     min == 1   ? std::string("a positive integer")
                     : min == 0 ? std::string("a non-negative integer")
                                : fmt::format("an integer ≥ {} and", min),
                     limit.max, limit.what, v));
  return v;
}

std::vector<int64_t> ConfigNode::as_size_list(int64_t min, const SizeLimit& limit) const {
  if (!m_node.IsSequence()) fail("expected a list of integers, got " + describe_value());
  if (static_cast<int64_t>(size()) > limits::kRank.max)
    fail(fmt::format("expected at most {} dimensions ({}), got {}", limits::kRank.max, limits::kRank.what, size()));
  std::vector<int64_t> out;
  for (size_t i = 0; i < size(); ++i) out.push_back(at(i).as_size(min, limit));
  return out;
}

std::string ConfigNode::get_string(std::string_view key, const std::string& fallback) const {
  const ConfigNode n = (*this)[key];
  return n.defined() ? n.as_string() : fallback;
}
int64_t ConfigNode::get_int(std::string_view key, int64_t fallback, int64_t min, int64_t max) const {
  const ConfigNode n = (*this)[key];
  return n.defined() ? n.as_int(min, max) : fallback;
}
int64_t ConfigNode::get_size(std::string_view key, int64_t fallback, int64_t min, const SizeLimit& limit) const {
  const ConfigNode n = (*this)[key];
  return n.defined() ? n.as_size(min, limit) : fallback;
}
double ConfigNode::get_double(std::string_view key, double fallback, double min, double max) const {
  const ConfigNode n = (*this)[key];
  return n.defined() ? n.as_double(min, max) : fallback;
}
bool ConfigNode::get_bool(std::string_view key, bool fallback) const {
  const ConfigNode n = (*this)[key];
  return n.defined() ? n.as_bool() : fallback;
}
std::string ConfigNode::get_choice(std::string_view key, const std::string& fallback,
                                   const std::vector<std::string>& choices) const {
  const ConfigNode n = (*this)[key];
  return n.defined() ? n.as_choice(choices) : fallback;
}

// --- --set -----------------------------------------------------------------------------------------------------

namespace {

struct PathStep {
  std::string key;  // empty for an index step
  size_t index = 0;
};

std::vector<PathStep> parse_path(const std::string& path, const std::string& assignment) {
  std::vector<PathStep> steps;
  size_t i = 0;
  auto bad = [&](const std::string& why) -> void {
    throw ConfigError(fmt::format("--set {}: {} (write key.sub[2].name=value)", quote_if_needed(assignment), why));
  };
  while (i < path.size()) {
    if (path[i] == '[') {
      const size_t close = path.find(']', i);
      if (close == std::string::npos) bad("unclosed '['");
      const std::string digits = path.substr(i + 1, close - i - 1);
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
        bad("list index " + quote_value(digits) + " is not a non-negative integer");
      // std::stoul would throw std::out_of_range (not a ConfigError) for [99999999999999999999].
      size_t index = 0;
      if (std::from_chars(digits.data(), digits.data() + digits.size(), index).ec != std::errc())
        bad("list index " + digits + " is out of range");
      steps.push_back({"", index});
      i = close + 1;
      if (i < path.size() && path[i] == '.') ++i;
    } else {
      size_t end = path.find_first_of(".[", i);
      if (end == std::string::npos) end = path.size();
      if (end == i) bad("empty key in path");
      steps.push_back({path.substr(i, end - i), 0});
      i = end;
      if (i < path.size() && path[i] == '.') {
        ++i;
        if (i == path.size()) bad("path ends with '.'");
      }
    }
  }
  if (steps.empty()) bad("empty key path");
  return steps;
}

}  // namespace

ConfigNode apply_override(const ConfigNode& root, const std::string& assignment) {
  // Hydra's prefixes: +key=value adds a key the config lacks (and the maps on the way), ++key=value sets it whether
  // or not it is there, ~key (or ~key=value, when it has that value) removes it.
  enum class Mode { set, add, force, remove };
  Mode mode = Mode::set;
  size_t skip = 0;
  if (assignment.rfind("++", 0) == 0) {
    mode = Mode::force, skip = 2;
  } else if (assignment.rfind('+', 0) == 0) {
    mode = Mode::add, skip = 1;
  } else if (assignment.rfind('~', 0) == 0) {
    mode = Mode::remove, skip = 1;
  }
  // The assignment and the key paths cut from it, as messages show them (escaped when they hold a control byte).
  const std::string shown = quote_if_needed(assignment);
  const auto q = [](const std::string& s) { return quote_if_needed(s); };
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos && mode != Mode::remove)
    throw ConfigError(
        fmt::format("--set {}: expected KEY=VALUE (or +KEY=VALUE to add a key, ~KEY to remove one)", shown));
  const std::string path = assignment.substr(skip, eq == std::string::npos ? std::string::npos : eq - skip);
  const std::optional<std::string> text =
      eq == std::string::npos ? std::nullopt : std::optional<std::string>(assignment.substr(eq + 1));
  const std::vector<PathStep> steps = parse_path(path, assignment);

  std::string norm;
  for (const PathStep& st : steps)
    norm += st.key.empty() ? fmt::format("[{}]", st.index) : (norm.empty() ? "" : ".") + st.key;

  YAML::Node value;
  if (text) {
    try {
      value = YAML::Load(*text);
    } catch (const YAML::Exception& e) {
      throw ConfigError(fmt::format("--set {}: the value is not valid YAML: {}", shown, e.msg));
    }
    auto override_source = std::make_shared<ConfigSource>();
    override_source->overrides.emplace_back(norm, assignment);  // so that messages point at the --set
    TreeCheck{*text, override_source, assignment}.check(value, norm);
  }
  // What to write instead, for messages: `key=value` as +key=value, or the other way round.
  const std::string value_part = text ? "=" + *text : "";
  const std::string as_add = "+" + path + value_part, as_set = path + value_part;
  const bool creates = mode == Mode::add || mode == Mode::force;

  // Walk to the parent of the last step; every step on the way must exist, except that + and ++ create maps.
  YAML::Node node = root.yaml();
  std::string walked, created;  // created: the first map made on the way, which messages then blame on the --set
  for (size_t s = 0; s + 1 < steps.size(); ++s) {
    const PathStep& st = steps[s];
    YAML::Node next;
    if (!st.key.empty()) {
      const bool missing = node.IsMap() && (!node[st.key].IsDefined() || node[st.key].IsNull());
      // A whole section the file leaves out (checkpoint, dist, scheduler, ...) is created empty; a name that is not
      // a section then fails validation with a did-you-mean. Deeper keys must exist, or be added with +.
      if (missing && mode != Mode::remove && (s == 0 || creates)) {
        if (steps[s + 1].key.empty())
          throw ConfigError(fmt::format("--set {}: the config has no list {}{}", shown,
                                        q(walked.empty() ? st.key : walked + "." + st.key),
                                        creates ? "; + adds maps on the way, not lists" : ""));
        node[st.key] = YAML::Node(YAML::NodeType::Map);
        if (created.empty()) created = walked.empty() ? st.key : walked + "." + st.key;
      }
      if (!node.IsMap() || !node[st.key].IsDefined() || node[st.key].IsNull()) {
        const std::string key = walked.empty() ? st.key : walked + "." + st.key;
        if (mode == Mode::set && node.IsMap())
          throw ConfigError(
              fmt::format("--set {}: the config has no key {}; write {} to add it", shown, q(key), q(as_add)));
        throw ConfigError(
            fmt::format("--set {}: the config has no key {}{}", shown, q(key),
                        node.IsMap() || walked.empty() ? "" : fmt::format(" ({} is not a map)", q(walked))));
      }
      walked += (walked.empty() ? "" : ".") + st.key;
      next = node[st.key];
    } else {
      if (!node.IsSequence() || st.index >= node.size())
        throw ConfigError(fmt::format("--set {}: {} has no item [{}]{}", shown,
                                      walked.empty() ? "the config" : q(walked), st.index,
                                      node.IsSequence() ? fmt::format(" (it has {})", node.size()) : " (not a list)"));
      walked += fmt::format("[{}]", st.index);
      next = node[st.index];
    }
    node.reset(next);
  }
  const PathStep& last = steps.back();
  const std::string where = walked.empty() ? "the config" : q(walked);
  if (!last.key.empty()) {
    if (!node.IsMap() && !(node.IsNull() && !walked.empty() && mode != Mode::remove))
      throw ConfigError(fmt::format("--set {}: {} is not a map", shown, where));
    const bool present = node.IsMap() && node[last.key].IsDefined() && !node[last.key].IsNull();
    if (mode == Mode::remove) {
      if (!present)
        throw ConfigError(fmt::format("--set {}: the config has no key {}; nothing to remove", shown, q(norm)));
      if (text && YAML::Dump(node[last.key]) != YAML::Dump(value))
        throw ConfigError(fmt::format("--set {}: {} is {}, not {}; write {} to remove it whatever it is", shown,
                                      q(norm), quote_value(YAML::Dump(node[last.key])), quote_value(*text),
                                      q("~" + path)));
      node.remove(last.key);
      return root.with_override(norm, assignment);  // a missing required key then points at the --set
    }
    if (mode == Mode::add && present)
      throw ConfigError(fmt::format("--set {}: {} is already set (to {}); write {} to replace it", shown, q(norm),
                                    quote_value(YAML::Dump(node[last.key])), q(as_set)));
    node[last.key] = value;
  } else {
    const size_t size = node.IsSequence() ? node.size() : 0;
    // + and ++ may append: the index one past the end adds an item.
    const bool append = creates && node.IsSequence() && last.index == size;
    if (!node.IsSequence() || (last.index >= size && !append)) {
      const std::string hint = node.IsSequence() && last.index == size && mode == Mode::set
                                   ? fmt::format("; write {} to append", q(as_add))
                               : node.IsSequence() ? fmt::format(" (it has {})", size)
                                                   : " (not a list)";
      throw ConfigError(fmt::format("--set {}: {} has no item [{}]{}{}", shown, where, last.index, hint,
                                    mode == Mode::remove ? "; nothing to remove" : ""));
    }
    if (mode == Mode::remove) {
      if (text && YAML::Dump(node[last.index]) != YAML::Dump(value))
        throw ConfigError(fmt::format("--set {}: {} is {}, not {}; write {} to remove it whatever it is", shown,
                                      q(norm), quote_value(YAML::Dump(node[last.index])), quote_value(*text),
                                      q("~" + path)));
      // The items after it move up: a message about one of them must not point at this --set, so none is recorded.
      YAML::Node rest(YAML::NodeType::Sequence);
      for (size_t i = 0; i < size; ++i)
        if (i != last.index) rest.push_back(node[i]);
      node = rest;
      return root;
    }
    if (mode == Mode::add && !append)
      throw ConfigError(fmt::format("--set {}: {} is already set (to {}); write {} to replace it", shown, q(norm),
                                    quote_value(YAML::Dump(node[last.index])), q(as_set)));
    if (append)
      node.push_back(value);
    else
      node[last.index] = value;
  }

  const ConfigNode out = root.with_override(norm, assignment);
  return created.empty() ? out : out.with_override(created, assignment);
}

ConfigNode ConfigNode::with_override(const std::string& path, const std::string& text) const {
  auto src = std::make_shared<ConfigSource>(*m_source);
  std::erase_if(src->overrides, [&](const auto& o) { return o.first == path; });
  src->overrides.emplace_back(path, text);
  return ConfigNode(m_node, m_path, src, m_mark);
}

}  // namespace gt
