// The experiment's key table as one JSON Schema document, with the layer list's items under $defs.
#include "train/config_schema.h"

#include "graph/model.h"
#include "train/experiment.h"

#include <nlohmann/json.hpp>

namespace gt {

std::string config_json_schema() {
  using ojson = nlohmann::ordered_json;
  ojson s{{"$schema", "https://json-schema.org/draft/2020-12/schema"}, {"title", "gputrain experiment config"}};
  const ojson top = ojson::parse(section_json_schema(experiment_section()));
  for (const auto& [k, v] : top.items()) s[k] = v;
  s["$defs"] = ojson{{"layer", ojson::parse(layer_json_schema())}};
  return s.dump(2) + "\n";
}

}  // namespace gt
