// Sizing a training step from shapes: per-layer FLOPs and memory, the totals, and the verdict for the device.
#include "train/footprint.h"

#include "core/json.h"
#include "data/dataset.h"
#include "graph/model.h"
#include "ops/cpu/bf16_gemm.h"
#include "ops/devices.h"
#include "optim/optimizer.h"
#include "parallel/grad_sync.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>

namespace gt {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

size_t bytes_of(int64_t numel, DType dtype) { return static_cast<size_t>(numel) * dtype_size(dtype); }

double gib(size_t bytes) { return static_cast<double>(bytes) / kGiB; }

// MemAvailable from /proc/meminfo in bytes: what the kernel estimates can be allocated without swapping.
std::optional<size_t> host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    size_t kib = 0;
    if (in >> kib) return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace

std::string activation_dtype(const Footprint& f) {
  if (!f.activation_storage) return std::string(dtype_name(f.dtype));
  return *f.activation_storage == HalfFormat::bf16 ? "bf16" : "fp16";
}

Footprint training_footprint(const Experiment& exp, const Model& model, const Dataset& train) {
  Footprint f;
  f.batch = exp.data.batch_size;
  f.accumulate = exp.train.accumulate;
  f.tokens_per_sample = train.tokens ? train.tokens->block_size() : 0;
  f.dtype = model.dtype();
  f.recompute = model.recompute();
  f.activation_storage = model.activation_storage();
  f.input = model.input_shape().batched(f.batch);
  const std::vector<Model::NodeBuffers> plan = model.buffer_plan(f.batch);
  const auto& nodes = model.nodes();
  // The layers' shared scratch (LayerContext::scratch), in the row of the first layer that needs all of it.
  const int64_t scratch = model.layer_scratch_numel(f.batch);
  bool scratch_counted = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const GraphNode& n = nodes[i];
    LayerFootprint r;
    r.name = n.name;
    r.type = n.type;
    r.output = n.out_shape.batched(f.batch);
    r.params = n.param_count;
    r.trainable = n.trainable;
    r.forward_flops = mul_sizes(n.layer->forward_flops(), f.batch, "FLOPs");  // check_batch bounds it
    // As Model::backward counts them for the profiler; nodes it skips (views, nothing learns before them) cost 0.
    const bool runs_backward = !n.layer->is_view() && n.needs_grad;
    r.backward_flops = runs_backward ? r.forward_flops * (n.trainable > 0 ? 2 : 1) : 0;
    r.param_bytes = bytes_of(n.param_count, f.dtype);
    r.buffer_bytes = bytes_of(n.layer->buffer_numel(), f.dtype);
    const Layer::Workspace kept = n.layer->workspace(f.batch, f.activation_storage.has_value());
    const bool holds_scratch =
        !scratch_counted && scratch > 0 && !n.layer->is_view() && n.layer->scratch_numel(f.batch) == scratch;
    scratch_counted = scratch_counted || holds_scratch;
    r.activation_bytes =
        bytes_of(plan[i].output + plan[i].gradient + plan[i].scratch + kept.wide + (holds_scratch ? scratch : 0),
                 f.dtype) +
        static_cast<size_t>(plan[i].half + kept.half) * sizeof(uint16_t);
    f.params += r.params;
    f.trainable += r.trainable;
    f.forward_flops += r.forward_flops;
    f.backward_flops += r.backward_flops;
    f.param_bytes += r.param_bytes;
    f.buffer_bytes += r.buffer_bytes;
    f.activation_bytes += r.activation_bytes;
    f.layers.push_back(std::move(r));
  }
  f.grad_bytes = bytes_of(f.trainable, f.dtype);  // every parameter that learns has a gradient of its own size
  std::vector<int64_t> per_node;
  for (const GraphNode& n : nodes) per_node.push_back(n.trainable);
  f.grad_buckets = bucket_sizes(per_node, exp.dist.bucket_mb);

