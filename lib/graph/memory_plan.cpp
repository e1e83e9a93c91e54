// The model's memory plan: which outputs train.recompute drops and computes again, which are kept in 16 bits for the
// backward pass (and the f32 working buffers they share), and the buffers each node gets (Model::buffer_plan).
#include "graph/model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

namespace gt {

std::string Model::set_recompute(Recompute mode) {
  GT_CHECK(m_max_batch == 0, "set_recompute after allocate: the buffers follow the mode");
  struct Reapply {  // on every way out: the mode decides whether chains are in force
    Model* m;
    ~Reapply() { m->apply_epilogues(); }
  } reapply{this};
  const size_t count = m_nodes.size();
  m_recompute = Recompute::none;
  m_slot.assign(count, -1);
  m_segment.assign(count, -1);
  m_segment_range.clear();
  m_slot_numel.clear();
  m_resident = -1;
  if (mode == Recompute::none) return "";
  // Each pass of a top-level block is a segment when its layers run one after another (a layer outside that the
  // block's layers wait for, placed between them, would read shared buffers another segment has overwritten).
  std::map<int, std::vector<size_t>> passes;
  for (size_t i = 0; i < count; ++i)
    if (m_nodes[i].block >= 0) passes[m_nodes[i].block].push_back(i);
  if (mode == Recompute::blocks && passes.empty())
    return "the model has no repeat: block, whose passes recompute: use none (or all, which cuts any model into "
           "segments)";
  for (const auto& [b, at] : passes)
    if (at.back() - at.front() + 1 == at.size())
      for (size_t i : at) m_segment[i] = b;
  // Under all, every run of other nodes is cut into ⌈r / ⌈√n⌉⌉ segments of about equal length (r nodes in the run,
  // n in the model): checkpoint_sequential's rule (Chen et al. 2016, "Training deep nets with sublinear memory
  // cost"), which keeps about √n outputs at segment boundaries and about √n in the shared buffers. Block pass ids
  // are positions in the expanded config list, below n, so these ids, from n, are apart. A last run of at most ⌈√n⌉
  // nodes right after a pass (a transformer's final norm and head) joins that pass: the last segment is the one not
  // run again, and a segment of its own there would make the backward pass recompute the whole last pass to save
  // the head's few outputs.
  const size_t run_limit = static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(count))));
  if (mode == Recompute::all) {
    for (size_t i = 0; i < count;) {
      size_t end = i;
      while (end < count && m_segment[end] < 0) ++end;
      const size_t run = end - i, pieces = (run + run_limit - 1) / run_limit;
      if (end == count && i > 0 && m_segment[i - 1] >= 0 && run <= run_limit) {
        for (size_t k = i; k < end; ++k) m_segment[k] = m_segment[i - 1];
        break;
      }
      for (size_t k = 0; k < run; ++k) m_segment[i + k] = static_cast<int>(count + i + k * pieces / run);
      i = std::max(end, i + 1);
    }
  }
  // The node whose buffer holds each node's output (a view reads its source's).
  std::vector<int> source(count, -1);
  for (size_t i = 0; i < count; ++i)
    source[i] = !m_nodes[i].layer->is_view() ? static_cast<int>(i)
                : m_nodes[i].inputs[0] >= 0  ? source[static_cast<size_t>(m_nodes[i].inputs[0])]
                                             : -1;
  std::vector<bool> read_outside(count, false);
  for (size_t i = 0; i < count; ++i)
    for (int j : m_nodes[i].inputs) {
      if (j < 0 || source[static_cast<size_t>(j)] < 0) continue;
      const size_t src = static_cast<size_t>(source[static_cast<size_t>(j)]);
      if (m_segment[src] < 0 || m_segment[src] != m_segment[i]) read_outside[src] = true;
    }
  read_outside.back() = true;  // the model output goes to the loss (a view's through its source)
  if (source.back() >= 0) read_outside[static_cast<size_t>(source.back())] = true;
  std::map<int, std::vector<size_t>> segments;
  for (size_t i = 0; i < count; ++i)
    if (m_segment[i] >= 0) segments[m_segment[i]].push_back(i);
  for (const auto& [s, at] : segments) {
    bool any = false;
    for (size_t i : at) {
      if (m_nodes[i].layer->is_view() || read_outside[i]) continue;
      const size_t p = i - at.front();
      if (m_slot_numel.size() <= p) m_slot_numel.resize(p + 1, 0);
      m_slot_numel[p] = std::max(m_slot_numel[p], m_nodes[i].out_shape.numel());
      m_slot[i] = static_cast<int>(p);
      any = true;
    }
    if (any) m_segment_range[s] = {at.front(), at.back()};
  }
  if (mode == Recompute::blocks && m_segment_range.empty())
    return "no repeat: block of the model has a layer whose output is used only inside its block, and whose layers "
           "run one after another: nothing would be recomputed (use none)";
  // The last segment is never run again, so with one segment there is nothing to share a buffer with.
  if (mode == Recompute::all && m_segment_range.size() < 2)
    return fmt::format(
        "cut into segments (the passes of repeat: blocks, the other layers in runs of at most {}), the model has {} "
        "segment{} with a layer whose output is used only inside it: nothing would be recomputed (use none)",
        run_limit, m_segment_range.size(), m_segment_range.size() == 1 ? "" : "s");
  m_recompute = mode;
  return "";
}

