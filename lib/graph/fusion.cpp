// The fusion planner: chains of layers the first runs as epilogues of its own pass (Model::chains): on the CPU every
// kind, on a CUDA device those a dense layer heads (Layer::takes_epilogue_on_cuda), which cuBLASLt runs.
#include "graph/model.h"

namespace gt {

void Model::apply_epilogues() {
  const Chains c = chains();
  for (size_t i = 0; i < m_nodes.size(); ++i) m_nodes[i].layer->set_epilogue(c.any() ? c.epilogue[i] : ops::Epilogue{});
}

Model::Chains Model::chains() const {
  Chains c;
  if (!m_fusion || m_recompute != Recompute::none || m_half || m_sync) return c;
  const bool cpu = m_device.is_cpu();
  const size_t count = m_nodes.size();
  std::vector<std::vector<size_t>> readers(count);
  for (size_t i = 0; i < count; ++i)
    for (int j : m_nodes[i].inputs)
      if (j >= 0) readers[static_cast<size_t>(j)].push_back(i);
  c.tail.assign(count, -1);
  c.head.assign(count, -1);
  c.epilogue.assign(count, {});
  c.residual.assign(count, -1);
  c.flops.assign(count, 0);
  bool any = false;
  for (size_t i = 0; i < count; ++i) {
    const Layer& head = *m_nodes[i].layer;
    if (c.head[i] >= 0 || head.is_view() || (!cpu && !head.takes_epilogue_on_cuda())) continue;
    ops::Epilogue ep;
    size_t end = i;
    int64_t flops = head.forward_flops();
    // Extend the chain while the node at its end has one reader, which reads nothing else and is a step that the
    // head can run after the steps taken so far (a pool before relu, each once; GELU alone), or is a residual add
    // right after the head whose other input is a stored output of an earlier node (or the model's input).
    while (readers[end].size() == 1) {
      const GraphNode& next = m_nodes[readers[end][0]];
      const ops::Epilogue step = next.layer->epilogue_step();
      if (step.add) {
        if (end != i || next.inputs.size() != 2) break;
        const int other = next.inputs[next.inputs[0] == static_cast<int>(i) ? 1 : 0];
        // (other ≥ i also refuses an add of the head's output to itself.)
        if (other >= static_cast<int>(i) || (other >= 0 && c.unstored(static_cast<size_t>(other))) ||
            !head.takes_epilogue(step))
          break;
        ep = step;
        end = readers[end][0];
        c.head[end] = static_cast<int>(i);
        c.residual[i] = other;
        flops += next.layer->forward_flops();
        break;  // the add ends its chain
      }
      if (next.inputs.size() != 1 || !step.any() || (step.max_pool_2x2 && ep.any()) || (step.relu && ep.relu) ||
          ep.gelu_tanh || (step.gelu_tanh && ep.any()))
        break;
      ops::Epilogue longer = ep;
      longer.max_pool_2x2 = longer.max_pool_2x2 || step.max_pool_2x2;
      longer.relu = longer.relu || step.relu;
      longer.gelu_tanh = step.gelu_tanh;
      if (!head.takes_epilogue(longer)) break;
      ep = longer;
      end = readers[end][0];
      c.head[end] = static_cast<int>(i);
      flops += next.layer->forward_flops();
    }
    if (end == i) continue;
    c.tail[i] = static_cast<int>(end);
    c.epilogue[i] = ep;
    c.flops[i] = flops;
    any = true;
  }
  if (!any) return {};
  return c;
}

}  // namespace gt
