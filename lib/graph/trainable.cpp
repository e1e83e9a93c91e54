// Which parameters learn: train.freeze, and train.lora's adapters. A frozen parameter keeps its values and has no
// gradient; the parameter lists the optimizer and the gradient synchronisation take hold only the others.
#include "graph/model.h"
#include "layers/lora.h"

#include <fmt/format.h>

#include <fnmatch.h>

namespace gt {
namespace {

bool matches_any(const std::vector<std::string>& patterns, const std::string& name) {
  for (const std::string& p : patterns)
    if (fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  return false;
}

}  // namespace

void Model::add_lora(const LoraPlan& plan) {
  std::vector<int64_t> hits(plan.targets.size(), 0);
  for (GraphNode& n : m_nodes)
    for (const std::string& target : n.layer->lora_targets()) {
      const std::string name = n.name + "." + target;
      bool hit = false;
      for (size_t p = 0; p < plan.targets.size(); ++p)
        if (fnmatch(plan.targets[p].c_str(), name.c_str(), 0) == 0) {
          ++hits[p];
          hit = true;
        }
      if (hit) n.layer->add_lora(target, plan.cfg);
    }
  std::string example;
  for (const GraphNode& n : m_nodes)
    if (example.empty() && !n.layer->lora_targets().empty()) example = n.name + "." + n.layer->lora_targets()[0];
  for (size_t p = 0; p < plan.targets.size(); ++p)
    if (hits[p] == 0)
      plan.at["targets"].at(p).fail(
          example.empty()
              ? "the model has no product LoRA can adapt (dense layers and attention's projections)"
              : fmt::format("{} matches no weight LoRA can adapt (those of dense layers and attention's qkv and "
                            "proj, named like {})",
                            plan.targets[p], example));
}

void Model::merge_lora() {
  for (GraphNode& n : m_nodes) {
    n.layer->merge_lora();
    n.param_count = n.layer->param_numel();
    n.trainable = n.param_count;
    n.frozen.clear();
  }
  update_grad_flow();
}

bool Model::has_lora() const {
  for (const GraphNode& n : m_nodes)
    for (const auto& [name, shape] : n.layer->param_shapes())
      if (is_lora_tensor(name)) return true;
  return false;
}

bool Model::weight_frozen(const GraphNode& n) {
  if (n.frozen.empty()) return false;
  const auto shapes = n.layer->param_shapes();
  for (size_t k = 0; k < shapes.size() && k < n.frozen.size(); ++k)
    if (shapes[k].first == "weight") return n.frozen[k];
  return false;
}

std::vector<int64_t> Model::set_frozen(const std::vector<std::string>& patterns,
                                       const std::vector<std::string>& except) {
  // The other names of each shared weight: the layers tied to it.
  std::vector<std::vector<std::string>> aliases(m_nodes.size());
  for (const GraphNode& n : m_nodes)
    if (n.tied_to >= 0) aliases[static_cast<size_t>(n.tied_to)].push_back(n.name + ".weight");
  std::vector<int64_t> hits(patterns.size(), 0);
  for (size_t i = 0; i < m_nodes.size(); ++i) {
    GraphNode& n = m_nodes[i];
    const auto shapes = n.layer->param_shapes();
    const std::vector<Param*> made = m_initialised ? n.layer->params() : std::vector<Param*>();
    n.frozen.assign(shapes.size(), false);
    n.trainable = 0;
    for (size_t k = 0; k < shapes.size(); ++k) {
      std::vector<std::string> names{n.name + "." + shapes[k].first};
      if (shapes[k].first == "weight") names.insert(names.end(), aliases[i].begin(), aliases[i].end());
      bool frozen = false, spared = false;
      for (const std::string& name : names) spared = spared || matches_any(except, name);
      for (size_t p = 0; p < patterns.size() && !spared; ++p) {
        bool hit = false;
        for (const std::string& name : names) hit = hit || fnmatch(patterns[p].c_str(), name.c_str(), 0) == 0;
        if (hit) ++hits[p];
        frozen = frozen || hit;
      }
      n.frozen[k] = frozen;
      if (!frozen) n.trainable += shapes[k].second.numel();
      if (k < made.size()) {
        Param& param = *made[k];
        // A frozen parameter's gradient is freed; one that learns again gets a zeroed one.
        if (frozen && param.grad.defined()) param.grad = Tensor();
        if (!frozen && !param.grad.defined())
          param.grad = Tensor::zeros(param.value.shape(), param.value.dtype(), param.value.device());
        param.frozen = frozen;
      }
    }
  }
  update_grad_flow();
  return hits;
}

std::vector<std::pair<std::string, int64_t>> Model::trainable_sizes() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const GraphNode& n : m_nodes) {
    const auto shapes = n.layer->param_shapes();
    for (size_t k = 0; k < shapes.size(); ++k)
      if (n.frozen.empty() || !n.frozen[k]) out.emplace_back(n.name + "." + shapes[k].first, shapes[k].second.numel());
  }
  return out;
}

int64_t Model::trainable_count() const {
  int64_t total = 0;
  for (const GraphNode& n : m_nodes) total += n.trainable;
  return total;
}

std::vector<Param*> Model::params() {
  std::vector<Param*> out;
  for (auto& n : m_nodes)
    for (Param* p : n.layer->params())
      if (p->trains()) out.push_back(p);
  return out;
}

std::vector<std::vector<Param*>> Model::params_by_node() {
  std::vector<std::vector<Param*>> out;
  for (auto& n : m_nodes) {
    out.emplace_back();
    for (Param* p : n.layer->params())
      if (p->trains()) out.back().push_back(p);
  }
  return out;
}

std::vector<std::vector<Param*>> Model::all_params_by_node() {
  std::vector<std::vector<Param*>> out;
  for (auto& n : m_nodes) out.push_back(n.layer->params());
  return out;
}

std::vector<std::pair<std::string, Param*>> Model::named_params() {
  std::vector<std::pair<std::string, Param*>> out;
  for (auto& n : m_nodes)
    for (Param* p : n.layer->params())
      if (p->trains()) out.emplace_back(n.name + "." + p->name, p);
  return out;
}

}  // namespace gt
