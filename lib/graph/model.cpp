// Building the layer graph from a ModelSpec, and running it forward and backward over preallocated buffers.
#include "graph/model.h"

#include "core/backend.h"

#include <algorithm>
#include <optional>

#include "ops/elementwise.h"
#include "ops/half_storage.h"
#include "ops/precision.h"
#include "ops/wide.h"

namespace gt {

namespace {

// `tied_to:` (resolved by parse_model_spec): the owner must run first (so the tied layer's backward writes the shared
// gradient and the owner's adds to it) and offer a weight of the shape the tied layer needs.
void tie_weights(const ModelSpec& spec, const std::vector<int>& position, std::vector<GraphNode>& nodes) {
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const ModelLayer& p = spec.layers[i];
    if (p.tied_to < 0) continue;
    const ConfigNode at = p.cfg["tied_to"];
    const std::string target = at.as_string();
    GraphNode& node = nodes[static_cast<size_t>(position[i])];
    GraphNode& owner = nodes[static_cast<size_t>(position[static_cast<size_t>(p.tied_to)])];
    const Shape need = node.layer->tied_weight_shape(), offered = owner.layer->shared_weight_shape();
    if (offered.rank() == 0)
      at.fail(fmt::format("\"{}\" is a {}, which has no weight to share (an embedding has)", target, owner.type));
    if (position[static_cast<size_t>(p.tied_to)] > position[i])
      at.fail(fmt::format("\"{}\" must run before \"{}\", which uses its weight", target, p.name));
    // The tied layer may use a prefix of the owner's rows (llm.c's padded vocabulary: logits over the first V rows).
    if (need.rank() != 2 || offered.rank() != 2 || need[1] != offered[1] || need[0] > offered[0])
      at.fail(fmt::format("\"{}\" has a weight of {}, but this layer needs {} (at most its {} rows)", target,
                          offered.str(), need.str(), offered.rank() ? offered[0] : 0));
    node.tied_to = position[static_cast<size_t>(p.tied_to)];
    owner.adds_param_grads = true;
  }
}

}  // namespace

