// Loading a new run's weights from train.init_from: the source's names renamed, matched to the model's, then copied.
#include "train/init_from.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/json_read.h"
#include "core/quote.h"
#include "graph/model.h"
#include "io/llmc.h"
#include "io/safetensors.h"
#include "layers/lora.h"
#include "train/resume.h"

#include <fmt/format.h>
#include <fnmatch.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

namespace gt {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("cannot read {}", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The file's FNV-1a, read a chunk at a time (the weights are not held twice), and whether it starts with llm.c's
// magic number (a safetensors file starts with its header's length).
struct FileFacts {
  uint32_t fnv1a = 0;
  bool llmc = false;
};

FileFacts file_facts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("cannot read {}", path));
  FileFacts f{.fnv1a = fnv1a({})};
  std::string chunk(size_t{1} << 20, '\0');
  for (bool first = true; in.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || in.gcount() > 0;
       first = false) {
    const std::string_view got(chunk.data(), static_cast<size_t>(in.gcount()));
    int32_t magic = 0;
    if (first && got.size() >= sizeof magic) {
      std::memcpy(&magic, got.data(), sizeof magic);
      f.llmc = magic == kLlmcMagic;
    }
    f.fnv1a = fnv1a(got, f.fnv1a);
  }
  if (in.bad()) throw DataError(fmt::format("cannot read {}", path));
  return f;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string renamed(const std::string& name, const std::vector<std::pair<std::string, std::string>>& map) {
  for (const auto& [from, to] : map)
    if (name.rfind(from, 0) == 0) return to + name.substr(from.size());
  return name;
}

// The model's tensors by name, and each tied layer's weight name as another name of its owner's weight.
struct Targets {
  std::map<std::string, Tensor*> by_name;
  std::map<std::string, std::string> owner_of;              ///< tied name → the owner's weight name
  std::map<std::string, std::vector<std::string>> aliases;  ///< the owner's weight name → its tied names
};

Targets model_targets(Model& model) {
  Targets t;
  for (auto& [name, tensor] : model.state_tensors()) t.by_name[name] = tensor;
  for (const GraphNode& n : model.nodes()) {
    if (n.tied_to < 0) continue;
    const std::string owner = model.nodes()[static_cast<size_t>(n.tied_to)].name + ".weight";
    t.owner_of[n.name + ".weight"] = owner;
    t.aliases[owner].push_back(n.name + ".weight");
  }
  return t;
}

bool skipped(const std::string& name, const Targets& t, const std::vector<std::string>& patterns) {
  std::vector<std::string> names{name};
  if (auto it = t.aliases.find(name); it != t.aliases.end())
    names.insert(names.end(), it->second.begin(), it->second.end());
  for (const std::string& p : patterns)
    for (const std::string& n : names)
      if (fnmatch(p.c_str(), n.c_str(), 0) == 0) return true;
  return false;
}

std::vector<std::string> tensor_names(Model& model) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : model.state_tensors()) out.push_back(name);
  return out;
}

}  // namespace

std::string init_weights_file(const Experiment& exp) {
  const std::string& path = exp.train.init_from;
  std::error_code ec;
  if (!fs::exists(path, ec)) exp.at.init_from.fail(fmt::format("{}: no such file or folder", quote_if_needed(path)));
  return weights_file(path, CheckpointConfig{}, "train.init_from");
}

