// The config language as a JSON Schema (`gputrain config schema`), generated from the tables the parsers validate with.
#pragma once

#include <string>

namespace gt {

/// The JSON Schema (draft 2020-12) of a whole experiment file: every section's keys with their types, bounds,
/// enums, defaults and descriptions, unknown keys refused, and the layer list from the layer registry. Editors
/// that read `# yaml-language-server: $schema=…` complete and check configs with it.
std::string config_json_schema();

}  // namespace gt
