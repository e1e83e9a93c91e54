// The sharded optimizer of ZeRO stages 1 and 2: a plain optimizer over views of this rank's slices of the
// parameters, the all-gather of the new weights, and the unsharded state for checkpoints.
#include "parallel/zero.h"

#include "core/error.h"
#include "ops/elementwise.h"
#include "ops/precision.h"
#include "optim/offload.h"

#include <algorithm>
#include <map>

namespace gt {

ZeroOptimizer::ZeroOptimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params, const BucketPlan& plan,
                             Communicator& comm, int stage, const std::vector<int>& groups, Offload offload)
    : Optimizer(cfg, params, groups),
      m_comm(comm),
      m_stage(stage),
      m_device(params.empty() ? Device::cpu() : params[0]->value.device()),
      m_params(params) {
  const auto world = static_cast<size_t>(comm.size()), rank = static_cast<size_t>(comm.rank());
  GT_CHECK(!comm.device_buffers() || m_device.is_cuda(), "dist.zero over {} shards parameters on a CUDA device, not {}",
           comm.name(), m_device.str());
  m_staged = m_device.is_cuda() && !comm.device_buffers();
  std::map<const Param*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) {
    GT_CHECK(params[i]->value.dtype() == DType::f32 && params[i]->value.device() == m_device,
             "dist.zero shards f32 parameters on one device ({}: {} on {})", params[i]->name,
             dtype_name(params[i]->value.dtype()), params[i]->value.device().str());
    index[params[i]] = i;
    m_shapes.push_back(params[i]->value.shape());
    // Stage 1's norm: over the whole gradients. (Stage 2 keeps no reference to them: GradSync frees them.)
    if (stage < 2) m_group.rows.push_back({params[i]->value, params[i]->grad});
  }
  size_t max_chunk = 0, slices = 0;
  for (const auto& bucket : plan.buckets) slices += bucket.size();
  m_slice_params.reserve(slices);  // m_inner keeps pointers to them
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    Bucket out;
    size_t n = 0;
    for (Param* p : plan.buckets[b]) {
      out.params.push_back(index.at(p));
      n += static_cast<size_t>(p->value.numel());
    }
    out.chunk = zero_chunk(n, static_cast<int>(world));
    max_chunk = std::max(max_chunk, out.chunk);
    if (m_stage >= 2)
      m_grad_chunks.push_back(Tensor::zeros(Shape{static_cast<int64_t>(out.chunk)}, DType::f32, m_device));
    if (m_stage >= 3)  // (filled by shard_values: the weights may still change before the first step)
      m_value_shards.push_back(Tensor::zeros(Shape{static_cast<int64_t>(out.chunk)}, DType::f32, m_device));
    const size_t begin = out.chunk * rank, end = std::min(begin + out.chunk, n);
    out.first_slice = m_slices.size();
    size_t offset = 0;
    for (Param* p : plan.buckets[b]) {
      const auto pn = static_cast<size_t>(p->value.numel());
      const size_t lo = std::max(offset, begin), hi = std::min(offset + pn, end);
      if (lo < hi) {
        const auto off = static_cast<int64_t>(lo - offset), count = static_cast<int64_t>(hi - lo);
        m_slices.push_back({b, index.at(p), off, count, lo - begin});
        const Shape flat{p->value.numel()};
        const auto at = static_cast<int64_t>(lo - begin);
        m_slice_params.push_back(
            {p->name, m_stage >= 3 ? m_value_shards[b].slice0(at, count) : p->value.view(flat).slice0(off, count),
             m_stage >= 2 ? m_grad_chunks[b].slice0(static_cast<int64_t>(lo - begin), count)
                          : p->grad.view(flat).slice0(off, count)});
      }
      offset += pn;
    }
    out.end_slice = m_slices.size();
    m_buckets.push_back(std::move(out));
  }
  if (m_stage >= 3) max_chunk = std::max(max_chunk, plan_units_of(plan));
  std::vector<Param*> rows;
  std::vector<int> row_groups;  // each slice in its parameter's group
  for (size_t j = 0; j < m_slice_params.size(); ++j) {
    rows.push_back(&m_slice_params[j]);
    row_groups.push_back(param_groups()[m_slices[j].param]);
  }
  if (offload == Offload::none)
    m_inner = make_optimizer(cfg, rows, row_groups);
  else
    m_inner = std::make_unique<OffloadOptimizer>(cfg, rows, row_groups, offload == Offload::delayed);
  // The names of one parameter's state buffers, from an optimizer over a one-element stand-in.
  Param one{"x", Tensor::zeros(Shape{1}, DType::f32), Tensor::zeros(Shape{1}, DType::f32)};
  for (const auto& [name, t] : make_optimizer(cfg, {&one}, {0})->state())
    m_buffers.push_back(name.substr(name.find('.') + 1));
  const auto send = static_cast<int64_t>(max_chunk), recv = static_cast<int64_t>(max_chunk * world);
  m_max_chunk = max_chunk;
  if (m_stage < 3) {  // stage 3 gathers no weights after the step: a checkpoint's state gather makes its own
    m_send = Tensor::zeros(Shape{send}, DType::f32, m_device);
    m_recv = Tensor::zeros(Shape{recv}, DType::f32, m_device);
  }
  if (m_staged) {
    m_host_send = Tensor::zeros(Shape{send}, DType::f32);
    m_host_recv = Tensor::zeros(Shape{recv}, DType::f32);
  }
  if (m_stage >= 2) {
    m_total = Tensor::zeros(Shape{1}, DType::f64, m_device);
    m_per_slice =
        Tensor::zeros(Shape{std::max<int64_t>(1, static_cast<int64_t>(m_slices.size()))}, DType::f64, m_device);
    if (m_device.is_cuda())
      m_sums = Tensor::zeros(Shape{static_cast<int64_t>(m_params.size()) + 1}, DType::f64, m_device);
  }
}