Model Model::build(const ModelSpec& spec, const Shape& input_shape, DType dtype, Device device, uint64_t seed,
                   bool init_params) {
  GT_CHECK(!spec.layers.empty(), "Model::build of a model spec without layers (parse_model_spec makes one)");
  const std::vector<ModelLayer>& layers = spec.layers;
  const std::vector<int>& order = spec.order;
  const std::vector<std::vector<int>>& users = spec.users;
  // Build in execution order: shapes flow forward. Parameters are initialised in config-list order, so that a branch
  // added later never changes the initial weights of the layers listed before it.
  Model m;
  m.m_input_shape = input_shape;
  m.m_dtype = dtype;
  m.m_act = dtype;
  m.m_device = device;
  std::vector<int> position(layers.size());
  for (size_t k = 0; k < order.size(); ++k) position[static_cast<size_t>(order[k])] = static_cast<int>(k);
  const int output = static_cast<int>(layers.size()) - 1;
  for (int i : order) {
    const ModelLayer& p = layers[static_cast<size_t>(i)];
    GraphNode node;
    node.name = p.name;
    node.index = static_cast<size_t>(i);
    node.type = p.type;
    node.block = p.block;
    node.layer = p.spec->make(p.cfg);
    std::vector<Shape> in_shapes;
    for (int j : p.inputs) {
      node.inputs.push_back(j < 0 ? -1 : position[static_cast<size_t>(j)]);
      in_shapes.push_back(j < 0 ? input_shape : m.m_nodes[static_cast<size_t>(node.inputs.back())].out_shape);
    }
    for (int j : p.listed_inputs) node.listed_inputs.push_back(j < 0 ? -1 : position[static_cast<size_t>(j)]);
    // Sizes from the config are bounded one by one (core/limits.h); their products are checked here, so that a
    // layer too large to hold is a config error naming it, not a wrapped-around count later.
    try {
      node.out_shape = node.layer->infer_shape(in_shapes, p.cfg);
      const int64_t out_numel = node.out_shape.numel(), params = node.layer->param_numel();
      node.layer->forward_flops();  // throws SizeOverflow when the count does not fit
      if (out_numel > limits::kElements.max || params > limits::kElements.max)
        p.cfg.fail(fmt::format("{} of {} elements is more than {} ({})",
                               params > limits::kElements.max ? "a weight" : "an output " + node.out_shape.str(),
                               std::max(out_numel, params), limits::kElements.max, limits::kElements.what));
    } catch (const SizeOverflow& e) {
      p.cfg.fail(fmt::format("the layer's sizes do not fit in 64 bits ({})", e.what()));
    }
    if (i != output && users[static_cast<size_t>(i)].empty())
      p.cfg.fail(
          fmt::format("the output of \"{}\" is never used (only the last layer listed is the model output)", p.name));
    m.m_nodes.push_back(std::move(node));
  }
  if (position[static_cast<size_t>(output)] != static_cast<int>(m.m_nodes.size()) - 1)
    layers[static_cast<size_t>(output)].cfg.fail(
        "the last layer listed is the model output, so no layer may take it as input");
  tie_weights(spec, position, m.m_nodes);
  Rng init_rng(seed, /*stream=*/0x1A17);  // its own stream: data and shuffling never change the initial weights
  std::vector<GraphNode*> by_index(layers.size());
  for (auto& n : m.m_nodes) by_index[n.index] = &n;
  m.m_initialised = init_params;
  if (spec.lora) m.add_lora(*spec.lora);
  for (GraphNode* n : by_index) {
    n->param_count = n->layer->param_numel();
    if (!init_params) continue;
    const AllocLabel label("the parameters of " + n->name);
    n->layer->init_params(init_rng, dtype, device);
  }
  if (init_params) {  // the adapters from a stream of their own: the base weights are the plain model's
    Rng lora_rng(seed, /*stream=*/0x10AA);
    for (GraphNode* n : by_index) n->layer->init_lora(lora_rng, dtype, device);
  }
  for (GraphNode* n : by_index) {
    if (!init_params) continue;
    // The shapes-only list sizes models in `gputrain check` and names what train.freeze matches there: a layer whose
    // two lists disagree would mislead both.
    const auto shapes = n->layer->param_shapes();
    const std::vector<Param*> made = n->layer->params();
    GT_CHECK(made.size() == shapes.size(), "{} ({}): init_params made {} parameters, param_shapes() lists {}", n->name,
             n->type, made.size(), shapes.size());
    for (size_t k = 0; k < made.size(); ++k)
      GT_CHECK(made[k]->name == shapes[k].first && made[k]->value.shape() == shapes[k].second,
               "{} ({}): init_params made {} {}, param_shapes() says {} {}", n->name, n->type, made[k]->name,
               made[k]->value.shape().str(), shapes[k].first, shapes[k].second.str());
  }
  for (GraphNode& n : m.m_nodes) {
    if (n.tied_to < 0 || !init_params) continue;
    for (Param* p : m.m_nodes[static_cast<size_t>(n.tied_to)].layer->params())
      if (p->name == "weight") n.layer->tie_weight(*p);
  }
  for (GraphNode& n : m.m_nodes) n.trainable = n.param_count;
  m.update_grad_flow();
  m.apply_epilogues();
  return m;
}

void Model::update_grad_flow() {
  for (size_t k = 0; k < m_nodes.size(); ++k) {
    GraphNode& n = m_nodes[k];
    // A tied layer writes its owner's weight gradient, when that weight learns.
    const bool tied_learns = n.tied_to >= 0 && !weight_frozen(m_nodes[static_cast<size_t>(n.tied_to)]);
    n.needs_grad = n.trainable > 0 || tied_learns;
    for (int j : n.inputs)
      if (j >= 0 && m_nodes[static_cast<size_t>(j)].needs_grad) n.needs_grad = true;
    if (!n.layer->is_view())
      n.grad_owner = static_cast<int>(k);
    else
      n.grad_owner = n.inputs[0] >= 0 ? m_nodes[static_cast<size_t>(n.inputs[0])].grad_owner : -1;
  }
}

std::vector<int> Model::grad_writers() const {
  // Who writes each gradient buffer: every (consumer, input) pair whose input leads to it through views.
  std::vector<int> writers(m_nodes.size(), 0);
  for (const GraphNode& n : m_nodes) {
    if (n.layer->is_view() || !n.needs_grad) continue;
    for (int j : n.inputs)
      if (j >= 0 && m_nodes[static_cast<size_t>(j)].needs_grad && m_nodes[static_cast<size_t>(j)].grad_owner >= 0)
        ++writers[static_cast<size_t>(m_nodes[static_cast<size_t>(j)].grad_owner)];
  }
  return writers;
}

