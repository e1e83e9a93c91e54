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
#include <charconv>
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

// The units whose gradient buckets a stage-3 backward holds whole together (GradSync with chunks, without overlap):
// a node's bucket from the node's grad-begin hook to the reduce-scatter after its unit's last node; a tied layer
// begins its owner's bucket before its own backward (Model::backward), which stays whole until the owner's.
std::vector<std::vector<size_t>> grads_whole_together(const Model& model, const std::vector<int>& unit, size_t units) {
  const auto& nodes = model.nodes();
  std::vector<size_t> nodes_in(units, 0), done(units, 0);
  for (int u : unit)
    if (u >= 0) ++nodes_in[static_cast<size_t>(u)];
  std::vector<size_t> whole;
  std::vector<std::vector<size_t>> out;
  auto begin = [&](int u) {
    if (u >= 0 && std::find(whole.begin(), whole.end(), static_cast<size_t>(u)) == whole.end())
      whole.push_back(static_cast<size_t>(u));
  };
  for (size_t i = nodes.size(); i-- > 0;) {
    begin(unit[i]);
    if (nodes[i].tied_to >= 0) begin(unit[static_cast<size_t>(nodes[i].tied_to)]);
    if (!whole.empty()) out.push_back(whole);
    if (unit[i] < 0) continue;
    const auto u = static_cast<size_t>(unit[i]);
    if (++done[u] == nodes_in[u]) std::erase(whole, u);
  }
  return out;
}

}  // namespace