  // The optimizer's state per parameter element, from the optimizer the config builds: momentum 1, Adam 2,
  // AMSGrad 3, plain SGD 0.
  Param probe{"probe", Tensor::zeros(Shape{1}, f.dtype), Tensor::zeros(Shape{1}, f.dtype)};
  const std::unique_ptr<Optimizer> opt = make_optimizer(exp.optimizer, {&probe});
  for (const auto& [name, t] : opt->state()) f.optimizer_state_per_param += t->numel();
  f.optimizer = to_string(exp.optimizer.type);
  f.optimizer_bytes = f.grad_bytes * static_cast<size_t>(f.optimizer_state_per_param);

  // The step's own tensors (trainer): x as f32, y as the data set stores targets, and the loss's ∂L/∂output.
  f.batch_bytes = bytes_of(train.input_shape().batched(f.batch).numel(), DType::f32) +
                  bytes_of(train.target_shape().batched(f.batch).numel(), train.target_dtype()) +
                  bytes_of(model.output_shape().batched(f.batch).numel(), f.dtype);
  // bf16/fp16: one copy of each weight a product reads, made once per step (f32 models only: f64 products are never
  // rounded) — on the CPU rounded f32 values (ops/precision.h), on CUDA 16-bit elements (ops/cuda/half_scratch.h),
  // except for bf16 on the CPU where the kernels round the weights while they pack them (the native bf16 kernel, and
  // our f32 kernels on the conversion path: ops/cpu/bf16_gemm.h's cpu_bf16_rounds_in_pack). CUDA's other operands go
  // through scratch freed when queued, the size of one operand at a time.
  f.precision = exp.train.precision;
  f.bf16_in_pack = f.precision == Precision::bf16 && model.device().is_cpu() && cpu::cpu_bf16_rounds_in_pack();
  f.on_cuda = model.device().is_cuda();
  if (half_format(f.precision) && f.dtype == DType::f32 && !f.bf16_in_pack)
    for (const GraphNode& n : nodes)
      f.half_weight_bytes += f.on_cuda ? n.layer->product_weight_numel() * 2  // bf16 and fp16: 2 bytes each
                                       : bytes_of(n.layer->product_weight_numel(), DType::f32);
  f.total_bytes = f.param_bytes + f.grad_bytes + f.optimizer_bytes + f.buffer_bytes + f.activation_bytes +
                  f.batch_bytes + f.half_weight_bytes;
  return f;
}

size_t cuda_memory_margin(size_t device_total) { return device_total / 20 + (size_t{512} << 20); }

MemoryFit judge_fit(size_t needed, Device device, size_t total) {
  MemoryFit m;
  m.device = device.str();
  m.needed = needed;
  m.total = total;
  if (device.is_cuda()) {
    const size_t margin = cuda_memory_margin(total);
    m.usable = total > margin ? total - margin : 0;
    m.basis = fmt::format("{:.2f} GiB less 5 % + 512 MiB for the CUDA context and library workspaces", gib(total));
  } else {
    m.usable = total;
    m.basis = "MemAvailable";
  }
  m.fits = needed <= m.usable;
  return m;
}

MemoryFit fit_on_this_machine(size_t needed, const std::string& requested) {
  std::string reason;
  Device device;
  try {
    device = resolve_device(requested, reason);
  } catch (const Error& e) {
    // Checking a config for a GPU machine on a laptop is fine: the verdict is unknown, and says why.
    MemoryFit m;
    m.device = requested;
    m.needed = needed;
    m.basis = e.what();
    return m;
  }
  if (device.is_cuda()) {
    for (const CudaDeviceInfo& d : query_cuda().devices)
      if (d.index == device.index) return judge_fit(needed, device, d.memory_total);
    MemoryFit m;
    m.device = device.str();
    m.needed = needed;
    m.basis = "the device reported no memory size";
    return m;
  }
  const std::optional<size_t> available = host_memory_available();
  if (!available) {
    MemoryFit m;
    m.device = device.str();
    m.needed = needed;
    m.basis = "/proc/meminfo has no MemAvailable";
    return m;
  }
  return judge_fit(needed, device, *available);
}