void Model::check_batch(int64_t batch, const ConfigNode& where) const {
  auto too_big = [&](const std::string& what, const Shape& sample) {
    const std::optional<int64_t> n = checked_mul(batch, sample.numel());
    if (!n || *n > limits::kElements.max)
      where.fail(fmt::format("a batch of {} samples makes {} of {} × {} elements, more than {} ({})", batch, what,
                             batch, sample.str(), limits::kElements.max, limits::kElements.what));
  };
  too_big("the input", m_input_shape);
  // Forward and backward together are at most three times the forward FLOPs of a layer; the footprint and the
  // profiler add them up over the layers.
  std::optional<int64_t> total = 0;
  for (const GraphNode& n : m_nodes) {
    too_big(fmt::format("the output of \"{}\"", n.name), n.out_shape);
    total = checked_add(total, checked_mul(checked_mul(n.layer->forward_flops(), batch), 3).value_or(-1));
    if (!total)
      where.fail(fmt::format("a batch of {} samples makes the FLOP count of the model overflow 64 bits (at \"{}\")",
                             batch, n.name));
  }
}

void Model::allocate(int64_t max_batch) {
  GT_CHECK(m_initialised, "allocate on a model built without parameters");
  const size_t count = m_nodes.size();
  apply_epilogues();  // (the setters did; before the scratch, whose size follows them)
  m_max_batch = max_batch;
  m_out_buf.assign(count, Tensor());
  m_grad_buf.assign(count, Tensor());
  m_scratch_buf.assign(count, Tensor());
  m_out.assign(count, Tensor());
  m_grad.assign(count, Tensor());
  const std::vector<NodeBuffers> plan = buffer_plan(max_batch);
  m_grad_writers = grad_writers();
  m_slot_buf.assign(m_slot_numel.size(), Tensor());
  m_resident = -1;
  m_half_plan = half_plan();
  // activation_storage(), from the plan just made.
  const bool any_half = std::any_of(m_half_plan.pool.begin(), m_half_plan.pool.end(), [](int b) { return b >= 0; });
  m_layer_storage = any_half ? m_half : std::nullopt;
  if (is_half(m_act)) m_layer_storage = half_format_of(m_act);
  m_layer_scratch = Tensor();
  if (const int64_t scratch = layer_scratch_numel(max_batch); scratch > 0) {
    const AllocLabel label(fmt::format("the layers' shared scratch (batch {})", max_batch));
    m_layer_scratch = Tensor::empty(Shape{scratch}, m_dtype, m_device);
  }
  m_pool_buf.assign(m_half_plan.pool_numel.size(), Tensor());
  m_pool_holds.assign(m_half_plan.pool_numel.size(), -1);
  m_half_buf.assign(count, nullptr);
  m_chains = chains();
  for (size_t i = 0; i < count; ++i) {
    const GraphNode& n = m_nodes[i];
    if (n.layer->is_view() || m_chains.unstored(i)) continue;
    const AllocLabel label(fmt::format("the activations of {} (batch {})", n.name, max_batch));
    const Shape shape = n.out_shape.batched(max_batch);
    const DType dtype = m_act;
    if (!m_slot.empty() && m_slot[i] >= 0) {
      // The shared buffer of its position: this node's rows are its first max_batch × out_shape elements, so that
      // narrow0(batch) takes a batch's rows as with a buffer of its own.
      Tensor& slot = m_slot_buf[static_cast<size_t>(m_slot[i])];
      if (!slot.defined()) slot = Tensor::empty(Shape{plan[i].output}, dtype, m_device);
      m_out_buf[i] = slot.narrow0(shape.numel()).view(shape);
    } else if (m_half_plan.pool[i] >= 0) {  // a working buffer for the forward pass, and the 16-bit copy kept
      Tensor& work = m_pool_buf[static_cast<size_t>(m_half_plan.pool[i])];
      if (!work.defined()) work = Tensor::empty(Shape{plan[i].output}, m_dtype, m_device);
      m_out_buf[i] = work.narrow0(shape.numel()).view(shape);
      m_half_buf[i] = allocate_storage(static_cast<size_t>(plan[i].half) * sizeof(uint16_t), m_device);
    } else {
      m_out_buf[i] = Tensor::empty(shape, dtype, m_device);
    }
    if (plan[i].gradient) m_grad_buf[i] = Tensor::empty(shape, dtype, m_device);
    if (plan[i].scratch) m_scratch_buf[i] = Tensor::empty(shape, dtype, m_device);
  }
}