std::string activation_dtype(const Footprint& f) {
  if (is_half(f.activation_dtype)) return f.activation_dtype == DType::bf16 ? "bf16" : "fp16";
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
  f.activation_dtype = model.activation_dtype();
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
    const Layer::Workspace kept =
        n.layer->workspace(f.batch, f.activation_storage.has_value() || is_half(f.activation_dtype));
    const bool holds_scratch =
        !scratch_counted && scratch > 0 && !n.layer->is_view() && n.layer->scratch_numel(f.batch) == scratch;
    scratch_counted = scratch_counted || holds_scratch;
    r.activation_bytes = bytes_of(plan[i].output + plan[i].gradient + plan[i].scratch, plan[i].dtype) +
                         bytes_of(kept.wide + (holds_scratch ? scratch : 0), f.dtype) +
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
  std::vector<int64_t> per_node, all_per_node;
  std::vector<int> blocks;
  for (const GraphNode& n : nodes) {
    per_node.push_back(n.trainable);
    all_per_node.push_back(n.param_count);
    blocks.push_back(exp.dist.shard_unit == "block" ? n.block : -1);
  }
  f.grad_buckets = bucket_sizes(per_node, exp.dist.bucket_mb);
  // dist.zero 3 cuts its units over every parameter, frozen ones too, as train/setup.cpp's zero_plan does; a node
  // whose parameters are all frozen begins no gradient bucket.
  const std::vector<int> unit = node_units(all_per_node, blocks, exp.dist.bucket_mb);
  const auto units = static_cast<size_t>(std::max(0, *std::max_element(unit.begin(), unit.end()) + 1));
  f.shard_units.assign(units, 0);
  f.shard_unit_frozen.assign(units, 0);
  std::vector<int> grad_unit(nodes.size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (unit[i] < 0) continue;
    f.shard_units[static_cast<size_t>(unit[i])] += nodes[i].trainable;
    f.shard_unit_frozen[static_cast<size_t>(unit[i])] += nodes[i].param_count - nodes[i].trainable;
    if (nodes[i].trainable > 0) grad_unit[i] = unit[i];
  }
  f.shard_unit_grads_whole = grads_whole_together(model, grad_unit, units);
  std::vector<int> owners;
  for (const GraphNode& n : nodes)
    if (n.tied_to >= 0 && nodes[static_cast<size_t>(n.tied_to)].trainable > 0) owners.push_back(n.tied_to);
  std::sort(owners.begin(), owners.end());
  f.tied_owners = std::unique(owners.begin(), owners.end()) - owners.begin();
  f.overlap = exp.dist.overlap;

  // The optimizer's state per parameter element, from the optimizer the config builds: momentum 1, Adam 2,
  // AMSGrad 3, plain SGD 0.
  Param probe{"probe", Tensor::zeros(Shape{1}, f.dtype), Tensor::zeros(Shape{1}, f.dtype)};
  const std::unique_ptr<Optimizer> opt = make_optimizer(exp.optimizer, {&probe});
  for (const auto& [name, t] : opt->state()) f.optimizer_state_per_param += t->numel();
  f.optimizer = to_string(exp.optimizer.type);
  f.optimizer_bytes = f.grad_bytes * static_cast<size_t>(f.optimizer_state_per_param);

  // The step's own tensors (trainer): x as f32, y as the data set stores targets, and the loss's ∂L/∂output unless
  // the loss writes it over the output (Model::loss_writes_over_output).
  f.loss_in_place = model.loss_writes_over_output();
  f.batch_bytes = bytes_of(train.input_shape().batched(f.batch).numel(), DType::f32) +
                  bytes_of(train.target_shape().batched(f.batch).numel(), train.target_dtype()) +
                  (f.loss_in_place ? 0 : bytes_of(model.output_shape().batched(f.batch).numel(), f.dtype));
  // bf16/fp16: one copy of each weight a product reads, made once per step (f32 models only: f64 products are never
  // rounded) — on the CPU rounded f32 values (ops/precision.h), on CUDA 16-bit elements (ops/cuda/half_scratch.h),
  // except for bf16 on the CPU where the kernels round the weights while they pack them (the native bf16 kernel, and
  // our f32 kernels on the conversion path: ops/cpu/bf16_gemm.h's cpu_bf16_rounds_in_pack). CUDA's other operands go
  // through scratch freed when queued, the size of one operand at a time.
  f.precision = exp.train.precision;
  f.bf16_in_pack = f.precision == Precision::bf16 && model.device().is_cpu() && cpu::cpu_bf16_rounds_in_pack();
  f.on_cuda = model.device().is_cuda();
  // Stage 3 keeps the copies of a unit's weights apart from those of the weights in no unit (frozen ones, whole on
  // every rank; a layer with a frozen weight is counted there as a whole, the weight its products read being frozen).
  f.shard_unit_half_bytes.assign(f.shard_units.size(), 0);
  if (half_format(f.precision) && f.dtype == DType::f32 && !f.bf16_in_pack)
    for (size_t i = 0; i < nodes.size(); ++i) {
      // On a GPU with 16-bit activations the biases of the products' epilogues get 16-bit copies as well.
      const int64_t numel = nodes[i].layer->product_weight_numel() +
                            (f.on_cuda && is_half(f.activation_dtype) ? nodes[i].layer->product_bias_numel() : 0);
      const size_t bytes = f.on_cuda ? static_cast<size_t>(numel) * 2  // bf16 and fp16: 2 bytes each
                                     : bytes_of(numel, DType::f32);
      f.half_weight_bytes += bytes;
      const int u = unit[nodes[i].tied_to >= 0 ? static_cast<size_t>(nodes[i].tied_to) : i];
      if (u >= 0)
        f.shard_unit_half_bytes[static_cast<size_t>(u)] += bytes;
      else
        f.unsharded_half_bytes += bytes;
    }
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

Device planned_device(const std::string& requested) {
  if (requested == "auto") {
    std::string reason;
    return resolve_device(requested, reason);
  }
  if (requested.rfind("cuda", 0) != 0) return Device::cpu();
  int index = 0;
  if (requested.size() > 5) std::from_chars(requested.data() + 5, requested.data() + requested.size(), index);
  return Device::cuda(index);
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
      is_half(f.activation_dtype)
          ? fmt::format("parameters {}, the layers' outputs and their gradients in {}; train.precision {}",
                        dtype_name(f.dtype), activation_dtype(f), to_string(f.precision))
      : f.activation_storage
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
  row("batch", f.batch_bytes,
      f.loss_in_place ? "input and target (the loss's gradient overwrites the output)"
                      : "input, target and output gradient");
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
      .add_bool("loss_in_place", f.loss_in_place)
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
