// Modes the config names by word and the code holds as enum class values: one table per mode maps each value to its
// name, and serves the parser, the "choose one of" list of its errors and the resolved YAML alike.
#pragma once

#include "config/config.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

namespace gt {

/// One row of a mode's table. A table is any sequence of rows with `value` and `name` members (the data formats'
/// table carries more columns).
template <typename E>
struct Choice {
  E value;
  std::string name;
};

/// The names of a table's rows in its order: the valid choices an error lists.
template <typename Table>
std::vector<std::string> choice_names(const Table& table) {
  std::vector<std::string> names;
  for (const auto& row : table) names.push_back(row.name);
  return names;
}

/// The row of `value`; every value of a mode has one, so a miss is a bug in the table.
template <typename Table, typename E>
const auto& choice_row(const Table& table, E value) {
  for (const auto& row : table)
    if (row.value == value) return row;
  throw Error(fmt::format("mode value {} has no row in its table", static_cast<int>(value)));
}

/// The name the config writes for `value`.
template <typename Table, typename E>
const std::string& choice_name(const Table& table, E value) {
  return choice_row(table, value).name;
}

/// Reads `n` as one of the table's names; an unknown name fails with a "did you mean" and the list of names.
template <typename Table>
auto parse_choice(const ConfigNode& n, const Table& table) {
  const std::string name = n.as_choice(choice_names(table));  // fails unless some row has the name
  return std::find_if(std::begin(table), std::end(table), [&](const auto& row) { return row.name == name; })->value;
}

}  // namespace gt