void Model::set_sync(ops::SumOverRanks sum_over_ranks) {
  if (sum_over_ranks && !m_device.is_cpu())
    throw Error(
        fmt::format("dist.sync_batchnorm: synchronised batch norm on GPUs is not built; the model is on {} "
                    "(set it false, or train on the CPU)",
                    m_device.str()));
  m_sync = std::move(sum_over_ranks);
  apply_epilogues();
}

int64_t Model::layer_scratch_numel(int64_t batch) const {
  int64_t most = 0;
  for (const GraphNode& n : m_nodes)
    if (!n.layer->is_view()) most = std::max(most, n.layer->scratch_numel(batch));
  return most;
}

void Model::set_layer_context(LayerContext& ctx) {
  ctx.sum_over_ranks = m_sync ? &m_sync : nullptr;
  ctx.scratch = m_layer_scratch.defined() ? &m_layer_scratch : nullptr;
  ctx.half_storage = ctx.training && !ctx.decode ? m_layer_storage : std::nullopt;
}

const Tensor& Model::forward(const Tensor& x, const LayerContext& context) {
  LayerContext ctx = context;
  set_layer_context(ctx);
  const int64_t batch = x.dim(0);
  GT_CHECK(batch <= m_max_batch, "batch {} exceeds the allocated {}", batch, m_max_batch);
  GT_CHECK(x.shape().sample() == m_input_shape, "model input {} for per-sample shape {}", x.shape().str(),
           m_input_shape.str());
  m_input = x;
  const Tensor& out = run_nodes(ctx, m_profiler, [&](size_t i) { return m_out_buf[i].narrow0(batch); });
  // The shared buffers hold the last segment's outputs (at positions past a shorter last segment, an earlier
  // segment's: that one is recomputed all the same before its backward).
  m_resident = -1;
  for (const auto& [s, range] : m_segment_range)
    if (m_resident < 0 || range.first > m_segment_range.at(m_resident).first) m_resident = s;
  return out;
}

void Model::recompute_segment(int s, const LayerContext& ctx) {
  LayerContext again = ctx;
  again.recompute = true;
  const auto [first, last] = m_segment_range.at(s);
  const int64_t batch = m_input.dim(0);
  std::vector<const Tensor*> ins;
  for (size_t i = first; i <= last; ++i) {
    GraphNode& n = m_nodes[i];
    // Views still point at their source's rows; a kept output (read outside the segment) is still there.
    if (m_slot[i] < 0) continue;
    ins.clear();
    for (int j : n.inputs) ins.push_back(j < 0 ? &m_input : &m_out[static_cast<size_t>(j)]);
    m_out[i] = m_out_buf[i].narrow0(batch);
    use_params(i);
    SpanScope scope(m_profiler, n.name, n.type, "recompute", n.layer->forward_flops() * batch);
    n.layer->forward(ins, m_out[i], again);
  }
  m_resident = s;
}

const Tensor& Model::run_nodes(const LayerContext& ctx, SpanTimer* profiler,
                               const std::function<Tensor(size_t)>& output) {
  const int64_t batch = m_input.dim(0);
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < m_nodes.size(); ++i) {
    GraphNode& n = m_nodes[i];
    if (!m_chains.runs(i)) continue;  // its chain's head computed it
    ins.clear();
    for (int j : n.inputs) ins.push_back(j < 0 ? &m_input : &m_out[static_cast<size_t>(j)]);
    if (n.layer->is_view()) {
      m_out[i] = ins[0]->view(n.out_shape.batched(batch));
      continue;
    }
    const size_t out = m_chains.writes(i);
    if (m_chains.any() && m_chains.epilogue[i].add) {  // the residual add's other input, after the head's own
      const int r = m_chains.residual[i];
      ins.push_back(r < 0 ? &m_input : &m_out[static_cast<size_t>(r)]);
    }
    m_out[out] = output(out);
    use_params(i);
    {
      SpanScope scope(profiler, n.name, n.type, "forward", chain_flops(i) * batch);
      n.layer->forward(ins, m_out[out], ctx);
    }
    // Outputs no later forward reads go to 16 bits for the backward pass (an evaluation keeps nothing).
    if (m_half && ctx.training && !ctx.decode)
      for (int r : m_half_plan.pack_after[i]) {
        const Tensor& y = m_out[static_cast<size_t>(r)];
        ops::pack_activation(*m_half, y, m_half_buf[static_cast<size_t>(r)]->ptr);
      }
  }
  return m_out.back();
}