namespace {

// Stage 2's gradients on one rank (see RankShare): its chunk of every bucket, and the buckets whole at once — every
// bucket on a GPU, where GradSync's device buckets are the gradients' storage for the whole run (a bucket is not
// freed after its reduce-scatter there: the side stream may still read it), two on the host without accumulation.
size_t zero2_grad_bytes(const Footprint& f, int64_t world, bool device_buckets) {
  size_t chunks = 0;
  std::vector<size_t> whole;
  for (int64_t n : f.grad_buckets) {
    const size_t chunk = zero_chunk(static_cast<size_t>(n), static_cast<int>(world));
    chunks += chunk;
    whole.push_back(chunk * static_cast<size_t>(world));
  }
  std::sort(whole.begin(), whole.end(), std::greater<>());
  const size_t at_once = f.accumulate > 1 || device_buckets ? whole.size() : std::min<size_t>(2, whole.size());
  const size_t held = chunks + std::accumulate(whole.begin(), whole.begin() + static_cast<long>(at_once), size_t{0});
  return held * dtype_size(f.dtype);
}

}  // namespace

std::vector<RankShare> rank_shares(const Footprint& f, int64_t world, const std::function<MemoryFit(size_t)>& judge) {
  GT_CHECK(world >= 1, "rank_shares at {} ranks", world);
  // One shard of a flat buffer of every parameter element that learns, padded to a multiple of the ranks.
  const size_t shard = static_cast<size_t>((f.trainable + world - 1) / world) * dtype_size(f.dtype);
  const size_t whole = f.buffer_bytes + f.activation_bytes + f.batch_bytes + f.half_weight_bytes;
  const bool device_buckets = judge(0).device.rfind("cuda", 0) == 0;
  std::vector<RankShare> out;
  for (int stage = 0; stage <= 2; ++stage) {
    RankShare r;
    r.zero_stage = stage;
    r.param_bytes = f.param_bytes;
    r.grad_bytes = stage >= 2 && world > 1 ? zero2_grad_bytes(f, world, device_buckets) : f.grad_bytes;
    r.optimizer_bytes =
        stage >= 1 && world > 1 ? shard * static_cast<size_t>(f.optimizer_state_per_param) : f.optimizer_bytes;
    r.total_bytes = r.param_bytes + r.grad_bytes + r.optimizer_bytes + whole;
    r.fit = judge(r.total_bytes);
    out.push_back(std::move(r));
  }
  return out;
}