void Model::set_activation_storage(std::optional<HalfFormat> format) {
  GT_CHECK(!format || m_dtype == DType::f32, "activations kept in half precision need an f32 model");
  GT_CHECK(!format || !is_half(m_act), "activations kept in half precision: the model holds them in {} already",
           dtype_name(m_act));
  GT_CHECK(m_max_batch == 0, "set_activation_storage after allocate: the buffers are planned already");
  m_half = format;
  apply_epilogues();
}

void Model::set_activation_dtype(DType dtype) {
  GT_CHECK(dtype == m_dtype || (is_half(dtype) && m_dtype == DType::f32),
           "set_activation_dtype {} for a model of {}: 16-bit activations need an f32 model", dtype_name(dtype),
           dtype_name(m_dtype));
  GT_CHECK(m_max_batch == 0, "set_activation_dtype after allocate: the buffers are planned already");
  if (is_half(dtype)) {
    const std::string why = half_activations_unsupported();
    GT_CHECK(why.empty(), "set_activation_dtype {}: {}", dtype_name(dtype), why);
    m_half = std::nullopt;  // the outputs are the 16-bit copies themselves
  }
  m_act = dtype;
  apply_epilogues();
}

std::string Model::half_activations_unsupported() const {
  for (const GraphNode& n : m_nodes)
    if (!n.layer->is_view() && !n.layer->takes_half_activations())
      return fmt::format("layer \"{}\" ({}) does not take 16-bit activations", n.name, n.type);
  return "";
}

std::optional<HalfFormat> Model::activation_storage() const {
  if (!m_half) return std::nullopt;
  const HalfPlan plan = half_plan();
  const bool any = std::any_of(plan.pool.begin(), plan.pool.end(), [](int b) { return b >= 0; });
  return any ? m_half : std::nullopt;
}