void Model::widen_for_backward(size_t i) {
  auto widen = [&](size_t r) {
    const int b = m_half_plan.pool[r];
    if (b < 0) return;
    // Still there from an earlier widening in this pass: nothing writes a working buffer during the backward pass
    // but this function (layers read their inputs and outputs; gradients have buffers of their own), and it records
    // which output each buffer holds.
    int& holds = m_pool_holds[static_cast<size_t>(b)];
    if (holds == static_cast<int>(r)) return;
    Tensor y = m_out[r];  // its working buffer's rows: the views of it read them too
    ops::unpack_activation(*m_half, m_half_buf[r]->ptr, y);
    m_widened += y.numel();
    holds = static_cast<int>(r);
  };
  const GraphNode& n = m_nodes[i];
  const Layer& layer = *n.layer;
  const bool all = m_widen_everything;
  m_half_inputs.assign(n.inputs.size(), ops::HalfMatrix{});
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    int r = n.inputs[k];
    while (r >= 0 && m_nodes[static_cast<size_t>(r)].layer->is_view()) r = m_nodes[static_cast<size_t>(r)].inputs[0];
    if (r < 0 || (!all && !layer.backward_reads_input(k))) continue;
    const auto src = static_cast<size_t>(r);
    // The layer reads the 16-bit copy itself (LayerContext::half_input; its rows and columns are the layer's to give).
    if (!all && m_half_plan.pool[src] >= 0 && layer.backward_takes_half_input(k) &&
        (m_device.is_cpu() || layer.takes_half_input_on_cuda())) {
      m_half_inputs[k].data = m_half_buf[src]->ptr;
      m_half_inputs[k].format = *m_half;
      continue;
    }
    widen(src);
  }
  if (all || layer.backward_reads_output()) widen(i);
}

bool Model::loss_writes_over_output() const {
  if (m_nodes.empty() || m_dtype != DType::f32) return false;
  const size_t last = m_nodes.size() - 1;
  const Layer& layer = *m_nodes[last].layer;
  const Chains c = chains();
  return !layer.is_view() && !layer.backward_reads_output() && (!c.any() || (c.head[last] < 0 && c.tail[last] < 0));
}

Tensor Model::output_buffer() const {
  return loss_writes_over_output() && !m_out_buf.empty() ? m_out_buf.back() : Tensor();
}

std::string Model::decode_unsupported() const {
  if (m_input_shape.rank() == 0) return "its input is a scalar per sample, not a sequence of positions";
  const int64_t len = m_input_shape[0];
  for (const GraphNode& n : m_nodes) {
    if (n.layer->is_view() || !n.layer->decodes())
      return fmt::format("layer \"{}\" ({}) does not compute position by position", n.name, n.type);
    if (n.out_shape.rank() == 0 || n.out_shape[0] != len)
      return fmt::format("layer \"{}\" ({}) turns the {} positions of the input into an output of {}", n.name, n.type,
                         len, n.out_shape.str());
  }
  return "";
}

namespace {

// The first t positions of a buffer of (batch, [T, …]) as (1, [t, …]).
Tensor first_positions(const Tensor& buffer, int64_t t) {
  std::vector<int64_t> d = buffer.shape().dims();
  d.erase(d.begin());
  const Tensor sample = buffer.narrow0(1).view(Shape(d));
  d[0] = t;
  d.insert(d.begin(), 1);
  return sample.narrow0(t).view(Shape(d));
}

}  // namespace

const Tensor& Model::forward_decode(const Tensor& x, int64_t position) {
  if (!m_decodes) {  // the nodes never change, so once is enough
    const std::string why = decode_unsupported();
    GT_CHECK(why.empty(), "forward_decode: {}", why);
    m_decodes = true;
  }
  GT_CHECK(m_max_batch >= 1, "forward_decode before allocate");
  const int64_t len = m_input_shape[0];
  GT_CHECK(x.rank() == m_input_shape.rank() + 1 && x.dim(0) == 1 && x.dim(1) >= 1 && position >= 0 &&
               position + x.dim(1) <= len && x.shape().sample().sample() == m_input_shape.sample(),
           "forward_decode: input {} at position {} for samples of {}", x.shape().str(), position, m_input_shape.str());
  LayerContext ctx;
  ctx.training = false;
  ctx.decode = true;
  ctx.position = position;
  m_input = x;
  m_resident = -1;
  // Not profiled: sampling is no part of a training step. decode_unsupported() leaves out view layers.
  return run_nodes(ctx, nullptr, [&](size_t i) { return first_positions(m_out_buf[i], x.dim(1)); });
}