std::string rank_shares_report(const std::vector<RankShare>& shares, int64_t world, int configured_stage) {
  std::string out = fmt::format("\nper rank at {} rank{} (data parallel; dist.zero stages side by side):\n", world,
                                world == 1 ? "" : "s");
  out += fmt::format("  {:<16}", "");
  for (const RankShare& r : shares)
    out += fmt::format(" {:>12}", fmt::format("zero {}{}", r.zero_stage, r.zero_stage == configured_stage ? "*" : ""));
  out += "\n";
  auto row = [&](const char* what, size_t RankShare::*field) {
    out += fmt::format("  {:<16}", what);
    for (const RankShare& r : shares) out += fmt::format(" {:>12}", format_bytes(r.*field));
    out += "\n";
  };
  row("parameters", &RankShare::param_bytes);
  row("gradients", &RankShare::grad_bytes);
  row("optimizer state", &RankShare::optimizer_bytes);
  row("total", &RankShare::total_bytes);
  out += fmt::format("  {:<16}", "fits");
  for (const RankShare& r : shares) out += fmt::format(" {:>12}", !r.fit.fits ? "unknown" : *r.fit.fits ? "yes" : "no");
  out += "\n";
  out += fmt::format(
      "  (* dist.zero: {}, the configured stage; stage 2's gradients: this rank's chunks and the buckets the backward "
      "pass holds whole at once)\n",
      configured_stage);
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
  // The least a rank can hold under the stages here is stage 2's; what fits there is said with the stage.
  auto best = [&](const Footprint& g, int64_t ranks) -> std::optional<int> {
    for (const RankShare& r : rank_shares(g, ranks, judge))
      if (r.fit.fits && *r.fit.fits) return r.zero_stage;
    return std::nullopt;
  };
  const std::vector<RankShare> now = rank_shares(f, world, judge);
  if (!now.back().fit.fits || best(f, world)) return "";  // fits, or unknown
  std::string out = "nothing fits; what would:\n";
  bool any = false;
  // blocks first (it recomputes less); all when blocks is refused or does not fit (it drops at least as much).
  for (const Recompute mode : {Recompute::blocks, Recompute::all}) {
    if (f.recompute != Recompute::none && mode <= f.recompute) continue;
    if (const std::optional<Footprint> g = footprint_with(mode, f.batch, f.accumulate)) {
      const std::optional<int> stage = best(*g, world);
      out += stage ? fmt::format("  train.recompute: {}, with zero {} ({} per rank)\n", to_string(mode), *stage,
                                 format_bytes(rank_shares(*g, world, judge)[static_cast<size_t>(*stage)].total_bytes))
                   : fmt::format("  train.recompute: {} alone does not ({} per rank at zero 2)\n", to_string(mode),
                                 format_bytes(rank_shares(*g, world, judge).back().total_bytes));
      any = any || stage.has_value();
      if (stage) break;
    }
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
        "  none of recompute, a smaller micro-batch or up to 4096 ranks: what every rank holds whole (weights, "
        "activations, batch) is {} already\n",
        format_bytes(f.param_bytes + f.buffer_bytes + f.activation_bytes + f.batch_bytes));
  return out;
}

void add_rank_shares_json(JsonObject& out, const std::vector<RankShare>& shares, int64_t world, int configured_stage) {
  auto n = [](size_t v) { return static_cast<int64_t>(v); };
  std::vector<JsonObject> stages;
  for (const RankShare& r : shares) {
    JsonObject s;
    s.add("stage", static_cast<int64_t>(r.zero_stage))
        .add("param_bytes", n(r.param_bytes))
        .add("grad_bytes", n(r.grad_bytes))
        .add("optimizer_bytes", n(r.optimizer_bytes))
        .add("per_rank_bytes", n(r.total_bytes));
    if (r.fit.fits)
      s.add_bool("fits", *r.fit.fits);
    else
      s.add_null("fits");
    stages.push_back(std::move(s));
  }
  const RankShare& configured = shares.at(static_cast<size_t>(configured_stage));
  out.add("world_size", world)
      .add("zero_stage", static_cast<int64_t>(configured_stage))
      .add("per_rank_bytes", n(configured.total_bytes))
      .add("zero_stages", stages);
}

std::string format_bytes(size_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) v /= 1024.0, ++u;
  return fmt::format("{:.{}f} {}", v, v >= 100 ? 0 : v >= 10 ? 1 : 2, units[u]);
}

std::string fit_line(const MemoryFit& fit) {
  if (!fit.fits)
    return fmt::format("fits on {}: unknown (needs {:.2f} GiB; {})", fit.device, gib(fit.needed), fit.basis);
  if (fit.device == "cpu")  // MemAvailable: no margin to explain
    return fmt::format("fits on {}: {} (needs {:.2f} GiB of {:.2f} GiB available)", fit.device,
                       *fit.fits ? "yes" : "no", gib(fit.needed), gib(fit.usable));
  return fmt::format("fits on {}: {} (needs {:.2f} GiB of {:.2f} GiB usable: {})", fit.device, *fit.fits ? "yes" : "no",
                     gib(fit.needed), gib(fit.usable), fit.basis);
}