Model::HalfPlan Model::half_plan() const {
  const size_t count = m_nodes.size();
  HalfPlan plan;
  plan.pool.assign(count, -1);
  plan.pack_after.assign(count, {});
  if (!m_half) return plan;
  // The node whose buffer each output is (a view's is its source's; -1: the model input), and the last node whose
  // forward reads it (through views too; a node nothing reads is its own last reader).
  std::vector<int> source(count);
  std::vector<size_t> last_read(count);
  std::vector<bool> keep_f32(count, false);
  for (size_t i = 0; i < count; ++i) {
    const GraphNode& n = m_nodes[i];
    source[i] =
        n.layer->is_view() ? (n.inputs[0] < 0 ? -1 : source[static_cast<size_t>(n.inputs[0])]) : static_cast<int>(i);
    last_read[i] = i;
    if (n.layer->is_view()) continue;
    const bool recomputed = !m_slot.empty() && m_slot[i] >= 0;
    keep_f32[i] = keep_f32[i] || recomputed;
    for (int j : n.inputs) {
      const int r = j < 0 ? -1 : source[static_cast<size_t>(j)];
      if (r < 0) continue;
      last_read[static_cast<size_t>(r)] = i;
      if (recomputed || n.layer->reads_exact_inputs()) keep_f32[static_cast<size_t>(r)] = true;
    }
  }
  if (source[count - 1] >= 0) keep_f32[static_cast<size_t>(source[count - 1])] = true;  // the loss reads it
  // Working buffers by the forward pass's lives, for the outputs of at most `limit` elements per sample: node i
  // takes a free one (the smallest that fits, else the largest, grown) and gives back those of the outputs it reads
  // last after its forward, so the inputs and the output of a node always have buffers of their own, in the backward
  // pass too. Returns the plan and its bytes per sample (16-bit copies, working buffers, the f32 outputs).
  auto plan_for = [&](int64_t limit, int64_t& bytes) {
    HalfPlan p;
    p.pool.assign(count, -1);
    p.pack_after.assign(count, {});
    bytes = 0;
    std::vector<std::vector<int>> last_read_by(count);
    for (size_t i = 0; i < count; ++i) {
      const GraphNode& n = m_nodes[i];
      if (n.layer->is_view() || (!m_slot.empty() && m_slot[i] >= 0)) continue;  // recomputed: counted by neither
      const bool half = !keep_f32[i] && n.out_shape.numel() <= limit;
      bytes += n.out_shape.numel() * (half ? 2 : 4);
      if (half)
        last_read_by[last_read[i]].push_back(static_cast<int>(i));
      else
        p.pool[i] = -2;  // f32, for the loop below
    }
    std::vector<int> free_list;
    for (size_t i = 0; i < count; ++i) {
      const GraphNode& n = m_nodes[i];
      if (!n.layer->is_view() && !keep_f32[i] && p.pool[i] == -1) {
        const int64_t need = n.out_shape.numel();
        int pick = -1;
        for (int b : free_list) {
          const int64_t have = p.pool_numel[static_cast<size_t>(b)];
          const int64_t best = pick < 0 ? 0 : p.pool_numel[static_cast<size_t>(pick)];
          if (pick < 0 || (have >= need && (best < need || have < best)) || (best < need && have > best)) pick = b;
        }
        if (pick < 0) {
          pick = static_cast<int>(p.pool_numel.size());
          p.pool_numel.push_back(need);
        } else {
          free_list.erase(std::find(free_list.begin(), free_list.end(), pick));
          p.pool_numel[static_cast<size_t>(pick)] = std::max(p.pool_numel[static_cast<size_t>(pick)], need);
        }
        p.pool[i] = pick;
      }
      for (int r : last_read_by[i]) {
        free_list.push_back(p.pool[static_cast<size_t>(r)]);
        p.pack_after[i].push_back(r);
      }
    }
    for (int& b : p.pool) b = std::max(b, -1);
    for (int64_t numel : p.pool_numel) bytes += 4 * numel;
    return p;
  };
  // A shallow net holds as much in its working buffers (two or three of its largest outputs in f32) as the 16-bit
  // copies save: the largest outputs then pay to stay f32. Tried: every size of output as the largest kept in half
  // (the 32 largest sizes), and none; the fewest bytes wins, none on a tie.
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < count; ++i)
    if (!m_nodes[i].layer->is_view() && !keep_f32[i]) sizes.push_back(m_nodes[i].out_shape.numel());
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  if (sizes.size() > 32) sizes.resize(32);
  int64_t best_bytes = 0;
  HalfPlan best = plan_for(0, best_bytes);
  for (int64_t limit : sizes) {
    int64_t bytes = 0;
    HalfPlan p = plan_for(limit, bytes);
    if (bytes < best_bytes) best_bytes = bytes, best = std::move(p);
  }
  return best;
}

std::vector<Model::NodeBuffers> Model::buffer_plan(int64_t max_batch) const {
  const size_t count = m_nodes.size();
  const std::vector<int> writers = grad_writers();
  std::vector<NodeBuffers> plan(count);
  std::vector<bool> slot_given(m_slot_numel.size(), false);
  const HalfPlan half = half_plan();
  std::vector<bool> pool_given(half.pool_numel.size(), false);
  const Chains chain = chains();
  for (size_t i = 0; i < count; ++i) {
    const GraphNode& n = m_nodes[i];
    if (n.layer->is_view()) continue;  // bound to its input at run time
    if (chain.unstored(i)) continue;   // inside a fused chain: neither it nor its gradient is stored
    const int64_t rows = n.out_shape.batched(max_batch).numel();
    plan[i].output = rows;
    plan[i].dtype = m_act;
    if (half.pool[i] >= 0) {  // kept in 16 bits; a working buffer, given to the first node that uses it
      const auto b = static_cast<size_t>(half.pool[i]);
      plan[i].output = pool_given[b] ? 0 : mul_sizes(half.pool_numel[b], max_batch, "elements");
      plan[i].half = rows;
      pool_given[b] = true;
    }
    if (!m_slot.empty() && m_slot[i] >= 0) {  // a shared buffer, given to the first node at its position
      const size_t p = static_cast<size_t>(m_slot[i]);
      plan[i].output = slot_given[p] ? 0 : mul_sizes(m_slot_numel[p], max_batch, "elements");
      slot_given[p] = true;
    }
    // The last node's gradient comes from the loss; the others need a buffer only when something before learns.
    if (n.needs_grad && i + 1 < count) plan[i].gradient = rows;
    if (writers[i] > 1) plan[i].scratch = rows;
  }
  return plan;
}

}  // namespace gt