void Model::backward(const Tensor& dout, const LayerContext& context) {
  LayerContext ctx = context;
  set_layer_context(ctx);
  const size_t last = m_nodes.size() - 1;
  const int64_t batch = dout.dim(0);
  GT_CHECK(batch == m_out[last].dim(0) && dout.numel() == m_out[last].numel(), "dout {} for output {}",
           dout.shape().str(), m_out[last].shape().str());
  for (size_t i = 0; i < last; ++i) m_grad[i] = m_grad_buf[i].defined() ? m_grad_buf[i].narrow0(batch) : Tensor();
  m_grad[last] = dout.view(m_out[last].shape());
  if (m_nodes[last].layer->is_view()) {  // a model ending in a view passes dout straight to its source
    const int owner = m_nodes[last].grad_owner;
    if (owner >= 0 && m_grad[static_cast<size_t>(owner)].defined())
      ops::convert(dout, m_grad[static_cast<size_t>(owner)]);  // (into 16 bits under set_activation_dtype)
  }

  // The forward pass since the last backward wrote the working buffers: none holds a widened output yet.
  std::fill(m_pool_holds.begin(), m_pool_holds.end(), -1);
  // The first consumer to run writes a gradient buffer; later ones write scratch, which is then added in.
  std::vector<int> written(m_nodes.size(), 0);
  std::vector<const Tensor*> ins;
  std::vector<Tensor> dx_views;
  std::vector<Tensor*> dins;
  std::vector<std::pair<int, size_t>> pending_adds;
  for (size_t i = last + 1; i-- > 0;) {
    GraphNode& n = m_nodes[i];
    if (n.layer->is_view() || !n.needs_grad || !m_chains.runs_backward(i)) continue;
    // A chain's head back-propagates from its tail's output. A residual add at the tail runs its own backward first,
    // for its other input: its head's output has no gradient buffer, so the loop below skips that input.
    const size_t out = m_chains.writes(i);
    // train.recompute: the first node of a segment to back-propagate brings its dropped outputs back.
    if (m_recompute != Recompute::none && m_segment[i] >= 0 && m_segment[i] != m_resident &&
        m_segment_range.count(m_segment[i]))
      recompute_segment(m_segment[i], ctx);
    if (m_half) widen_for_backward(i);
    ctx.half_inputs = m_half ? &m_half_inputs : nullptr;
    ins.clear();
    dx_views.assign(n.inputs.size(), Tensor());
    dins.assign(n.inputs.size(), nullptr);
    pending_adds.clear();
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int j = n.inputs[k];
      ins.push_back(j < 0 ? &m_input : &m_out[static_cast<size_t>(j)]);
      if (j < 0 || !m_nodes[static_cast<size_t>(j)].needs_grad) continue;
      const int owner = m_nodes[static_cast<size_t>(j)].grad_owner;
      if (owner < 0 || !m_grad[static_cast<size_t>(owner)].defined()) continue;
      const Shape shape = m_out[static_cast<size_t>(j)].shape();
      if (n.layer->passes_gradient() && m_grad_writers[static_cast<size_t>(owner)] == 1) {
        // This node alone writes the owner's gradient, and would write a copy of its own: the owner reads this
        // node's gradient instead. Nothing writes either afterwards (the owner has no other writer, and a node's
        // backward never writes its own gradient), so the sharing is safe.
        Tensor& g = m_grad[static_cast<size_t>(owner)];
        g = m_grad[i].view(g.shape());
        ++written[static_cast<size_t>(owner)];
        continue;
      }
      if (written[static_cast<size_t>(owner)]++ == 0) {
        dx_views[k] = m_grad[static_cast<size_t>(owner)].view(shape);
      } else {
        dx_views[k] = m_scratch_buf[static_cast<size_t>(owner)].narrow0(batch).view(shape);
        pending_adds.emplace_back(owner, k);
      }
      dins[k] = &dx_views[k];
    }
    use_params(i);
    if (m_grad_begin) {
      if (n.trainable > 0) m_grad_begin(i);
      if (n.tied_to >= 0 && !weight_frozen(m_nodes[static_cast<size_t>(n.tied_to)]))
        m_grad_begin(static_cast<size_t>(n.tied_to));
    }
    // Backward FLOPs: about twice the forward's for layers with parameters (input and weight gradients).
    SpanScope scope(m_profiler, n.name, n.type, "backward",
                    chain_backward_flops(i) * batch * (n.trainable > 0 ? 2 : 1));
    if (n.adds_param_grads) {  // a tied layer has written this node's weight gradient already
      LayerContext adding = ctx;
      adding.accumulate_grads = true;
      n.layer->backward(ins, m_out[out], m_grad[out], dins, adding);
    } else {
      n.layer->backward(ins, m_out[out], m_grad[out], dins, ctx);
    }
    if (m_grad_ready && n.trainable > 0) m_grad_ready(i);
    for (const auto& [owner, k] : pending_adds) {
      Tensor& g = m_grad[static_cast<size_t>(owner)];
      ops::add(g, dx_views[k].view(g.shape()), g);
    }
  }
}