size_t ZeroOptimizer::plan_units_of(const BucketPlan& plan) {
  GT_CHECK(plan.node_unit.size() >= plan.node_bucket.size() && plan.frozen.size() == plan.buckets.size(),
           "dist.zero 3 shards by units (plan_units)");
  m_node_unit = plan.node_unit;
  m_gathered.resize(m_buckets.size());
  m_pending.resize(m_buckets.size());
  for (size_t b = 0; b < m_buckets.size(); ++b)
    m_node_unit_has_weights.push_back(!plan.buckets[b].empty() || !plan.frozen[b].empty());
  // Each unit's frozen parameters: a shard of their own, cut as a bucket is.
  m_frozen = plan.frozen;
  m_frozen_gathered.resize(m_buckets.size());
  size_t max_chunk = 0;
  for (const auto& frozen : m_frozen) {
    int64_t n = 0;
    m_frozen_shapes.emplace_back();
    for (const Param* p : frozen) {
      n += p->value.numel();
      m_frozen_shapes.back().push_back(p->value.shape());
    }
    const size_t chunk = zero_chunk(static_cast<size_t>(n), m_comm.size());
    m_frozen_shards.push_back(Tensor::zeros(Shape{static_cast<int64_t>(chunk)}, DType::f32, m_device));
    max_chunk = std::max(max_chunk, chunk);
  }
  return max_chunk;
}

void ZeroOptimizer::allgather(const Tensor& send, Tensor& recv, size_t n, const char* what) {
  if (n == 0) return;  // a unit without parameters that learn (or without frozen ones)
  if (!m_staged) {     // both on the host, or both on the device with NCCL (queued on the compute stream, in order)
    m_comm.allgather(send.data<float>(), recv.data<float>(), n, what);
    return;
  }
  const auto world = static_cast<int64_t>(m_comm.size()), count = static_cast<int64_t>(n);
  Tensor hs = m_host_send.slice0(0, count), hr = m_host_recv.slice0(0, count * world);
  hs.copy_from(send);  // waits for the device's work on `send`
  m_comm.allgather(hs.data<float>(), hr.data<float>(), n, what);
  recv.copy_from(hr);
}

template <class Mine, class Whole>
void ZeroOptimizer::gather(const char* what, Mine mine, Whole whole) {
  const auto world = static_cast<int64_t>(m_comm.size());
  const bool own = !m_send.defined();  // stage 3: buffers for this gather only
  if (own) {
    m_send = Tensor::zeros(Shape{static_cast<int64_t>(m_max_chunk)}, DType::f32, m_device);
    m_recv = Tensor::zeros(Shape{static_cast<int64_t>(m_max_chunk) * world}, DType::f32, m_device);
  }
  for (const Bucket& b : m_buckets) {
    const auto chunk = static_cast<int64_t>(b.chunk);
    // Host copies on the CPU, device copies queued on the compute stream otherwise (copy_from matches by count).
    Tensor send = m_send.slice0(0, chunk), recv = m_recv.slice0(0, chunk * world);
    send.zero_();
    for (size_t j = b.first_slice; j < b.end_slice; ++j) {
      const Tensor& t = mine(j);
      send.slice0(static_cast<int64_t>(m_slices[j].at), t.numel()).copy_from(t);
    }
    allgather(send, recv, b.chunk, what);
    // Rank r's chunk lands at r · chunk: the bucket's elements in order, then the padding.
    int64_t offset = 0;
    for (size_t i : b.params) {
      Tensor& t = whole(i);
      t.copy_from(recv.slice0(offset, t.numel()));
      offset += t.numel();
    }
  }
  if (own) m_send = m_recv = Tensor();
}

