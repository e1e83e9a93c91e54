// The config language as data: one table of keys per section, which the section's parser reads its key names,
// bounds and defaults from, and which `gputrain config schema` writes out as a JSON Schema (`gputrain config
// reference` as Markdown), so they cannot drift.
#pragma once

#include "config/config.h"
#include "core/limits.h"

#include <string>
#include <vector>

namespace gt {

struct SectionSpec;

/// What a key holds. A section's parser reads it with the ConfigNode read of the same name (as_size, as_double, …).
enum class KeyKind {
  integer,  ///< as_int(min, max)
  size,     ///< as_size(min, *limit)
  number,   ///< as_double(min, max, !min_exclusive)
  boolean,  ///< as_bool
  string,   ///< as_string: any scalar, read as text (pattern and max_length narrow it)
  choice,   ///< as_choice(choices)
  list,     ///< a sequence of items[0]
  map,      ///< a map whose keys are *section
  any_of,   ///< one of the kinds in items (the config reads which by looking: "epoch" or a size)
  custom,   ///< what extra_json says alone (the layer list, whose items come from the layer registry)
};

/// One key of a section: its name, what it holds, its bounds and its default as the reference and the schema show them.
struct KeySpec {
  std::string name = "";
  KeyKind kind = KeyKind::string;
  bool required = false;
  bool nullable = false;  ///< null is written for "none" (config.resolved.yaml writes it so)
  double min = -1e300;    ///< integer, size, number; an item count for a list
  double max = 1e300;     ///< integer, number; a size's is limit->max
  bool min_exclusive = false;
  const SizeLimit* limit = nullptr;       ///< size: the upper bound and its words
  std::vector<std::string> choices = {};  ///< choice
  std::string pattern = "";               ///< string: an ECMA regular expression the whole text matches
  int64_t max_length = 0;                 ///< string: at most this many characters (0: any)
  int64_t min_items = 0, max_items = 0;   ///< list (max 0: any)
  std::vector<KeySpec> items = {};        ///< list: the item (one); any_of: the alternatives
  const SectionSpec* section = nullptr;   ///< map
  std::string fallback = "";              ///< the default as the config writes it; "" when there is none
  std::string doc = "";
  /// What the parser checks beyond the read, as JSON Schema members merged into the key's schema
  /// ("exclusiveMaximum": 1 for a beta read with as_double(0, 1) and then refused at 1).
  std::string extra_json = "";
};

/// A map's keys. A section whose keys depend on one of them (optimizer.type, data.format) has one variant per value
/// of that key, each with its whole key list in the order "valid keys: …" lists them; others have one variant.
struct SectionSpec {
  struct Variant {
    std::vector<std::string> when;  ///< the discriminator's values this key list serves (empty: always)
    std::vector<KeySpec> keys;
    std::string extra_json = "";  ///< as SectionSpec::extra_json, for this variant ("train or test is required")
  };
  std::string discriminator;  ///< "" for a section of one key list
  std::vector<Variant> variants;
  /// Requirements no single key states, as JSON Schema members ("oneOf": […]) added to the section's object.
  std::string extra_json;
  std::string doc;
};

/// A section of one key list.
SectionSpec plain_section(std::vector<KeySpec> keys, std::string doc = "", std::string extra_json = "");
/// The key lists concatenated, in order (a variant's common keys and its own).
std::vector<KeySpec> concat_keys(std::initializer_list<std::vector<KeySpec>> parts);

/// The names of `keys` in order: what ConfigNode::expect_keys takes.
std::vector<std::string> key_names(const std::vector<KeySpec>& keys);
/// ConfigNode::expect_keys(key_names(keys)), and a key given null (`key: ~`, `key: null`, `key:`) refused unless its
/// entry is nullable: "expected a number in [0, 1], got null (leave the key out for its default)".
void expect_keys(const ConfigNode& section, const std::vector<KeySpec>& keys);
/// What a value of the entry is, as messages say it: "a positive integer", "a number > 0", "one of: sgd, adam".
std::string expected_words(const KeySpec& key);
/// The key list of the variant serving discriminator value `value` ("" for a plain section).
const std::vector<KeySpec>& section_keys(const SectionSpec& section, const std::string& value = "");
/// The entry `name` of `keys`; a miss is a bug in the table (throws gt::Error).
const KeySpec& key_spec(const std::vector<KeySpec>& keys, const std::string& name);

// Typed reads of an optional key with the entry's bounds and default (the default parsed from its text).
int64_t get_size(const ConfigNode& section, const KeySpec& key);
int64_t get_int(const ConfigNode& section, const KeySpec& key);
double get_double(const ConfigNode& section, const KeySpec& key);
bool get_bool(const ConfigNode& section, const KeySpec& key);
/// The node's read as the entry says (a present key): as_size(min, *limit) or as_double(min, max, !min_exclusive).
int64_t read_size(const ConfigNode& n, const KeySpec& key);
double read_double(const ConfigNode& n, const KeySpec& key);

/// The JSON Schema (as JSON text) of one key's value, and of a section's map: properties, bounds, enums, defaults,
/// descriptions, `additionalProperties: false`, and an if/then per variant.
std::string key_json_schema(const KeySpec& key);
std::string section_json_schema(const SectionSpec& section);

/// The reference of a section in Markdown (`gputrain config reference`): a table per map, depth first, one per
/// variant (`optimizer` with type: sgd, …), columns key, type, default, range or choices, description. `name` is the
/// section's path ("" for the top level of an experiment file).
std::string section_markdown(const SectionSpec& section, const std::string& name = "");

}  // namespace gt