std::string footprint_report(const Footprint& f, const MemoryFit& fit, const std::string& edges) {
  // The first four columns are the layer table `gputrain check` has always printed; the columns widen for long
  // names, types and shapes.
  size_t wn = 12, wt = 10, ws = std::max<size_t>(18, f.input.str().size());
  for (const LayerFootprint& r : f.layers) {
    wn = std::max(wn, r.name.size());
    wt = std::max(wt, r.type.size());
    ws = std::max(ws, r.output.str().size());
  }
  std::string out = fmt::format("{:<{}} {:<{}} {:<{}} {:>12} {:>11} {:>11} {:>10} {:>11}\n", "layer", wn, "type", wt,
                                "output shape", ws, "parameters", "fwd MFLOP", "bwd MFLOP", "param mem", "activations");
  // The model input: its memory is the step's batch tensors.
  out += fmt::format("{:<{}} {:<{}} {}\n", "input", wn, "", wt, f.input.str());
  for (const LayerFootprint& r : f.layers)
    out += fmt::format("{:<{}} {:<{}} {:<{}} {:>12} {:>11.1f} {:>11.1f} {:>10} {:>11}\n", r.name, wn, r.type, wt,
                       r.output.str(), ws, r.params, static_cast<double>(r.forward_flops) * 1e-6,
                       static_cast<double>(r.backward_flops) * 1e-6, format_bytes(r.param_bytes),
                       format_bytes(r.activation_bytes));
  if (!edges.empty()) out += "edges (other than from the layer before):\n" + edges;
  out += fmt::format("total: {} layers, {} parameters ({:.2f} MB as {}), {:.3f} MFLOP forward per sample\n",
                     f.layers.size(), f.params, static_cast<double>(f.param_bytes) * 1e-6, dtype_name(f.dtype),
                     static_cast<double>(f.forward_flops) * 1e-6 / static_cast<double>(f.batch));
  if (f.trainable < f.params) {
    const size_t saved =
        bytes_of(f.params - f.trainable, f.dtype) * static_cast<size_t>(1 + f.optimizer_state_per_param);
    out += fmt::format(
        "trainable: {} of {} parameters ({:.2f} %); the frozen ones keep no gradient or optimizer "
        "state: {} less\n",
        f.trainable, f.params, 100.0 * static_cast<double>(f.trainable) / static_cast<double>(f.params),
        format_bytes(saved));
  }
  if (f.tokens_per_sample > 0) {
    // Training counts 3 × the forward (6N plus the attention), as the MFU of the step lines does.
    const double per_token = static_cast<double>(f.forward_flops) / static_cast<double>(f.batch * f.tokens_per_sample);
    out += fmt::format("per token: {:.2f} MFLOP forward, {:.2f} MFLOP to train (3 × forward: 6N plus attention)\n",
                       per_token * 1e-6, 3 * per_token * 1e-6);
  }
  out += fmt::format("\none training step at batch {}{}: {:.1f} MFLOP forward, {:.1f} MFLOP backward\n", f.batch,
                     f.accumulate > 1 ? fmt::format(" (per micro-batch; train.accumulate {})", f.accumulate) : "",
                     static_cast<double>(f.forward_flops) * 1e-6, static_cast<double>(f.backward_flops) * 1e-6);
  const std::string tensors =
      f.activation_storage
          ? fmt::format(
                "tensors {}, the outputs kept for backward in {}; train.precision {} rounds the products' "
                "operands",
                dtype_name(f.dtype), activation_dtype(f), to_string(f.precision))
      : half_format(f.precision)
          ? fmt::format("all tensors {}, activations included; train.precision {} rounds the products' operands",
                        dtype_name(f.dtype), to_string(f.precision))
          : fmt::format("all tensors {}, train.precision {}", dtype_name(f.dtype), to_string(f.precision));
  out += fmt::format("memory ({}){}:\n", tensors, f.accumulate > 1 ? "; micro-batches reuse the same buffers" : "");
  auto row = [&](const char* what, size_t bytes, const std::string& note) {
    out += fmt::format("  {:<16} {:>10}{}\n", what, format_bytes(bytes), note.empty() ? "" : "  " + note);
  };
  row("parameters", f.param_bytes, "");
  row("gradients", f.grad_bytes, "");
  row("optimizer state", f.optimizer_bytes,
      fmt::format("{}: {} state value{} per parameter", f.optimizer, f.optimizer_state_per_param,
                  f.optimizer_state_per_param == 1 ? "" : "s"));
  row("buffers", f.buffer_bytes, "batch-norm running statistics");
  row("activations", f.activation_bytes,
      f.recompute == Recompute::blocks
          ? "outputs, their gradients, what layers keep for backward (train.recompute: blocks: the outputs used only "
            "inside a block pass share one set of buffers)"
      : f.recompute == Recompute::all
          ? "outputs, their gradients, what layers keep for backward (train.recompute: all: the outputs used only "
            "inside a segment share one set of buffers)"
          : "outputs, their gradients, what layers keep for backward");
  row("batch", f.batch_bytes, "input, target and output gradient");
  if (half_format(f.precision))
    row("half weights", f.half_weight_bytes,
        f.bf16_in_pack ? std::string("none kept: the CPU's bf16 products read the f32 weights, rounded to bf16 as "
                                     "the kernels pack them")
        : f.on_cuda ? fmt::format("the weights products read, as {} copies made once per step", to_string(f.precision))
                    : fmt::format("the weights products read, rounded to {} once per step (kept as f32 on the CPU)",
                                  to_string(f.precision)));
  row("total", f.total_bytes, "");
  return out + fit_line(fit) + "\n";
}

