// The `model:` section as typed layers: parsed once with the rest of the experiment, built by Model::build.
#pragma once

#include "config/config.h"
#include "layers/layer.h"

#include <optional>
#include <string>
#include <vector>

namespace gt {

/// One layer of the model as the config lists it (a `repeat:` block's layers stand in the list once per pass).
struct ModelLayer {
  /// The item as written: a bare type name or a map of `type:` and the layer's arguments. The layer is made from it,
  /// and errors about the layer name its path and position.
  ConfigNode cfg;
  std::string type;
  std::string name;  ///< "layers.3" unless the config names it; "<block>.<k>.<name>" inside a `repeat:` block
  const LayerSpec* spec = nullptr;  ///< its registry entry
  /// The layers it reads, as positions in the list (-1: the model input), as the graph runs them: they differ from
  /// `listed_inputs` (as the config wires them) only where a relu is moved after the max pool that reads it.
  std::vector<int> inputs;
  std::vector<int> listed_inputs;
  int block = -1;    ///< the pass of a top-level `repeat:` block it belongs to (an id); -1: none
  int tied_to = -1;  ///< `tied_to:`: the list position of the layer whose weight it uses; -1: none
};

/// train.lora: adapters on the products whose weights the globs `targets` name ("h.*.attn.qkv.weight",
/// "*.fc.weight"), and every other parameter frozen except those `also_train` names (PEFT's modules_to_save).
struct LoraPlan {
  std::vector<std::string> targets, also_train;
  LoraConfig cfg;
  ConfigNode at;  ///< the train.lora node: a target that matches no product fails here
};

/// Reads train.lora (`{targets: [...], rank, alpha, dropout, also_train: [...]}`); nullopt where it is absent or null.
std::optional<LoraPlan> parse_lora_plan(const ConfigNode& n);
/// The same as config.resolved.yaml writes it.
YAML::Node to_yaml(const LoraPlan& p);

struct ModelSpec {
  ConfigNode where;                     ///< the `model.layers` list (a message about the model as a whole names it)
  std::optional<LoraPlan> lora;         ///< train.lora (parse_experiment sets it), applied by Model::build
  std::vector<ModelLayer> layers;       ///< in config-list order, `repeat:` blocks expanded in place
  std::vector<int> order;               ///< the execution order: list positions, every input before its reader
  std::vector<std::vector<int>> users;  ///< per layer, the list positions of the layers that read it
};

/// Reads `model:`: keys, layer types and names, `inputs:` and `tied_to:` resolved, `repeat:` blocks expanded, the
/// execution order. A layer's own arguments are checked for unknown keys here and read when the layer is made
/// (Model::build), where shapes are known. Throws ConfigError naming the key.
ModelSpec parse_model_spec(const ConfigNode& model_cfg);

struct SectionSpec;
/// The `model:` section's keys (its `layers:` list).
const SectionSpec& model_section();
/// The JSON Schema of one item of a layer list, generated from the layer registry: a bare type, a `repeat:` block or
/// a map of `type:` and that type's arguments (the schema's $defs/layer, which layer lists refer to).
std::string layer_json_schema();

}  // namespace gt
