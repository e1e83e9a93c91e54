// Building the layer graph from config, and running it forward and backward over preallocated buffers.
#include "graph/model.h"

#include <algorithm>

namespace gt {

namespace {

std::vector<std::string> registry_types() {
  std::vector<std::string> v;
  for (const auto& s : layer_registry()) v.push_back(s.type);
  return v;
}

}  // namespace

Model Model::build(const ConfigNode& model_cfg, const Shape& input_shape, DType dtype, Device device, uint64_t seed) {
  model_cfg.expect_keys({"layers"});
  model_cfg.require("layers");
  const ConfigNode layers = model_cfg["layers"];
  if (!layers.is_sequence() || layers.size() == 0) layers.fail("expected a non-empty list of layers");

  Model m;
  m.m_input_shape = input_shape;
  m.m_dtype = dtype;
  m.m_device = device;
  // Initialisation draws from its own stream, so changing data or shuffling never changes the initial weights.
  Rng init_rng(seed, /*stream=*/0x1A17);

  for (size_t i = 0; i < layers.size(); ++i) {
    const ConfigNode cfg = layers.at(i);
    std::string type;
    if (cfg.is_scalar()) {
      type = cfg.as_string();
    } else if (cfg.is_map()) {
      cfg.require("type");
      type = cfg["type"].as_string();
    } else {
      cfg.fail("expected a layer type name or a map with `type:`");
    }
    const LayerSpec* spec = find_layer(type);
    if (!spec) {
      const ConfigNode at = cfg.is_map() ? cfg["type"] : cfg;
      const std::string hint = closest_match(type, registry_types());
      std::string all;
      for (const auto& t : registry_types()) all += (all.empty() ? "" : ", ") + t;
      at.fail(fmt::format("unknown layer type \"{}\"{}; known types: {}", type,
                          hint.empty() ? "" : " (did you mean \"" + hint + "\"?)", all));
    }
    std::vector<std::string> allowed{"type"};
    for (const auto& a : spec->args) allowed.push_back(a.name);
    if (cfg.is_map()) {
      cfg.expect_keys(allowed);
    } else {
      for (const auto& a : spec->args)
        if (a.required)
          cfg.fail(fmt::format("layer {} needs `{}`; write {{type: {}, {}: …}}", type, a.name, type, a.name));
    }

    GraphNode node;
    node.name = fmt::format("layers.{}", i);
    node.type = type;
    node.layer = spec->make(cfg);
    node.inputs = {static_cast<int>(i) - 1};
    std::vector<Shape> in_shapes;
    for (int j : node.inputs) in_shapes.push_back(j < 0 ? input_shape : m.m_nodes[static_cast<size_t>(j)].out_shape);
    node.out_shape = node.layer->infer_shape(in_shapes, cfg);
    node.layer->init_params(init_rng, dtype, device);
    for (Param* p : node.layer->params()) node.param_count += p->value.numel();
    node.needs_grad = node.param_count > 0;
    for (int j : node.inputs)
      if (j >= 0 && m.m_nodes[static_cast<size_t>(j)].needs_grad) node.needs_grad = true;
    m.m_nodes.push_back(std::move(node));
  }
  return m;
}

void Model::allocate(int64_t max_batch) {
  m_max_batch = max_batch;
  m_out_buf.assign(m_nodes.size(), Tensor());
  m_grad_buf.assign(m_nodes.size(), Tensor());
  m_out.assign(m_nodes.size(), Tensor());
  m_grad.assign(m_nodes.size(), Tensor());
  for (size_t i = 0; i < m_nodes.size(); ++i) {
    const GraphNode& n = m_nodes[i];
    if (n.layer->is_view()) continue;  // bound to its input at run time
    m_out_buf[i] = Tensor::empty(n.out_shape.batched(max_batch), m_dtype, m_device);
    // The last node's gradient comes from the loss; the others need a buffer only when something before learns.
    if (n.needs_grad && i + 1 < m_nodes.size())
      m_grad_buf[i] = Tensor::empty(n.out_shape.batched(max_batch), m_dtype, m_device);
  }
}

const Tensor& Model::forward(const Tensor& x, const LayerContext& ctx) {
  const int64_t batch = x.dim(0);
  GT_CHECK(batch <= m_max_batch, "batch {} exceeds the allocated {}", batch, m_max_batch);
  GT_CHECK(x.shape().sample() == m_input_shape, "model input {} for per-sample shape {}", x.shape().str(),
           m_input_shape.str());
  m_input = x;
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < m_nodes.size(); ++i) {
    GraphNode& n = m_nodes[i];
    ins.clear();
    for (int j : n.inputs) ins.push_back(j < 0 ? &m_input : &m_out[static_cast<size_t>(j)]);
    if (n.layer->is_view()) {
      m_out[i] = ins[0]->view(n.out_shape.batched(batch));
      continue;
    }
    m_out[i] = m_out_buf[i].narrow0(batch);
    n.layer->forward(ins, m_out[i], ctx);
  }
  return m_out.back();
}