InitWeights load_init_weights(const Experiment& exp, const std::string& file, Model& model) {
  const TrainConfig& c = exp.train;
  const FileFacts facts = file_facts(file);
  InitWeights out{.file = fs::absolute(file).string(), .fnv1a = fmt::format("{:08x}", facts.fnv1a)};
  const std::vector<std::pair<std::string, Tensor>> source =
      facts.llmc ? llmc_to_named(read_llmc(file)) : read_safetensors(file);
  const Targets targets = model_targets(model);
  // Each model tensor's source: under its own name, or (a tied weight) under a tied layer's.
  std::map<std::string, const Tensor*> chosen;
  for (const auto& [original, tensor] : source) {
    const std::string name = renamed(original, c.init_map);
    auto owner = targets.owner_of.find(name);
    const std::string target = owner == targets.owner_of.end() ? name : owner->second;
    if (!targets.by_name.count(target)) {
      out.unexpected.push_back(name);
      continue;
    }
    if (target == name || !chosen.count(target)) chosen[target] = &tensor;  // the owner's own name wins
  }
  for (const std::string& p : c.init_skip) {  // a pattern that matches nothing would load the head it meant to skip
    bool any = false;
    for (const auto& [name, tensor] : targets.by_name) any = any || skipped(name, targets, {p});
    if (!any)
      exp.at.init_from.fail(fmt::format("init_skip: {} matches none of the model's tensors ({})", quote_if_needed(p),
                                        joined(tensor_names(model))));
  }
  for (auto& [name, tensor] : model.state_tensors()) {
    if (skipped(name, targets, c.init_skip)) {
      out.skipped.push_back(name);
      continue;
    }
    auto it = chosen.find(name);
    if (it == chosen.end() && is_lora_tensor(name)) {  // an adapter the source has not: new, as LoRA starts them
      ++out.fresh_adapters;
      continue;
    }
    if (it == chosen.end()) {
      out.missing.push_back(name);
      continue;
    }
    const Tensor& from = *it->second;
    if (from.shape() != tensor->shape() || from.dtype() != tensor->dtype())
      exp.at.init_from.fail(
          fmt::format("{}: tensor {} is {} {} in {}, {} {} in the model (init_skip keeps a "
                      "changed layer's fresh initialisation)",
                      c.init_from, name, dtype_name(from.dtype()), from.shape().str(), file,
                      dtype_name(tensor->dtype()), tensor->shape().str()));
  }
  if (c.init_strict && (!out.missing.empty() || !out.unexpected.empty()))
    exp.at.init_from.fail(fmt::format(
        "{} does not match the model{}{} (init_map renames the file's names, init_skip keeps model tensors fresh, "
        "init_strict: false loads the rest)",
        file, out.missing.empty() ? "" : "; missing from the file: " + joined(out.missing),
        out.unexpected.empty() ? "" : "; not in the model: " + joined(out.unexpected)));
  for (auto& [name, tensor] : model.state_tensors()) {
    auto it = chosen.find(name);
    if (it == chosen.end() || skipped(name, targets, c.init_skip)) continue;
    tensor->copy_from(*it->second);
    ++out.loaded;
  }
  return out;
}

void log_init_weights(const InitWeights& init) {
  if (init.file.empty()) return;
  spdlog::info("init_from {} (fnv1a {}): {} tensors loaded; optimizer, schedule and step count start afresh", init.file,
               init.fnv1a, init.loaded);
  if (!init.skipped.empty()) spdlog::info("init_from: fresh (init_skip): {}", joined(init.skipped));
  if (init.fresh_adapters > 0)
    spdlog::info(
        "init_from: {} LoRA adapter tensors start fresh (A drawn, B zero: the loaded model's output as it was)",
        init.fresh_adapters);
  if (!init.missing.empty()) spdlog::warn("init_from: missing from the file, fresh: {}", joined(init.missing));
  if (!init.unexpected.empty()) spdlog::warn("init_from: in the file, not in the model: {}", joined(init.unexpected));
}

void record_init_weights(const std::string& run_dir, const InitWeights& init, RunSummary& sum) {
  const std::string path = (fs::path(run_dir) / "init_from.json").string();
  if (!init.file.empty()) {
    sum.init_from = init.file;
    sum.init_fnv1a = init.fnv1a;
    write_file_atomic(path, JsonObject().add("init_from", init.file).add("init_fnv1a", init.fnv1a).str() + "\n");
    return;
  }
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  const JsonValue v = json_read_object(read_bytes(path));
  const JsonValue *from = v.find("init_from"), *hash = v.find("init_fnv1a");
  if (!from || !from->is_string() || !hash || !hash->is_string())
    throw DataError(fmt::format("{}: expected the strings init_from and init_fnv1a", path));
  sum.init_from = from->string;
  sum.init_fnv1a = hash->string;
}

}  // namespace gt