JsonObject footprint_json(const Footprint& f, const MemoryFit& fit) {
  auto n = [](size_t v) { return static_cast<int64_t>(v); };
  std::vector<JsonObject> layers;
  for (const LayerFootprint& r : f.layers)
    layers.push_back(JsonObject()
                         .add("name", r.name)
                         .add("type", r.type)
                         .add("output_shape", r.output.str())
                         .add("params", r.params)
                         .add("forward_flops", r.forward_flops)
                         .add("backward_flops", r.backward_flops)
                         .add("param_bytes", n(r.param_bytes))
                         .add("buffer_bytes", n(r.buffer_bytes))
                         .add("activation_bytes", n(r.activation_bytes)));
  JsonObject totals;
  totals.add("params", f.params)
      .add("trainable_params", f.trainable)
      .add("forward_flops", f.forward_flops)
      .add("backward_flops", f.backward_flops)
      .add("param_bytes", n(f.param_bytes))
      .add("grad_bytes", n(f.grad_bytes))
      .add("optimizer_bytes", n(f.optimizer_bytes))
      .add("buffer_bytes", n(f.buffer_bytes))
      .add("activation_bytes", n(f.activation_bytes))
      .add("batch_bytes", n(f.batch_bytes))
      .add("half_weight_bytes", n(f.half_weight_bytes))
      .add("total_bytes", n(f.total_bytes));
  JsonObject out;
  out.add("batch", f.batch)
      .add("accumulate", f.accumulate)
      .add("dtype", std::string(dtype_name(f.dtype)))
      .add("optimizer", f.optimizer)
      .add("optimizer_state_per_param", f.optimizer_state_per_param)
      .add("precision", to_string(f.precision))
      .add("activation_dtype", activation_dtype(f))
      .add("layers", layers)
      .add("totals", totals)
      .add("device", fit.device);
  if (f.tokens_per_sample > 0)
    out.add("train_flops_per_token",
            3 * static_cast<double>(f.forward_flops) / static_cast<double>(f.batch * f.tokens_per_sample));
  if (fit.fits)
    out.add_bool("fits", *fit.fits).add("usable_bytes", n(fit.usable)).add("device_bytes", n(fit.total));
  else
    out.add_null("fits").add_null("usable_bytes").add_null("device_bytes");
  return out.add("needed_bytes", n(fit.needed)).add("fit_basis", fit.basis);
}

}  // namespace gt