void Model::backward(const Tensor& dout, const LayerContext& ctx) {
  const size_t last = m_nodes.size() - 1;
  const int64_t batch = dout.dim(0);
  GT_CHECK(batch == m_out[last].dim(0) && dout.numel() == m_out[last].numel(), "dout {} for output {}",
           dout.shape().str(), m_out[last].shape().str());
  // Bind this batch's gradient views; a view layer's gradient is its input's gradient under its own shape.
  for (size_t i = 0; i < last; ++i) {
    const GraphNode& n = m_nodes[i];
    if (n.layer->is_view()) {
      const int j = n.inputs[0];
      m_grad[i] = j >= 0 && m_grad[static_cast<size_t>(j)].defined()
                      ? m_grad[static_cast<size_t>(j)].view(n.out_shape.batched(batch))
                      : Tensor();
    } else {
      m_grad[i] = m_grad_buf[i].defined() ? m_grad_buf[i].narrow0(batch) : Tensor();
    }
  }
  m_grad[last] = dout;
  if (m_nodes[last].layer->is_view()) {
    const int j = m_nodes[last].inputs[0];
    if (j >= 0 && m_grad[static_cast<size_t>(j)].defined()) m_grad[static_cast<size_t>(j)].copy_from(dout.view(m_grad[static_cast<size_t>(j)].shape()));
  }

  std::vector<const Tensor*> ins;
  std::vector<Tensor*> dins;
  for (size_t i = last + 1; i-- > 0;) {
    GraphNode& n = m_nodes[i];
    if (n.layer->is_view() || !n.needs_grad) continue;
    ins.clear();
    dins.clear();
    for (int j : n.inputs) {
      ins.push_back(j < 0 ? &m_input : &m_out[static_cast<size_t>(j)]);
      Tensor* g = j >= 0 && m_grad[static_cast<size_t>(j)].defined() ? &m_grad[static_cast<size_t>(j)] : nullptr;
      dins.push_back(g);
    }
    n.layer->backward(ins, m_out[i], m_grad[i], dins, ctx);
  }
}

std::vector<Param*> Model::params() {
  std::vector<Param*> out;
  for (auto& n : m_nodes)
    for (Param* p : n.layer->params()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Param*>> Model::named_params() {
  std::vector<std::pair<std::string, Param*>> out;
  for (auto& n : m_nodes)
    for (Param* p : n.layer->params()) out.emplace_back(n.name + "." + p->name, p);
  return out;
}

int64_t Model::param_count() const {
  int64_t total = 0;
  for (const auto& n : m_nodes) total += n.param_count;
  return total;
}

int64_t Model::forward_flops() const {
  int64_t total = 0;
  for (const auto& n : m_nodes) total += n.layer->forward_flops();
  return total;
}

YAML::Node Model::resolved_layers() const {
  YAML::Node list(YAML::NodeType::Sequence);
  for (const auto& n : m_nodes) {
    YAML::Node args = n.layer->resolved_args();
    if (args.size() == 0) {
      list.push_back(n.type);
      continue;
    }
    YAML::Node item(YAML::NodeType::Map);
    item["type"] = n.type;
    for (const auto& kv : args) item[kv.first] = kv.second;
    item.SetStyle(YAML::EmitterStyle::Flow);
    list.push_back(item);
  }
  return list;
}

std::string Model::summary_table(int64_t batch) const {
  std::string out = fmt::format("{:<12} {:<10} {:<18} {:>12}\n", "layer", "type", "output shape", "parameters");
  out += fmt::format("{:<12} {:<10} {:<18} {:>12}\n", "input", "", m_input_shape.batched(batch).str(), "");
  for (const auto& n : m_nodes)
    out += fmt::format("{:<12} {:<10} {:<18} {:>12}\n", n.name, n.type, n.out_shape.batched(batch).str(),
                       n.param_count);
  const double mflops = static_cast<double>(forward_flops()) * 1e-6;
  out += fmt::format("total: {} layers, {} parameters ({:.2f} MB as f32), {:.3f} MFLOP forward per sample\n",
                     m_nodes.size(), param_count(), static_cast<double>(param_count()) * 4e-6, mflops);
  return out;
}

}  // namespace gt
