// Parsing `model:` into a ModelSpec: layer types and names, inputs resolved, `repeat:` blocks expanded, the execution
// order; and the section's JSON Schema, generated from the layer registry.
#include "graph/model_spec.h"

#include "config/schema.h"
#include "layers/lora.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/ranges.h>

namespace gt {

namespace {

std::vector<std::string> registry_types() {
  std::vector<std::string> v;
  for (const auto& s : layer_registry()) v.push_back(s.type);
  return v;
}

// One layer as written in the config, before ordering.
struct Pending {
  ConfigNode cfg;
  std::string type, name;
  const LayerSpec* spec = nullptr;
  std::vector<std::string> input_names;
  std::vector<int> inputs;  // positions in the expanded list; -1 = model input
  // Inside `repeat:` blocks: the name prefixes that `inputs:` are looked up under, innermost first ("h.1.", then ""
  // for the top level), and what `input` means there: the layer before this iteration of the innermost block.
  std::vector<std::string> scopes{""};
  int block_input = -1;
  int block = -1;    // one pass of a top-level `repeat:` block (an id, shared by its layers); -1: outside any
  int tied_to = -1;  // `tied_to:`: the list position of the layer whose weight it uses
};

// A model of at most this many layers once `repeat:` blocks are expanded (GPT-2 XL has ~50 per block × 48 blocks).
constexpr int64_t kMaxLayers = 100000;

// An item of a layer list, in the JSON Schema: its definition is layer_json_schema(), under $defs.
const KeySpec kLayerItem{.name = "layer", .kind = KeyKind::custom, .extra_json = R"("$ref": "#/$defs/layer")"};

KeySpec layer_list_key(const char* doc) {
  return {.name = "layers", .kind = KeyKind::list, .required = true, .min_items = 1, .items = {kLayerItem}, .doc = doc};
}

// The keys every layer map has besides its type's arguments.
const std::vector<KeySpec>& layer_common_keys() {
  static const std::vector<KeySpec> keys{
      {.name = "type",
       .kind = KeyKind::choice,
       .required = true,
       .choices = registry_types(),
       .doc = "the layer type (gputrain layers lists them)"},
      {.name = "name",
       .kind = KeyKind::string,
       .pattern = "^(?!input$).+$",
       .doc = "default layers.<index>; `input` and \"\" are reserved"},
      {.name = "inputs",
       .kind = KeyKind::any_of,
       .items = {{.name = "name", .kind = KeyKind::string},
                 {.name = "names",
                  .kind = KeyKind::list,
                  .min_items = 1,
                  .items = {{.name = "name", .kind = KeyKind::string}}}},
       .doc = "names of the layers it reads, or `input`; default: the layer listed before it"},
  };
  return keys;
}

const SectionSpec& repeat_block_section() {
  static const SectionSpec s =
      plain_section({{.name = "repeat",
                      .kind = KeyKind::integer,
                      .required = true,
                      .min = 1,
                      .max = kMaxLayers,
                      .doc = "how many times the block's layers stand in the list"},
                     {.name = "name",
                      .kind = KeyKind::string,
                      .pattern = "^(?!input$).+$",
                      .doc = "the block's name: its layers are named <name>.<k>.<layer name>"},
                     layer_list_key("the block's layers; `input` inside is the block's input")},
                    "a block of layers repeated: {repeat: N, name: h, layers: [...]}");
  return s;
}

// A layer argument's entry, from the registry's type words ("int", "int or [h, w]", …): each word the registry uses
// has a kind here, and a new one fails the schema's test until it has.
KeySpec layer_arg_key(const LayerArg& a) {
  KeySpec k{.name = a.name, .required = a.required, .doc = a.doc};
  if (a.type == "int") {
    k.kind = KeyKind::integer;
  } else if (a.type == "float") {
    k.kind = KeyKind::number;
  } else if (a.type == "bool") {
    k.kind = KeyKind::boolean;
  } else if (a.type == "layer name") {
    k.kind = KeyKind::string;
  } else if (a.type == "{rank, alpha, dropout}") {  // LoRA's settings (layers/lora.h reads them)
    k.kind = KeyKind::custom;
    k.extra_json =
        R"("type": "object", "required": ["rank"], "additionalProperties": false, "properties": {"rank": )"
        R"({"type": "integer", "minimum": 1}, "alpha": {"type": "number", "minimum": 0}, "dropout": {"type": )"
        R"("number", "minimum": 0, "exclusiveMaximum": 1}})";
  } else if (a.type == "int or [h, w]") {
    k.kind = KeyKind::any_of;
    k.items = {{.name = "both", .kind = KeyKind::integer},
               {.name = "h_w",
                .kind = KeyKind::list,
                .min_items = 2,
                .max_items = 2,
                .items = {{.name = "side", .kind = KeyKind::integer}}}};
  } else if (a.type.find(" or ") != std::string::npos && a.type.find_first_of("[]") == std::string::npos) {
    k.kind = KeyKind::choice;  // "none or tanh"
    for (size_t at = 0; at != std::string::npos;) {
      const size_t next = a.type.find(" or ", at);
      k.choices.push_back(a.type.substr(at, next == std::string::npos ? std::string::npos : next - at));
      at = next == std::string::npos ? next : next + 4;
    }
  } else {
    throw Error(
        fmt::format("layer argument {} has type \"{}\", which the config schema does not know", a.name, a.type));
  }
  // A default that is a value of the kind goes to the schema's default; one that names something ("kernel_size",
  // "none": off) to the description.
  const std::string& f = a.fallback;
  char* end = nullptr;
  const bool number = !f.empty() && (std::strtod(f.c_str(), &end), *end == '\0');
  const bool fits =
      (k.kind == KeyKind::number && number) ||
      (k.kind == KeyKind::integer && number && f.find_first_not_of("-0123456789") == std::string::npos) ||
      (k.kind == KeyKind::boolean && (f == "true" || f == "false")) ||
      (k.kind == KeyKind::choice && std::find(k.choices.begin(), k.choices.end(), f) != k.choices.end()) ||
      (k.kind == KeyKind::any_of && number);
  if (fits)
    k.fallback = f;
  else if (!f.empty())
    k.doc += (k.doc.empty() ? "" : "; ") + std::string("default ") + f;
  return k;
}

// 1. Every layer's type, name and input names as the config writes them, `repeat:` blocks expanded in place: the
//    block's layers N times, named "<block>.<k>.<name>" (unnamed ones "<block>.<k>.<index>").
void read_layer_list(const ConfigNode& layers, const std::vector<std::string>& scopes, std::vector<Pending>& pending,
                     std::map<std::string, int>& by_name);

void read_block(const ConfigNode& cfg, const std::string& name, const std::vector<std::string>& scopes,
                std::vector<Pending>& pending, std::map<std::string, int>& by_name) {
  const std::vector<KeySpec>& keys = section_keys(repeat_block_section());
  expect_keys(cfg, keys);
  cfg.require("layers");
  const KeySpec& repeat = key_spec(keys, "repeat");
  const int64_t times = cfg["repeat"].as_int(static_cast<int64_t>(repeat.min), static_cast<int64_t>(repeat.max));
  const ConfigNode inner = cfg["layers"];
  if (!inner.is_sequence() || inner.size() == 0) inner.fail("expected a non-empty list of layers");
  for (int64_t k = 0; k < times; ++k) {
    std::vector<std::string> inner_scopes{scopes.front() + name + "." + std::to_string(k) + "."};
    inner_scopes.insert(inner_scopes.end(), scopes.begin(), scopes.end());
    const size_t first = pending.size();
    read_layer_list(inner, inner_scopes, pending, by_name);
    for (size_t j = first; j < pending.size(); ++j) {
      if (pending[j].scopes.front() == inner_scopes.front()) pending[j].block_input = static_cast<int>(first) - 1;
      if (scopes.size() == 1) pending[j].block = static_cast<int>(first);  // a top-level block: the whole pass
    }
  }
}

void read_layer_list(const ConfigNode& layers, const std::vector<std::string>& scopes, std::vector<Pending>& pending,
                     std::map<std::string, int>& by_name) {
  const std::string& prefix = scopes.front();
  for (size_t i = 0; i < layers.size(); ++i) {
    const ConfigNode cfg = layers.at(i);
    const std::string default_name = prefix.empty() ? fmt::format("layers.{}", i) : prefix + std::to_string(i);
    if (cfg.is_map() && cfg.has("repeat")) {
      std::string name = cfg.has("name") ? cfg["name"].as_string() : default_name;
      if (name.empty() || name == "input") cfg["name"].fail("`input` and \"\" are reserved names");
      read_block(cfg, name, scopes, pending, by_name);
      continue;
    }
    if (static_cast<int64_t>(pending.size()) >= kMaxLayers)
      cfg.fail(fmt::format("the model has more than {} layers once repeat: blocks are expanded", kMaxLayers));
    Pending p{cfg, "", default_name, nullptr, {}, {}, scopes, -1, -1, -1};
    if (cfg.is_scalar()) {
      p.type = cfg.as_string();
    } else if (cfg.is_map()) {
      cfg.require("type");
      p.type = cfg["type"].as_string();
    } else {
      cfg.fail("expected a layer type name or a map with `type:`");
    }
    p.spec = find_layer(p.type);
    if (!p.spec) {
      const ConfigNode at = cfg.is_map() ? cfg["type"] : cfg;
      const std::string hint = closest_match(p.type, registry_types());
      at.fail(fmt::format("unknown layer type \"{}\"{}; known types: {}", p.type,
                          hint.empty() ? "" : " (did you mean \"" + hint + "\"?)", fmt::join(registry_types(), ", ")));
    }
    std::vector<KeySpec> keys = layer_common_keys();
    for (const auto& a : p.spec->args) keys.push_back(layer_arg_key(a));
    if (cfg.is_map()) {
      expect_keys(cfg, keys);
      if (cfg.has("name")) {
        const std::string name = cfg["name"].as_string();
        if (name.empty() || name == "input") cfg["name"].fail("`input` and \"\" are reserved names");
        p.name = prefix + name;
      }
      if (cfg.has("inputs")) {
        const ConfigNode in = cfg["inputs"];
        if (in.is_scalar()) {
          p.input_names.push_back(in.as_string());
        } else if (in.is_sequence() && in.size() > 0) {
          for (size_t k = 0; k < in.size(); ++k) p.input_names.push_back(in.at(k).as_string());
        } else {
          in.fail("expected a layer name or a non-empty list of names");
        }
      }
    } else {
      for (const auto& a : p.spec->args)
        if (a.required)
          cfg.fail(fmt::format("layer {} needs `{}`; write {{type: {}, {}: …}}", p.type, a.name, p.type, a.name));
    }
    const auto [at, fresh] = by_name.emplace(p.name, static_cast<int>(pending.size()));
    if (!fresh)
      (cfg.is_map() && cfg.has("name") ? cfg["name"] : cfg)
          .fail(fmt::format("the name \"{}\" is already used by {}", p.name,
                            pending[static_cast<size_t>(at->second)].cfg.path()));
    pending.push_back(std::move(p));
  }
}

std::vector<Pending> read_layers(const ConfigNode& layers, std::map<std::string, int>& by_name) {
  std::vector<Pending> pending;
  read_layer_list(layers, {""}, pending, by_name);
  return pending;
}

// 2. Input names resolved to list positions; the default input is the layer listed before (the model input for the
//    first).
void resolve_inputs(std::vector<Pending>& pending, const std::map<std::string, int>& by_name) {
  std::vector<std::string> known{"input"};
  for (const auto& p : pending) known.push_back(p.name);
  for (size_t i = 0; i < pending.size(); ++i) {
    Pending& p = pending[i];
    if (p.input_names.empty()) p.input_names.push_back(i == 0 ? "input" : pending[i - 1].name);
    const ConfigNode where = p.cfg.is_map() && p.cfg.has("inputs") ? p.cfg["inputs"] : p.cfg;
    for (const auto& n : p.input_names) {
      if (n == "input") {  // the model input, or inside a repeat: block the input of the block
        p.inputs.push_back(p.block_input);
        continue;
      }
      auto it = by_name.end();
      for (size_t s = 0; s < p.scopes.size() && it == by_name.end(); ++s) it = by_name.find(p.scopes[s] + n);
      if (it == by_name.end()) {
        const std::string hint = closest_match(n, known);
        where.fail(
            fmt::format("no layer is named \"{}\"{}", n, hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
      }
      if (it->second == static_cast<int>(i)) where.fail(fmt::format("layer \"{}\" takes its own output", n));
      p.inputs.push_back(it->second);
    }
    const auto count = static_cast<int>(p.inputs.size());
    if (count < p.spec->min_inputs || (p.spec->max_inputs > 0 && count > p.spec->max_inputs))
      where.fail(fmt::format("{} takes {} input{}, got {}", p.type,
                             p.spec->max_inputs == 0 ? fmt::format("{} or more", p.spec->min_inputs)
                                                     : std::to_string(p.spec->max_inputs),
                             p.spec->max_inputs == 1 ? "" : "s", count));
  }
}

// Names the cycle among the layers Kahn's algorithm could not order (waiting[i] > 0), as a config error.
[[noreturn]] void fail_cycle(const std::vector<Pending>& pending, const std::vector<int>& waiting) {
  // Walk back along unfinished inputs from the first stuck layer until a layer repeats: that is the cycle.
  int at = 0;
  while (waiting[static_cast<size_t>(at)] == 0) ++at;
  std::vector<int> path;
  while (std::find(path.begin(), path.end(), at) == path.end()) {
    path.push_back(at);
    for (int j : pending[static_cast<size_t>(at)].inputs)
      if (j >= 0 && waiting[static_cast<size_t>(j)] > 0) {
        at = j;
        break;
      }
  }
  std::string cycle = pending[static_cast<size_t>(at)].name;
  for (auto it = std::find(path.begin(), path.end(), at) + 1; it != path.end(); ++it)
    cycle = pending[static_cast<size_t>(*it)].name + " → " + cycle;
  pending[static_cast<size_t>(at)].cfg.fail("the layers form a cycle: " + pending[static_cast<size_t>(at)].name +
                                            " → " + cycle);
}

// 2b. A relu whose only reader is a max pool runs after the pool instead: max(relu(x)) = relu(max(x)) (relu is
//     monotone; relu keeps NaN and the pool passes it on, so a NaN gives NaN either way), and the gradients are the
//     same bit for bit (the pool routes each output's gradient to the window's first maximum, which is the first
//     maximum of relu(x) wherever the maximum is positive; where it is not, the relu zeroes the gradient either
//     way). On a 2×2 pool the relu then touches a quarter of the values, forward and backward. Not where the
//     relu's output has another reader or the pool is the model output. The nodes keep the config's wiring for
//     resolved_layers (GraphNode::listed_inputs).
void relu_after_max_pool(std::vector<Pending>& pending) {
  std::vector<int> readers(pending.size(), 0);
  for (const Pending& p : pending)
    for (int j : p.inputs)
      if (j >= 0) ++readers[static_cast<size_t>(j)];
  for (size_t p = 0; p + 1 < pending.size(); ++p) {  // the last layer is the model output
    Pending& pool = pending[p];
    if (pool.type != "maxpool2d" || pool.inputs.size() != 1 || pool.inputs[0] < 0) continue;
    const auto r = static_cast<size_t>(pool.inputs[0]);
    Pending& relu = pending[r];
    if (relu.type != "relu" || relu.inputs.size() != 1 || readers[r] != 1) continue;
    // x → relu → pool → users becomes x → pool → relu → users.
    for (Pending& user : pending)
      for (int& j : user.inputs)
        if (j == static_cast<int>(p)) j = static_cast<int>(r);
    pool.inputs[0] = relu.inputs[0];
    relu.inputs[0] = static_cast<int>(p);
    readers[r] = readers[p];  // the relu now has the pool's readers, the pool the relu alone
    readers[p] = 1;
  }
}

// 3. The execution order (Kahn's algorithm, taking the earliest listed ready layer first) and each layer's users;
//    what cannot be ordered is a cycle.
std::vector<int> execution_order(const std::vector<Pending>& pending, std::vector<std::vector<int>>& users) {
  std::vector<int> order, waiting(pending.size(), 0);
  users.assign(pending.size(), {});
  for (size_t i = 0; i < pending.size(); ++i)
    for (int j : pending[i].inputs)
      if (j >= 0) ++waiting[i], users[static_cast<size_t>(j)].push_back(static_cast<int>(i));
  std::set<int> ready;
  for (size_t i = 0; i < pending.size(); ++i)
    if (waiting[i] == 0) ready.insert(static_cast<int>(i));
  while (!ready.empty()) {
    const int i = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(i);
    for (int u : users[static_cast<size_t>(i)])
      if (--waiting[static_cast<size_t>(u)] == 0) ready.insert(u);
  }
  if (order.size() != pending.size()) fail_cycle(pending, waiting);
  return order;
}

// 4. `tied_to:` names the layer whose weight this one uses (Model::build checks its order and shape).
void resolve_ties(std::vector<Pending>& pending, const std::map<std::string, int>& by_name) {
  for (Pending& p : pending) {
    if (!p.cfg.is_map() || !p.cfg.has("tied_to")) continue;
    const ConfigNode at = p.cfg["tied_to"];
    const std::string target = at.as_string();
    auto it = by_name.end();
    for (size_t s = 0; s < p.scopes.size() && it == by_name.end(); ++s) it = by_name.find(p.scopes[s] + target);
    if (it == by_name.end()) at.fail(fmt::format("no layer is named \"{}\"", target));
    p.tied_to = it->second;
  }
}

}  // namespace

const SectionSpec& model_section() {
  static const SectionSpec s = plain_section({layer_list_key(
      "a bare type name for a layer without arguments (relu), a map with type: and its arguments, or a repeat: "
      "block")});
  return s;
}

std::string layer_json_schema() {
  // The three forms a list item takes: a bare type (of a layer with no required argument), a repeat block, or a
  // map with `type:` whose other keys are that type's arguments (one if/then per type).
  SectionSpec typed;
  typed.discriminator = "type";
  typed.doc = "a layer: type and its arguments";
  std::vector<std::string> bare;
  for (const LayerSpec& s : layer_registry()) {
    std::vector<KeySpec> keys = layer_common_keys();
    for (const LayerArg& a : s.args) keys.push_back(layer_arg_key(a));
    typed.variants.push_back({{s.type}, keys});
    if (std::none_of(s.args.begin(), s.args.end(), [](const LayerArg& a) { return a.required; }))
      bare.push_back(s.type);
  }
  const KeySpec item{.name = "layer",
                     .kind = KeyKind::any_of,
                     .items = {{.name = "type",
                                .kind = KeyKind::choice,
                                .choices = bare,
                                .doc = "a layer without arguments, by its type alone"},
                               {.name = "block", .kind = KeyKind::map, .section = &repeat_block_section()},
                               {.name = "layer", .kind = KeyKind::map, .section = &typed}}};
  return key_json_schema(item);
}

ModelSpec parse_model_spec(const ConfigNode& model_cfg) {
  expect_keys(model_cfg, section_keys(model_section()));
  model_cfg.require("layers");
  const ConfigNode layers = model_cfg["layers"];
  if (!layers.is_sequence() || layers.size() == 0) layers.fail("expected a non-empty list of layers");
  std::map<std::string, int> by_name;
  std::vector<Pending> pending = read_layers(layers, by_name);
  resolve_inputs(pending, by_name);
  std::vector<std::vector<int>> listed_inputs;
  for (const Pending& p : pending) listed_inputs.push_back(p.inputs);
  relu_after_max_pool(pending);
  ModelSpec spec;
  spec.where = layers;
  spec.order = execution_order(pending, spec.users);
  resolve_ties(pending, by_name);
  for (size_t i = 0; i < pending.size(); ++i) {
    Pending& p = pending[i];
    spec.layers.push_back({std::move(p.cfg), std::move(p.type), std::move(p.name), p.spec, std::move(p.inputs),
                           std::move(listed_inputs[i]), p.block, p.tied_to});
  }
  return spec;
}

}  // namespace gt

namespace gt {

std::optional<LoraPlan> parse_lora_plan(const ConfigNode& n) {
  if (!n.defined()) return std::nullopt;
  if (!n.is_map())
    n.fail("expected a map {targets: [patterns], rank: r, alpha: a, dropout: p, also_train: [patterns]}");
  n.expect_keys({"targets", "rank", "alpha", "dropout", "also_train"});
  n.require("targets");
  LoraPlan p;
  p.at = n;
  auto patterns = [](const ConfigNode& list, std::vector<std::string>& out) {
    if (!list.is_sequence()) list.fail("expected a list of name patterns");
    for (size_t i = 0; i < list.size(); ++i) {
      out.push_back(list.at(i).as_string());
      if (out.back().empty()) list.at(i).fail("expected a pattern, got an empty string");
    }
  };
  patterns(n["targets"], p.targets);
  if (p.targets.empty()) n["targets"].fail("expected at least one pattern (the weights whose products get adapters)");
  if (n.has("also_train")) patterns(n["also_train"], p.also_train);
  p.cfg = read_lora_settings(n, 8);  // as a layer's `lora:` reads them; rank 8 by default, PEFT's
  return p;
}

YAML::Node to_yaml(const LoraPlan& p) {
  YAML::Node targets(YAML::NodeType::Sequence), also(YAML::NodeType::Sequence);
  for (const std::string& t : p.targets) targets.push_back(t);
  for (const std::string& t : p.also_train) also.push_back(t);
  YAML::Node n(YAML::NodeType::Map);
  n["targets"] = targets;
  for (const auto& kv : lora_yaml(p.cfg)) n[kv.first.as<std::string>()] = kv.second;
  n["also_train"] = also;
  return n;
}

}  // namespace gt