void ZeroOptimizer::step(std::span<const double> lrs, const Tensor& stats, double max_norm) {
  m_inner->set_steps_taken(m_steps);   // undo_step and set_steps_taken reach this one: Adam's bias correction
  if (m_stage >= 3) release_values();  // (the training step has freed them: a gathered copy would go stale)
  m_inner->step(lrs, stats, max_norm);
  ++m_steps;
  if (m_stage < 3) gather_weights();  // (stage 3: the next pass gathers the new weights as it needs them)
}

void ZeroOptimizer::gather_weights() {
  gather(
      "the updated weights", [&](size_t j) -> Tensor& { return m_slice_params[j].value; },
      [&](size_t i) -> Tensor& { return m_params[i]->value; });
}

bool ZeroOptimizer::settle() {
  if (!m_inner->settle()) return false;
  if (m_stage < 3) gather_weights();
  return true;
}

void ZeroOptimizer::grad_norm_sq(Tensor& out, Tensor& per_param) {
  if (m_stage < 2) {  // every rank holds the whole averaged gradients: the norm of zero 0, bit for bit
    Optimizer::grad_norm_sq(out, per_param);
    return;
  }
  // Each rank holds the averaged gradients of its own slices only: their sums, added up over the ranks.
  m_total.zero_();
  m_per_slice.zero_();
  m_inner->grad_norm_sq(m_total, m_per_slice);
  if (m_device.is_cuda()) {
    device_norm_sums(out, per_param);
    return;
  }
  std::vector<double> sums(m_params.size() + 1, 0.0);
  for (size_t j = 0; j < m_slices.size(); ++j) sums[m_slices[j].param] += m_per_slice.data<double>()[j];
  sums.back() = m_total.data<double>()[0];
  m_comm.allreduce_sum(sums.data(), sums.size(), "the gradient norm");
  out.data<double>()[0] += sums.back();
  if (per_param.defined())
    for (size_t i = 0; i < m_params.size() && static_cast<int64_t>(i) < per_param.numel(); ++i)
      per_param.data<double>()[i] += sums[i];
}

void ZeroOptimizer::device_norm_sums(Tensor& out, Tensor& per_param) {
  // grad_norm_sq's host sums, on the device: each parameter's slice (one per rank at most), then the total, summed
  // over the ranks. With NCCL the all-reduce queues on the compute stream between the kernels: no host sync.
  const auto n = static_cast<int64_t>(m_params.size());
  m_sums.zero_();
  for (size_t j = 0; j < m_slices.size(); ++j) {
    Tensor sum = m_sums.slice0(static_cast<int64_t>(m_slices[j].param), 1);
    ops::add(sum, m_per_slice.slice0(static_cast<int64_t>(j), 1), sum);
  }
  m_sums.slice0(n, 1).copy_from(m_total);
  if (m_staged) {
    Tensor host = Tensor::empty(m_sums.shape(), DType::f64);
    host.copy_from(m_sums);
    m_comm.allreduce_sum(host.data<double>(), static_cast<size_t>(host.numel()), "the gradient norm");
    m_sums.copy_from(host);
  } else {
    m_comm.allreduce_sum(m_sums.data<double>(), static_cast<size_t>(m_sums.numel()), "the gradient norm");
  }
  Tensor total = out.slice0(0, 1);
  ops::add(total, m_sums.slice0(n, 1), total);
  if (per_param.defined()) {
    const int64_t k = std::min(n, per_param.numel());
    Tensor mine = per_param.slice0(0, k);
    if (k > 0) ops::add(mine, m_sums.slice0(0, k), mine);
  }
}

