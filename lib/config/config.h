// Config nodes that know their key path and YAML position, so every error can say where to fix it:
//   model.layers[3].out_features: expected a positive integer, got "abc" (config.yaml:14:22)
#pragma once

#include "core/error.h"
#include "core/limits.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gt {

/// Where the YAML came from: a file name, plus the `--set` overrides that replaced parts of it.
struct ConfigSource {
  std::string file;
  /// (key path, the `--set` text that set it), in the order they were applied: the latest that covers a node is
  /// the one its messages name.
  std::vector<std::pair<std::string, std::string>> overrides;
};

class ConfigNode {
 public:
  ConfigNode() : ConfigNode(YAML::Node(), "", std::make_shared<ConfigSource>(), YAML::Mark()) {}
  ConfigNode(YAML::Node node, std::string path, std::shared_ptr<const ConfigSource> source, YAML::Mark mark);
  ConfigNode(const ConfigNode&) = default;
  ConfigNode(ConfigNode&&) = default;
  /// Makes this handle refer to `other`'s node. (YAML::Node's own assignment writes into the node it refers to,
  /// which would change the tree, and throws for the node of a missing key: positions are kept and copied here.)
  ConfigNode& operator=(const ConfigNode& other) {
    if (this == &other) return *this;
    m_node.~Node();
    new (&m_node) YAML::Node(other.m_node);
    m_path = other.m_path;
    m_source = other.m_source;
    m_mark = other.m_mark;
    return *this;
  }

  /// Loads a YAML file; syntax errors become ConfigErrors with the position.
  static ConfigNode load_file(const std::string& file);
  /// Parses YAML text (for tests and overrides); `name` stands in for the file name in messages.
  static ConfigNode load_string(const std::string& text, const std::string& name);

  const std::string& path() const { return m_path; }
  const YAML::Node& yaml() const { return m_node; }
  bool defined() const { return m_node.IsDefined() && !m_node.IsNull(); }
  bool is_map() const { return m_node.IsMap(); }
  bool is_sequence() const { return m_node.IsSequence(); }
  bool is_scalar() const { return m_node.IsScalar(); }

  /// "(config.yaml:14:22)" or "(--set optimizer.lr=abc)"; the parent's position for a missing key.
  std::string where() const;
  /// Throws a ConfigError "path: message (where)".
  [[noreturn]] void fail(const std::string& message) const;

  /// The child at `key` (maybe undefined: then it reports its parent's position).
  ConfigNode operator[](std::string_view key) const;
  ConfigNode at(size_t index) const;
  size_t size() const { return m_node.size(); }
  bool has(std::string_view key) const;
  /// Whether the key is there with a null value (`key: ~`, `key: null`, `key:`), which has() and defined() count as
  /// absent.
  bool null_at(std::string_view key) const;
  std::vector<std::string> keys() const;

  /// Fails unless this is a map whose keys all appear in `allowed`; names the first unknown key, offers the
  /// closest allowed one ("did you mean") and lists them all.
  void expect_keys(const std::vector<std::string>& allowed) const;
  /// Fails when a required key is missing (or null).
  void require(std::string_view key) const;

  // Typed reads: each fails with "expected …, got …" naming this node. A number is a plain scalar in decimal digits
  // (a quoted one is a string to YAML; 0x10, 0o17, 1_000 and a leading zero are refused), true or false one too.
  std::string as_string() const;
  int64_t as_int(int64_t min = INT64_MIN, int64_t max = INT64_MAX) const;
  double as_double() const;
  double as_double(double min, double max, bool min_inclusive = true) const;
  bool as_bool() const;
  /// The same node whose source records that `path` was set by `--set text` (for messages).
  ConfigNode with_override(const std::string& path, const std::string& text) const;
  std::string as_choice(const std::vector<std::string>& choices) const;
  std::vector<int64_t> as_int_list(int64_t min = INT64_MIN) const;
  /// A size: an integer ≥ min and ≤ limit.max; past the limit the message names it ("… ≤ 16777216 (the largest
  /// batch size), got …"), so a size near 2^63 is refused before anything multiplies it.
  int64_t as_size(int64_t min, const SizeLimit& limit) const;
  /// A list of sizes (a shape): at most limits::kRank entries, each as as_size.
  std::vector<int64_t> as_size_list(int64_t min, const SizeLimit& limit) const;

  // Reads of optional keys with defaults.
  std::string get_string(std::string_view key, const std::string& fallback) const;
  int64_t get_int(std::string_view key, int64_t fallback, int64_t min = INT64_MIN, int64_t max = INT64_MAX) const;
  double get_double(std::string_view key, double fallback, double min = -1e300, double max = 1e300) const;
  int64_t get_size(std::string_view key, int64_t fallback, int64_t min, const SizeLimit& limit) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string get_choice(std::string_view key, const std::string& fallback,
                         const std::vector<std::string>& choices) const;

 private:
  std::string describe_value() const;

  YAML::Node m_node;
  std::string m_path;
  std::shared_ptr<const ConfigSource> m_source;
  YAML::Mark m_mark;  // this node's position, or the parent's when the node is missing
};

/// Applies `--set key.path[2].sub=value` to a loaded config: the value is parsed as a YAML scalar or flow
/// collection. Every map and list on the way must exist; the last key may be new in a map (schema validation
/// then judges it). Returns the config with the override recorded for error messages.
ConfigNode apply_override(const ConfigNode& root, const std::string& assignment);

/// Levenshtein distance, for "did you mean".
size_t edit_distance(std::string_view a, std::string_view b);
/// The closest candidate within a small distance, or "".
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace gt
