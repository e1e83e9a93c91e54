// The layer registry: one explicit sorted table (no static-init registrars, which vanish in static links).
#include "layers/layer.h"

#include <algorithm>

namespace gt {

const std::vector<LayerSpec>& layer_registry() {
  static const std::vector<LayerSpec> table = {
      {"flatten", "Flattens each sample to one dimension: [C, H, W] → [C·H·W]. No copy.", {}, make_flatten},
      {"gelu", "GELU, exact form: x·Φ(x) (PyTorch's default, approximate='none').", {}, make_gelu},
      {"linear",
       "Fully connected: y = x·Wᵀ + b over the last dimension. W is [out, in], initialised U(±1/√in) like "
       "torch.nn.Linear.",
       {{"out_features", "int", "", "output features", true},
        {"bias", "bool", "true", "add a learned bias", false}},
       make_linear},
      {"relu", "max(x, 0).", {}, make_relu},
      {"sigmoid", "1 / (1 + e^−x).", {}, make_sigmoid},
      {"tanh", "tanh(x).", {}, make_tanh},
  };
  return table;
}

const LayerSpec* find_layer(std::string_view type) {
  const auto& table = layer_registry();
  auto it = std::find_if(table.begin(), table.end(), [&](const LayerSpec& s) { return s.type == type; });
  return it == table.end() ? nullptr : &*it;
}

std::string layer_reference_markdown() {
  std::string out = "| type | arguments | what it does |\n|---|---|---|\n";
  for (const LayerSpec& s : layer_registry()) {
    std::string args;
    for (const LayerArg& a : s.args) {
      if (!args.empty()) args += "<br>";
      args += fmt::format("`{}` ({}{})", a.name, a.type, a.required ? ", required" : ", default " + a.fallback);
      if (!a.doc.empty()) args += ": " + a.doc;
    }
    out += fmt::format("| `{}` | {} | {} |\n", s.type, args.empty() ? "—" : args, s.summary);
  }
  return out;
}

}  // namespace gt