void ZeroOptimizer::shard_values() {
  if (m_stage < 3) return;
  for (size_t j = 0; j < m_slices.size(); ++j) {
    const Slice& s = m_slices[j];
    const Tensor& whole = m_params[s.param]->value;
    GT_CHECK(whole.defined(), "dist.zero 3: {} is not whole when its shard is taken", m_params[s.param]->name);
    m_slice_params[j].value.copy_from(whole.view(Shape{whole.numel()}).slice0(s.offset, s.count));
  }
  // A unit's frozen parameters: this rank's range of their flat concatenation, as the chunk of a bucket.
  const auto rank = static_cast<int64_t>(m_comm.rank());
  for (size_t u = 0; u < m_frozen.size(); ++u) {
    const int64_t chunk = m_frozen_shards[u].numel(), begin = chunk * rank, end = begin + chunk;
    int64_t offset = 0;
    for (Param* p : m_frozen[u]) {
      GT_CHECK(p->value.defined(), "dist.zero 3: {} is not whole when its shard is taken", p->name);
      const int64_t n = p->value.numel(), lo = std::max(offset, begin), hi = std::min(offset + n, end);
      if (lo < hi)
        m_frozen_shards[u].slice0(lo - begin, hi - lo).copy_from(p->value.view(Shape{n}).slice0(lo - offset, hi - lo));
      offset += n;
    }
  }
  release_values();
  for (Param* p : m_params) p->value = Tensor();
  for (const auto& frozen : m_frozen)
    for (Param* p : frozen) p->value = Tensor();
}

void ZeroOptimizer::fill_unit(size_t b) {
  // Mapped on the host, so that its pages go back to the system when it is freed (as GradSync's buckets).
  auto buffer = [&](int64_t n) {
    return m_device.is_cpu() ? Tensor::mapped_zeros(Shape{n}, DType::f32)
                             : Tensor::empty(Shape{n}, DType::f32, m_device);
  };
  const size_t chunk = m_buckets[b].chunk;
  m_gathered[b] = buffer(static_cast<int64_t>(chunk * static_cast<size_t>(m_comm.size())));
  allgather(m_value_shards[b], m_gathered[b], chunk, "a unit of the weights");
  if (m_frozen[b].empty()) return;
  const Tensor& shard = m_frozen_shards[b];
  m_frozen_gathered[b] = buffer(shard.numel() * m_comm.size());
  allgather(shard, m_frozen_gathered[b], static_cast<size_t>(shard.numel()), "a unit of the frozen weights");
}

void ZeroOptimizer::attach_unit(size_t b) {
  // The new weights may sit where another unit's were a moment ago: rounded copies of those must not be used.
  renew_product_scope();
  int64_t offset = 0;
  for (size_t i : m_buckets[b].params) {
    m_params[i]->value = m_gathered[b].slice0(offset, m_shapes[i].numel()).view(m_shapes[i]);
    offset += m_shapes[i].numel();
  }
  offset = 0;
  for (size_t k = 0; k < m_frozen[b].size(); ++k) {
    const Shape& shape = m_frozen_shapes[b][k];
    m_frozen[b][k]->value = m_frozen_gathered[b].slice0(offset, shape.numel()).view(shape);
    offset += shape.numel();
  }
}

void ZeroOptimizer::gather_unit(size_t b) {
  if (m_prefetch) {  // on the communication thread, in order with what is queued there
    m_prefetch->post([this, b] { fill_unit(b); }).get();
  } else {
    fill_unit(b);
  }
  attach_unit(b);
}

void ZeroOptimizer::release_unit(size_t b) {
  if (m_pending[b].valid()) m_pending[b].get();  // a prefetch under way: done before its buffers go
  for (size_t i : m_buckets[b].params) m_params[i]->value = Tensor();
  for (Param* p : m_frozen[b]) p->value = Tensor();
  m_gathered[b] = Tensor();
  m_frozen_gathered[b] = Tensor();
}

void ZeroOptimizer::use_node(size_t node) {
  if (m_stage < 3 || m_all_whole || node >= m_node_unit.size() || m_node_unit[node] < 0) return;
  const auto u = static_cast<size_t>(m_node_unit[node]);
  const auto it = std::find(m_recent.begin(), m_recent.end(), u);
  if (it != m_recent.end()) {  // whole already: now the one used last
    m_recent.erase(it);
    m_recent.push_back(u);
  } else {
    // The one used longest ago goes first, so that no more than kResidentUnits are ever whole at once (and the one
    // being prefetched).
    if (m_recent.size() >= kResidentUnits) {
      release_unit(m_recent.front());
      m_recent.erase(m_recent.begin());
    }
    if (m_pending[u].valid()) {  // prefetched: its gather has run, or runs now on the communication thread
      m_pending[u].get();
      attach_unit(u);
    } else {
      gather_unit(u);
    }
    m_recent.push_back(u);
  }
  // The pass's direction from the units it moves through (forward: from the last unit to the first, as units are
  // numbered from the last node; backward: the other way), and the next unit's gather queued ahead of it.
  if (m_last_unit >= 0 && static_cast<int>(u) != m_last_unit) m_direction = static_cast<int>(u) < m_last_unit ? -1 : 1;
  m_last_unit = static_cast<int>(u);
  if (!m_prefetch) return;
  const int next = static_cast<int>(u) + m_direction;
  if (next < 0 || next >= static_cast<int>(m_buckets.size())) return;
  const auto n = static_cast<size_t>(next);
  if (m_pending[n].valid() || std::find(m_recent.begin(), m_recent.end(), n) != m_recent.end()) return;
  if (m_node_unit_has_weights[n]) m_pending[n] = m_prefetch->post([this, n] { fill_unit(n); });
}