std::string Model::edges() const {
  std::string out;
  for (size_t i = 0; i < m_nodes.size(); ++i) {
    const GraphNode& n = m_nodes[i];
    if (n.inputs.size() == 1 && n.inputs[0] == static_cast<int>(i) - 1) continue;  // a plain chain link
    std::string from;
    for (int j : n.inputs)
      from += (from.empty() ? "" : " + ") + (j < 0 ? std::string("input") : m_nodes[static_cast<size_t>(j)].name);
    out += fmt::format("  {} ← {}\n", n.name, from);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Model::state_tensors() {
  std::vector<GraphNode*> listed(m_nodes.size());
  for (auto& n : m_nodes) listed[n.index] = &n;
  std::vector<std::pair<std::string, Tensor*>> out;
  for (GraphNode* n : listed) {
    for (Param* p : n->layer->params()) out.emplace_back(n->name + "." + p->name, &p->value);
    for (auto& [name, t] : n->layer->buffers()) out.emplace_back(n->name + "." + name, t);
  }
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
  // In config-list order, with `name` and `inputs` only where they differ from the defaults.
  std::vector<const GraphNode*> listed(m_nodes.size());
  for (const auto& n : m_nodes) listed[n.index] = &n;
  YAML::Node list(YAML::NodeType::Sequence);
  for (size_t i = 0; i < listed.size(); ++i) {
    const GraphNode& n = *listed[i];
    YAML::Node item(YAML::NodeType::Map);
    item["type"] = n.type;
    if (n.name != fmt::format("layers.{}", i)) item["name"] = n.name;
    const std::string default_input = i == 0 ? "input" : listed[i - 1]->name;
    std::vector<std::string> inputs;
    for (int j : n.listed_inputs) inputs.push_back(j < 0 ? "input" : m_nodes[static_cast<size_t>(j)].name);
    if (inputs.size() != 1 || inputs[0] != default_input) {
      item["inputs"] = inputs;
      item["inputs"].SetStyle(YAML::EmitterStyle::Flow);
    }
    for (const auto& kv : n.layer->resolved_args()) item[kv.first] = kv.second;
    if (n.tied_to >= 0) item["tied_to"] = m_nodes[static_cast<size_t>(n.tied_to)].name;
    if (item.size() == 1) {
      list.push_back(n.type);
      continue;
    }
    item.SetStyle(YAML::EmitterStyle::Flow);
    list.push_back(item);
  }
  return list;
}

std::string Model::summary_table(int64_t batch) const {
  std::string out = fmt::format("{:<12} {:<10} {:<18} {:>12}\n", "layer", "type", "output shape", "parameters");
  out += fmt::format("{:<12} {:<10} {:<18} {:>12}\n", "input", "", m_input_shape.batched(batch).str(), "");
  for (const auto& n : m_nodes)
    out +=
        fmt::format("{:<12} {:<10} {:<18} {:>12}\n", n.name, n.type, n.out_shape.batched(batch).str(), n.param_count);
  const std::string e = edges();
  if (!e.empty()) out += "edges (other than from the layer before):\n" + e;
  const double mflops = static_cast<double>(forward_flops()) * 1e-6;
  out += fmt::format("total: {} layers, {} parameters ({:.2f} MB as f32), {:.3f} MFLOP forward per sample\n",
                     m_nodes.size(), param_count(), static_cast<double>(param_count()) * 4e-6, mflops);
  return out;
}

}  // namespace gt
