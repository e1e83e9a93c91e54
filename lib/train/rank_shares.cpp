// `gputrain check --world-size`: what one rank holds under each ZeRO stage, and what would fit when nothing does.
#include "core/error.h"
#include "core/json.h"
#include "parallel/grad_sync.h"
#include "parallel/zero.h"
#include "train/footprint.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <numeric>

namespace gt {

namespace {

// Elements of rank 0's chunk of each of `sizes` (its part of the optimizer state and of the averaged gradients).
size_t chunk_sum(const std::vector<int64_t>& sizes, int64_t world) {
  size_t n = 0;
  for (int64_t s : sizes) n += zero_chunk(static_cast<size_t>(s), static_cast<int>(world));
  return n;
}

// `n` elements padded to chunk · world: the buffer a bucket or unit takes while whole.
size_t padded(int64_t n, int64_t world) {
  return zero_chunk(static_cast<size_t>(n), static_cast<int>(world)) * static_cast<size_t>(world);
}

// Each of `sizes` padded, the largest first.
std::vector<size_t> padded_largest_first(const std::vector<int64_t>& sizes, int64_t world) {
  std::vector<size_t> out;
  for (int64_t s : sizes) out.push_back(padded(s, world));
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
}

// Whether `judge` speaks of a GPU (its memory is the device's; the host's is another).
bool on_gpu(const std::function<MemoryFit(size_t)>& judge) { return judge(0).device.rfind("cuda", 0) == 0; }

// The sum of the first `k` of `v` (all of them when there are fewer).
size_t sum_first(const std::vector<size_t>& v, size_t k) {
  return std::accumulate(v.begin(), v.begin() + static_cast<long>(std::min(k, v.size())), size_t{0});
}

// On a GPU without accumulation, GradSync's ring of bucket buffers: two slots taking turns and one per tied layer's
// owner (kept through the pass), each grown to the largest bucket it held: at most that many of the largest.
size_t device_ring(const Footprint& f, const std::vector<int64_t>& buckets, int64_t world) {
  const std::vector<size_t> whole = padded_largest_first(buckets, world);
  return whole.empty() ? 0 : whole.front() * std::min(whole.size(), static_cast<size_t>(2 + f.tied_owners));
}

// Stage 2's gradient elements on one rank (see RankShare): its chunk of every bucket, and the buckets whole at once —
// every bucket with accumulation (the micro-batches before the last add into them), two on the host, the ring's
// slots on a GPU.
size_t zero2_grads(const Footprint& f, int64_t world, bool device_buckets) {
  const std::vector<size_t> whole = padded_largest_first(f.grad_buckets, world);
  const size_t chunks = chunk_sum(f.grad_buckets, world);
  if (f.accumulate > 1) return chunks + sum_first(whole, whole.size());
  return chunks + (device_buckets ? device_ring(f, f.grad_buckets, world) : sum_first(whole, 2));
}

// Stage 3's gradient elements: the chunks of every unit, and the units the backward pass holds whole together (the
// largest of Footprint::shard_unit_grads_whole's sets), every unit with accumulation, the ring's slots on a GPU.
size_t zero3_grads(const Footprint& f, int64_t world, bool device_buckets) {
  const size_t chunks = chunk_sum(f.shard_units, world);
  size_t whole = 0;
  if (f.accumulate > 1) {
    for (int64_t n : f.shard_units) whole += padded(n, world);
  } else if (device_buckets) {
    whole = device_ring(f, f.shard_units, world);
  } else {
    for (const std::vector<size_t>& together : f.shard_unit_grads_whole) {
      size_t n = 0;
      for (size_t u : together) n += padded(f.shard_units[u], world);
      whole = std::max(whole, n);
    }
  }
  return chunks + whole;
}

// ZeroOptimizer's all-gather buffers over `sizes` (its buckets): the largest chunk, and every rank's chunk of it.
size_t gather_elements(const std::vector<int64_t>& sizes, int64_t world) {
  size_t chunk = 0;
  for (int64_t s : sizes) chunk = std::max(chunk, zero_chunk(static_cast<size_t>(s), static_cast<int>(world)));
  return chunk * static_cast<size_t>(1 + world);
}

// Stage 3's rounded weight copies (see RankShare): those of the weights in no unit, and of the kResidentUnits units
// whose copies are largest.
size_t zero3_half_bytes(const Footprint& f) {
  std::vector<size_t> per_unit = f.shard_unit_half_bytes;
  std::sort(per_unit.begin(), per_unit.end(), std::greater<>());
  return f.unsharded_half_bytes + sum_first(per_unit, ZeroOptimizer::kResidentUnits);
}

// The least total of `shares`.
const RankShare& least(const std::vector<RankShare>& shares) {
  return *std::min_element(shares.begin(), shares.end(),
                           [](const RankShare& a, const RankShare& b) { return a.total_bytes < b.total_bytes; });
}

}  // namespace

std::vector<RankShare> rank_shares(const Footprint& f, int64_t world, const std::function<MemoryFit(size_t)>& judge) {
  GT_CHECK(world >= 1, "rank_shares at {} ranks", world);
  const size_t element = dtype_size(f.dtype);
  const size_t whole = f.buffer_bytes + f.activation_bytes + f.batch_bytes;
  const bool device_buckets = on_gpu(judge);
  const size_t state = static_cast<size_t>(f.optimizer_state_per_param);
  std::vector<RankShare> out;
  for (int stage = 0; stage <= 3; ++stage) {
    RankShare r;
    r.zero_stage = stage;
    r.param_bytes = f.param_bytes;
    r.grad_bytes = f.grad_bytes;
    r.optimizer_bytes = f.optimizer_bytes;
    r.half_weight_bytes = f.half_weight_bytes;
    r.update_elements = static_cast<size_t>(f.trainable);
    if (world > 1 && stage >= 1) {
      // Stages 1 and 2 shard by the gradient buckets, stage 3 by its units. Stage 3 gathers no weights after the
      // step: its all-gather buffers exist only while a checkpoint gathers the state (with the whole weights).
      const std::vector<int64_t>& cut = stage == 3 ? f.shard_units : f.grad_buckets;
      r.update_elements = chunk_sum(cut, world);
      r.optimizer_bytes = r.update_elements * state * element;
      if (stage < 3) r.gather_bytes = gather_elements(cut, world) * element;
    }
    if (world > 1 && stage == 2) r.grad_bytes = zero2_grads(f, world, device_buckets) * element;
    if (world > 1 && stage == 3) {
      // A unit's weights: its parameters that learn and its frozen ones, each padded to chunk · world.
      std::vector<size_t> units;
      for (size_t u = 0; u < f.shard_units.size(); ++u)
        units.push_back(padded(f.shard_units[u], world) + padded(f.shard_unit_frozen[u], world));
      std::sort(units.begin(), units.end(), std::greater<>());
      const size_t shards = (chunk_sum(f.shard_units, world) + chunk_sum(f.shard_unit_frozen, world)) * element;
      // In a pass: kResidentUnits whole, and on CPU ranks with dist.overlap the next one being gathered.
      r.units_in_pass = ZeroOptimizer::kResidentUnits + (f.overlap && !device_buckets ? 1 : 0);
      r.param_bytes = shards + sum_first(units, r.units_in_pass) * element;
      r.whole_weight_bytes = shards + sum_first(units, units.size()) * element;
      r.grad_bytes = zero3_grads(f, world, device_buckets) * element;
      r.half_weight_bytes = std::min(f.half_weight_bytes, zero3_half_bytes(f));
    }
    r.total_bytes = r.param_bytes + r.grad_bytes + r.optimizer_bytes + r.gather_bytes + r.half_weight_bytes + whole;
    r.fit = judge(r.total_bytes);
    out.push_back(std::move(r));
  }
  return out;
}

RankShare offload_share(const Footprint& f, const RankShare& stage, const std::function<MemoryFit(size_t)>& judge) {
  RankShare r = stage;
  r.offload = true;
  const auto state = static_cast<size_t>(f.optimizer_state_per_param);
  r.host_bytes = r.update_elements * (state + 2) * dtype_size(f.dtype);  // the state, the masters, the gradients
  r.total_bytes -= r.optimizer_bytes;
  r.optimizer_bytes = 0;
  // On the CPU the host is the device: the copies come on top of what it holds.
  if (!on_gpu(judge)) r.total_bytes += r.host_bytes;
  r.fit = judge(r.total_bytes);
  return r;
}

std::string rank_shares_report(const std::vector<RankShare>& shares, int64_t world, int configured_stage,
                               bool configured_offload) {
  std::string out = fmt::format("\nper rank at {} rank{} (data parallel; dist.zero stages side by side):\n", world,
                                world == 1 ? "" : "s");
  out += fmt::format("  {:<16}", "");
  for (const RankShare& r : shares)
    out += fmt::format(" {:>12}",
                       fmt::format("zero {}{}{}", r.zero_stage, r.offload ? "+off" : "",
                                   r.zero_stage == configured_stage && r.offload == configured_offload ? "*" : ""));
  out += "\n";
  auto row = [&](const char* what, size_t RankShare::*field) {
    out += fmt::format("  {:<16}", what);
    for (const RankShare& r : shares) out += fmt::format(" {:>12}", format_bytes(r.*field));
    out += "\n";
  };
  row("parameters", &RankShare::param_bytes);
  row("gradients", &RankShare::grad_bytes);
  row("optimizer state", &RankShare::optimizer_bytes);
  row("gather buffers", &RankShare::gather_bytes);
  if (std::any_of(shares.begin(), shares.end(), [](const RankShare& r) { return r.half_weight_bytes > 0; }))
    row("half weights", &RankShare::half_weight_bytes);
  row("total", &RankShare::total_bytes);
  const bool offloaded = std::any_of(shares.begin(), shares.end(), [](const RankShare& r) { return r.offload; });
  if (offloaded) row("host (offload)", &RankShare::host_bytes);
  out += fmt::format("  {:<16}", "fits");
  for (const RankShare& r : shares) out += fmt::format(" {:>12}", !r.fit.fits ? "unknown" : *r.fit.fits ? "yes" : "no");
  out += "\n";
  out += fmt::format("  (* dist.zero: {}{}, the configured stage)\n", configured_stage,
                     configured_offload ? " with dist.offload: optimizer" : "");
  if (offloaded)
    out +=
        "  (+off: with dist.offload: optimizer, the optimizer state, master weights and a gradient copy in host "
        "memory)\n";
  out += "  (gradients at zero 2 and 3: this rank's chunks and the buckets the backward pass holds whole at once)\n";
  for (const RankShare& r : shares)
    if (r.whole_weight_bytes > 0 && !r.offload)
      out += fmt::format(
          "  (parameters at zero 3: this rank's chunks of every unit, frozen weights too, the {} largest whole in a "
          "pass;\n"
          "   evaluation, checkpoints and the final weights make every unit whole for a moment: {} then, not above)\n",
          r.units_in_pass, format_bytes(r.whole_weight_bytes));
  if (!shares.empty()) {
    const MemoryFit& fit = shares.front().fit;
    out += fit.fits ? fmt::format("  (one rank on {}: {} {}; ranks sharing a host share its memory)\n", fit.device,
                                  format_bytes(fit.usable), fit.device == "cpu" ? "available" : "usable")
                    : fmt::format("  (fits on {}: unknown: {})\n", fit.device, fit.basis);
  }
  return out;
}

std::string fit_advice(const Footprint& f, int64_t world, const std::function<MemoryFit(size_t)>& judge,
                       const FootprintWith& footprint_with) {
  // What fits is said with the first stage that fits (stage 3 may hold the least, or stage 1 or 2 where the weights
  // are small beside the all-gather buffers and the units whole in a pass).
  auto best = [&](const Footprint& g, int64_t ranks) -> std::optional<int> {
    for (const RankShare& r : rank_shares(g, ranks, judge))
      if (r.fit.fits && *r.fit.fits) return r.zero_stage;
    return std::nullopt;
  };
  const std::vector<RankShare> now = rank_shares(f, world, judge);
  if (!now.front().fit.fits || best(f, world)) return "";  // fits, or unknown
  std::string out = "nothing fits; what would:\n";
  bool any = false;
  // blocks first (it recomputes less); all when blocks is refused or does not fit (it drops at least as much).
  for (const Recompute mode : {Recompute::blocks, Recompute::all}) {
    if (f.recompute != Recompute::none && mode <= f.recompute) continue;
    if (const std::optional<Footprint> g = footprint_with(mode, f.batch, f.accumulate)) {
      const std::optional<int> stage = best(*g, world);
      out += stage ? fmt::format("  train.recompute: {}, with zero {} ({} per rank)\n", to_string(mode), *stage,
                                 format_bytes(rank_shares(*g, world, judge)[static_cast<size_t>(*stage)].total_bytes))
                   : fmt::format("  train.recompute: {} alone does not ({} per rank at zero {})\n", to_string(mode),
                                 format_bytes(least(rank_shares(*g, world, judge)).total_bytes),
                                 least(rank_shares(*g, world, judge)).zero_stage);
      any = any || stage.has_value();
      if (stage) break;
    }
  }
  // The optimizer state on the host (dist.offload): what a GPU then holds, at the first stage where that fits (on
  // the CPU the host is the device, and offloading saves nothing).
  for (const RankShare& r : now) {
    const RankShare off = offload_share(f, r, judge);
    if (!off.fit.fits || !*off.fit.fits || off.total_bytes >= r.total_bytes) continue;
    out += fmt::format("  dist.offload: optimizer, with zero {} ({} per rank, and {} of host memory)\n", r.zero_stage,
                       format_bytes(off.total_bytes), format_bytes(off.host_bytes));
    any = true;
    break;
  }
  for (int64_t batch = f.batch, accumulate = f.accumulate; batch % 2 == 0;) {
    batch /= 2;
    accumulate *= 2;
    const std::optional<Footprint> g = footprint_with(f.recompute, batch, accumulate);
    if (!g) break;
    if (const std::optional<int> stage = best(*g, world)) {
      out += fmt::format(
          "  data.batch_size: {} with train.accumulate: {} (the same {} samples per step), with zero {} ({} per "
          "rank)\n",
          batch, accumulate, f.batch * f.accumulate, *stage,
          format_bytes(rank_shares(*g, world, judge)[static_cast<size_t>(*stage)].total_bytes));
      any = true;
      break;
    }
  }
  for (int64_t ranks = world * 2; ranks <= 4096; ranks *= 2) {
    if (const std::optional<int> stage = best(f, ranks)) {
      out += fmt::format("  {} ranks, with zero {} ({} per rank)\n", ranks, *stage,
                         format_bytes(rank_shares(f, ranks, judge)[static_cast<size_t>(*stage)].total_bytes));
      any = true;
      break;
    }
  }
  if (!any)
    out += fmt::format(
        "  none of recompute, offload, a smaller micro-batch or up to 4096 ranks: what every rank holds whole "
        "(activations, batch, buffers) is {} already\n",
        format_bytes(f.buffer_bytes + f.activation_bytes + f.batch_bytes));
  return out;
}

void add_rank_shares_json(JsonObject& out, const std::vector<RankShare>& shares, int64_t world, int configured_stage,
                          bool configured_offload) {
  auto n = [](size_t v) { return static_cast<int64_t>(v); };
  std::vector<JsonObject> stages;
  for (const RankShare& r : shares) {
    JsonObject s;
    s.add("stage", static_cast<int64_t>(r.zero_stage))
        .add("param_bytes", n(r.param_bytes))
        .add("grad_bytes", n(r.grad_bytes))
        .add("optimizer_bytes", n(r.optimizer_bytes))
        .add("gather_bytes", n(r.gather_bytes))
        .add("half_weight_bytes", n(r.half_weight_bytes))
        .add("per_rank_bytes", n(r.total_bytes));
    if (r.zero_stage == 3) s.add("whole_weight_bytes", n(r.whole_weight_bytes));
    if (r.offload) s.add_bool("offload", true).add("host_bytes", n(r.host_bytes));
    if (r.fit.fits)
      s.add_bool("fits", *r.fit.fits);
    else
      s.add_null("fits");
    stages.push_back(std::move(s));
  }
  // By its stage, not its place: a stage the shares lack is a failure here, never a read past them.
  const auto configured = std::find_if(shares.begin(), shares.end(), [&](const RankShare& r) {
    return r.zero_stage == configured_stage && r.offload == configured_offload;
  });
  GT_CHECK(configured != shares.end(), "dist.zero {} is not among the {} stages sized", configured_stage,
           shares.size());
  out.add("world_size", world)
      .add("zero_stage", static_cast<int64_t>(configured_stage))
      .add("per_rank_bytes", n(configured->total_bytes))
      .add("zero_stages", stages);
}

}  // namespace gt