void ZeroOptimizer::gather_values() {
  if (m_stage < 3 || m_all_whole) return;
  for (size_t b = 0; b < m_buckets.size(); ++b)
    if (!m_gathered[b].defined()) gather_unit(b);
  m_recent.clear();
  m_all_whole = true;
}

void ZeroOptimizer::release_values() {
  if (m_stage < 3) return;
  for (size_t b = 0; b < m_buckets.size(); ++b)
    if (m_gathered[b].defined() || m_pending[b].valid()) release_unit(b);
  m_recent.clear();
  m_all_whole = false;
  m_last_unit = -1;
  m_direction = -1;  // a pass starts with a forward
}

std::vector<std::pair<std::string, Tensor*>> ZeroOptimizer::state() {
  if (m_full.empty())
    for (size_t i = 0; i < m_params.size(); ++i)
      for (const std::string& buffer : m_buffers)
        m_full.emplace_back(std::to_string(i) + "." + buffer, Tensor::zeros(m_shapes[i], DType::f32, m_device));
  std::vector<std::pair<std::string, Tensor*>> out;
  for (auto& [name, t] : m_full) out.emplace_back(name, &t);
  return out;
}

void ZeroOptimizer::gather_state() {
  state();
  std::map<std::string, Tensor*> inner;
  for (auto& [name, t] : m_inner->state()) inner[name] = t;
  const size_t per = m_buffers.size();
  for (size_t u = 0; u < per; ++u)
    gather(
        "the optimizer state", [&](size_t j) -> Tensor& { return *inner.at(std::to_string(j) + "." + m_buffers[u]); },
        [&](size_t i) -> Tensor& { return m_full[i * per + u].second; });
}

void ZeroOptimizer::shard_state() {
  if (m_full.empty()) return;
  std::map<std::string, Tensor*> inner;
  for (auto& [name, t] : m_inner->state()) inner[name] = t;
  const size_t per = m_buffers.size();
  for (size_t j = 0; j < m_slices.size(); ++j)
    for (size_t u = 0; u < per; ++u) {
      const Tensor& whole = m_full[m_slices[j].param * per + u].second;
      inner.at(std::to_string(j) + "." + m_buffers[u])
          ->copy_from(whole.view(Shape{whole.numel()}).slice0(m_slices[j].offset, m_slices[j].count));
    }
  m_full.clear();
  m_full.shrink_to_fit();
}

std::vector<StateRange> ZeroOptimizer::state_ranges() {
  std::map<std::string, Tensor*> inner;
  for (auto& [name, t] : m_inner->state()) inner[name] = t;
  std::vector<StateRange> out;
  for (size_t j = 0; j < m_slices.size(); ++j)
    for (const std::string& buffer : m_buffers)
      out.push_back({m_slices[j].param, buffer, m_slices[j].offset, *inner.at(std::to_string(j) + "." + buffer)});
  return out;
}

std::vector<const Tensor*> ZeroOptimizer::shard_pieces() {
  std::map<std::string, Tensor*> inner;
  for (auto& [name, t] : m_inner->state()) inner[name] = t;
  std::vector<const Tensor*> out;
  for (const Bucket& b : m_buckets)
    for (const std::string& buffer : m_buffers)
      for (size_t j = b.first_slice; j < b.end_slice; ++j) out.push_back(inner.at(std::to_string(j) + "." + buffer));
  return out;
}

std::vector<std::vector<size_t>> ZeroOptimizer::bucket_params() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : m_buckets) out.push_back(b.params);
  return out;
}

std::vector<size_t> ZeroOptimizer::bucket_chunks() const {
  std::vector<size_t> out;
  for (const Bucket& b : m_buckets) out.push_back(b.chunk);
  return out;
}

int64_t ZeroOptimizer::shard_state_elements() {
  int64_t n = 0;
  for (const auto& [name, t] : m_inner->state()) n += t->numel();
  return n;
}

int64_t ZeroOptimizer::full_state_elements() const {
  int64_t n = 0;
  for (const Shape& shape : m_shapes) n += shape.numel();
  return n * static_cast<int64_t>(m_buffers.size());
}

}  // namespace gt
