// The step: micro-batches through forward, loss and backward, gradients over the ranks, the gated update, and the
// verdict the host reads back.
#include "train/step.h"

#include "graph/model.h"
#include "log/logging.h"
#include "ops/math.h"
#include "ops/optim.h"
#include "ops/precision.h"
#include "optim/optimizer.h"
#include "parallel/zero.h"
#include "profile/profiler.h"
#include "train/loss.h"
#include "train/setup.h"
#include "train/signals.h"

#include <algorithm>
#include <cmath>

namespace gt {

StepOutcome nonfinite_outcome(NonFinitePolicy mode, int64_t max_skips, int64_t& skips_in_row, int64_t& rollbacks) {
  if (mode == NonFinitePolicy::skip && ++skips_in_row <= max_skips) return StepOutcome::skipped;
  if (mode == NonFinitePolicy::rollback && ++rollbacks <= max_skips) return StepOutcome::rolled_back;
  return StepOutcome::diverged;
}

bool StepReading::finite() const { return std::isfinite(loss_sum) && std::isfinite(grad_sq); }

DeferredVerdict::DeferredVerdict(std::vector<std::string> param_names)
    : m_names(std::move(param_names)),
      m_stats(Tensor::empty_pinned(Shape{kStepStats}, DType::f64)),
      m_per_param(Tensor::empty_pinned(Shape{std::max<int64_t>(1, static_cast<int64_t>(m_names.size()))}, DType::f64)) {
}

void DeferredVerdict::queue(const Tensor& stats, const Tensor& per_param, Device device, int64_t step,
                            int64_t samples) {
  m_stats.copy_from_async(stats);
  m_per_param.copy_from_async(per_param);
  m_ready.record(device);
  m_open = true;
  m_step = step;
  m_samples = samples;
}

std::optional<StepReading> DeferredVerdict::take() {
  if (!m_open) return std::nullopt;
  m_open = false;
  m_ready.wait();
  const double* st = m_stats.data<double>();
  StepReading r;
  r.step = m_step;
  r.samples = m_samples;
  r.loss_sum = st[kLossSum];
  r.grad_sq = st[kGradSq];
  if (r.finite()) return r;
  r.first_nonfinite = "none (the loss itself)";
  for (size_t i = 0; i < m_names.size(); ++i)
    if (!std::isfinite(m_per_param.data<double>()[i])) {
      r.first_nonfinite = m_names[i];
      break;
    }
  return r;
}

namespace {

std::vector<std::string> param_names(Model& model) {
  std::vector<std::string> names;
  for (const auto& [name, param] : model.named_params()) names.push_back(name);
  return names;
}

// Stands in for the profiler while a step is captured: the span open last is the operation being queued, which is
// what a capture failure names. (Spans cost nothing on the device: a capture records no host timing.)
class CaptureSpans final : public SpanTimer {
 public:
  bool enabled() const override { return true; }
  SpanStart begin_span(const std::string& name) override {
    m_current = name;
    return {};
  }
  void end_span(const SpanStart&, const std::string& name, const std::string& type, const char* category,
                int64_t) override {
    m_current = fmt::format("the {} of {} ({})", category, name, type);
  }
  /// "layers.3", or "the forward of layers.3 (linear)" once it has been queued whole.
  const std::string& current() const { return m_current; }
  void set(std::string what) { m_current = std::move(what); }

 private:
  std::string m_current = "the start of the step";
};

}  // namespace

StepLoop::StepLoop(const Experiment& exp, RunSetup& setup, const StepPlan& plan, Profiler& profiler)
    : m_model(setup.model),
      m_optimizer(*setup.optimizer),
      m_comm(*setup.comm),
      m_loss(exp.loss),
      m_device(setup.device),
      m_profiler(profiler),
      m_world(setup.world),
      m_accumulate(plan.accumulate),
      m_precision(exp.train.precision),
      m_scaling(exp.train.loss_scaling()),
      m_scale_hyper(exp.train.loss_scale.hyper),
      m_nccl(setup.nccl.get()),
      m_stager(setup.train(), plan.batch, setup.device,
               {.workers = static_cast<int>(exp.data.workers),
                .prefetch = static_cast<int>(exp.data.prefetch),
                .pinned = exp.data.pin_memory != AutoSwitch::off,
                .resident = exp.data.device_resident == AutoSwitch::on    ? Residency::on
                            : exp.data.device_resident == AutoSwitch::off ? Residency::off
                                                                          : Residency::automatic,
                .augmented = exp.data.augment.any()}),
      m_verdict(param_names(setup.model)) {
  // On GPUs the gradients, the initial state and the step's device-side sums travel through NCCL (RunSetup made it),
  // the host's numbers through the host communicator.
  Communicator& device_comm = m_nccl ? *m_nccl : m_comm;
  // Every replica starts from rank 0's state (the same seed gives the same weights, but a resumed or hand-edited
  // state must not diverge silently).
  if (m_world > 1) {
    for (auto& [name, t] : m_model.state_tensors())
      device_comm.broadcast(t->raw(), t->bytes(), 0, "the initial parameters");
    // (A sharded optimizer's ranks hold different shards, each taken from the one checkpoint rank 0 chose.)
    if (!m_optimizer.sharded())
      for (auto& [name, t] : m_optimizer.state()) device_comm.broadcast(t->raw(), t->bytes(), 0, "the optimizer state");
  }
  if (m_world > 1) {
    // dist.zero 2: the gradients are reduce-scattered into the optimizer's chunks, and exist whole only in backward.
    m_zero = dynamic_cast<ZeroOptimizer*>(&m_optimizer);
    if (m_zero && m_zero->stage() >= 2) m_grad_chunks = m_zero->grad_chunks();
    // dist.zero 3 on the host gathers each unit of weights on the communication thread, queued ahead of the layers
    // that read it, in one order with the reduce-scatters (set_prefetch); without overlap both run on the training
    // thread. (On device buffers both queue on streams from the training thread, in one order already.)
    const bool stage3 = m_zero && m_zero->stage() >= 3;
    const bool overlap = exp.dist.overlap;
    m_grad_sync.emplace(
        device_comm, m_zero ? zero_plan(m_model, exp.dist) : plan_buckets(m_model.params_by_node(), exp.dist.bucket_mb),
        overlap, m_grad_chunks, m_accumulate);
    if (m_optimizer.sharded())
      spdlog::info("dist.zero {}: optimizer state sharded over {} ranks{}", exp.dist.zero, m_world,
                   stage3               ? ", gradients reduce-scattered, weights gathered unit by unit"
                   : exp.dist.zero >= 2 ? ", gradients reduce-scattered"
                                        : "");
    bool blocks = false;  // dist.zero 3 cuts at the blocks where there are any (zero_plan)
    for (const GraphNode& n : m_model.nodes()) blocks = blocks || n.block >= 0;
    spdlog::info(
        "gradients: {:.2f} MB {} per step in {} {}, {}", static_cast<double>(m_grad_sync->bytes_per_step()) / 1e6,
        m_optimizer.sharded() && exp.dist.zero >= 2 ? "reduce-scattered" : "all-reduced", m_grad_sync->buckets(),
        stage3 && blocks && exp.dist.shard_unit == "block"
            ? "unit(s): each pass of a repeat: block, and the layers between"
            : fmt::format("{} of up to {} MB", stage3 ? "unit(s)" : "bucket(s)", exp.dist.bucket_mb),
        overlap && stage3 ? "overlapping backward, each unit's weights gathered ahead of its layers"
        : overlap         ? "overlapping backward"
        : stage3          ? "as backward completes them, each unit's weights gathered when its layers need them"
                          : "after backward (dist.overlap: false)");
    m_grad_sync->set_profiler(&profiler);
    if (stage3) m_zero->set_prefetch(&*m_grad_sync);
  }
  // The initial weights are the same on every rank now: dist.zero 3 keeps its shard of them alone, dist.offload its
  // host masters of them.
  m_optimizer.take_weights();
  const Dataset& train = setup.train();
  m_x = Tensor::empty(train.input_shape().batched(plan.batch), DType::f32, m_device);
  m_y = Tensor::empty(train.target_shape().batched(plan.batch), train.target_dtype(), m_device);
  // The loss's gradient over the logits themselves where the head's backward never reads them (the fused
  // classifier: cross_entropy's rows each finish their loss before their gradient overwrites them, ops/loss.h).
  m_dout = m_model.output_buffer();
  if (!m_dout.defined()) m_dout = Tensor::empty(m_model.output_shape().batched(plan.batch), DType::f32, m_device);
  m_stats = Tensor::zeros(Shape{kStepStats}, DType::f64, m_device);
  m_grad_sq = m_stats.slice0(kGradSq, 1);
  m_window = Tensor::zeros(Shape{3}, DType::f64, m_device);
  const int64_t n_params = std::max<int64_t>(1, static_cast<int64_t>(m_model.named_params().size()));
  m_param_sq = Tensor::zeros(Shape{n_params}, DType::f64, m_device);
  m_scale_state = Tensor::zeros(Shape{kLossScaleState}, DType::f64, m_device);
  if (m_scaling)
    for (auto& [name, param] : m_model.named_params()) m_params.push_back(param);
  set_window(setup.progress);
  set_scaler(setup.progress);
  if (exp.train.cuda_graphs) {  // (RunSetup has refused what cannot be captured)
    m_graph = std::make_unique<StepGraph>(m_device);
    m_optimizer.hyper_on_device();  // the warm-up steps too: the replayed update reads them the same way
    spdlog::info(
        "train.cuda_graphs: the step is captured into one CUDA graph after {} warm-up steps and replayed; "
        "the last partial batch of each epoch is dropped",
        kGraphWarmup);
  }
  // Last, so that a constructor that throws leaves no hook into this object behind.
  if (m_grad_sync) m_model.set_grad_ready_hook([this](size_t node) { m_grad_sync->node_done(node); });
  if (!m_grad_chunks.empty()) m_model.set_grad_begin_hook([this](size_t node) { m_grad_sync->node_begin(node); });
  if (m_zero && m_zero->stage() >= 3) m_model.set_param_use_hook([this](size_t node) { m_zero->use_node(node); });
}

StepLoop::~StepLoop() {
  m_model.set_grad_ready_hook(nullptr);
  m_model.set_grad_begin_hook(nullptr);
  m_model.set_param_use_hook(nullptr);
}

int64_t StepLoop::forward_backward(Loader& loader, int64_t step, int64_t micros) {
  m_stats.zero_();
  // The run's product precision holds for the forward and backward passes only: the loss between them multiplies no
  // matrices, and the gradient sums, the norm and the update after them stay fp32 whatever it is.
  const ProductPrecisionScope autocast(m_precision);
  int64_t samples = 0;
  for (int64_t k = 0; k < micros; ++k) {
    const int64_t n = m_stager.next(loader, m_x, m_y, &m_profiler);
    micro_step(step, k, n, micros, &m_profiler);
    samples += n;
  }
  if (m_grad_sync) m_grad_sync->finish();
  if (m_zero) m_zero->release_values();  // dist.zero 3: the units still whole from the backward pass
  return samples;
}

void StepLoop::micro_step(int64_t step, int64_t k, int64_t n, int64_t micros, SpanTimer* timer) {
  static const std::string kLoss = "loss";
  const Tensor xb = m_x.narrow0(n), yb = m_y.narrow0(n);
  Tensor db = m_dout.narrow0(n);
  // Dropout masks are keyed by the micro-batch, so the micro-batches of one step draw different masks.
  const LayerContext ctx{
      .training = true, .accumulate_grads = k > 0, .step = static_cast<uint64_t>(step * m_accumulate + k)};
  const Tensor& out = m_model.forward(xb, ctx);
  {
    SpanScope scope(timer, kLoss, to_string(m_loss.type), "forward+backward");
    compute_loss(m_loss, out, yb, 1.0 / static_cast<double>(n * micros), db, m_stats);
    // The loss (and so every gradient) × the scale; the statistics keep the unscaled loss.
    if (m_scaling) ops::scale_by(db, m_scale_state.slice0(kScale, 1));
  }
  if (m_grad_sync && k == micros - 1) m_grad_sync->arm();  // earlier micro-batches accumulate locally
  m_model.backward(db, ctx);
}

int64_t StepLoop::stage_batch(Loader& loader) {
  const int64_t n = m_stager.next(loader, m_x, m_y, &m_profiler);
  // plan_steps ends each epoch before its partial batch: the graph's shapes are the full batch's.
  GT_CHECK(n == m_x.shape()[0], "a graph step got a batch of {} samples, not {}", n, m_x.shape()[0]);
  return n;
}

void StepLoop::graph_step(std::span<const double> lrs, double max_norm, int64_t step, int64_t samples) {
  if (!m_graph->ready()) {
    capture_step(lrs, max_norm, step, samples);
  } else {
    m_optimizer.stage_step(lrs);  // the hyperparameters the replayed update reads, queued before it
    m_graph->launch();
  }
  ++m_steps_run;
}

void StepLoop::capture_step(std::span<const double> lrs, double max_norm, int64_t step, int64_t samples) {
  // Before the capture: the update's hyperparameters (the capture records the update that reads them).
  m_optimizer.stage_hyper(lrs);
  CaptureSpans spans;
  m_graph->begin_capture();
  m_model.set_profiler(&spans);
  m_optimizer.set_capturing(true);
  try {
    m_stats.zero_();
    {
      const ProductPrecisionScope autocast(m_precision);
      micro_step(step, 0, samples, 1, &spans);
    }
    spans.set("the gradient norm");
    queue_grad_norm();
    spans.set("the optimizer update");
    m_optimizer.step(lrs, m_stats, max_norm);
    spans.set("the log window's sums");
    ops::accumulate_step(m_stats, m_window);
    spans.set("the loss scaler's update");
    if (m_scaling) ops::update_loss_scale(m_stats, m_scale_state, m_scale_hyper);
  } catch (const std::exception& e) {
    m_graph->abandon_capture();
    m_optimizer.set_capturing(false);
    m_model.set_profiler(&m_profiler);
    throw Error(fmt::format("train.cuda_graphs: capturing step {} failed in {}: {}; run with cuda_graphs: false",
                            step + 1, spans.current(), e.what()));
  }
  m_optimizer.set_capturing(false);
  m_model.set_profiler(&m_profiler);
  m_graph->end_capture(spans.current());
  m_graph->launch();  // the capture ran nothing: this is the step
  spdlog::info("train.cuda_graphs: step {} captured; the steps after it replay the graph", step + 1);
}

void StepLoop::reset_graph() {
  if (!m_graph) return;
  m_graph->reset();
  m_steps_run = 0;
}

RankSums StepLoop::sum_over_ranks(int64_t samples) {
  if (m_world == 1) return {samples, false};
  if (m_nccl) {  // the global batch's sums stay on the device; the host's numbers go by host
    m_nccl->allreduce_sum(m_stats.data<double>(), kGradSq, "the step's loss");  // slots before the gradient norm
    double shared[2] = {static_cast<double>(samples), stop_requested() ? 1.0 : 0.0};
    m_comm.allreduce_sum(shared, 2, "the step's sample count and stop flag");
    return {static_cast<int64_t>(shared[0]), shared[1] > 0};
  }
  // (CPU tensors) the global batch's sums, and whether any rank was asked to stop
  double* st = m_stats.data<double>();
  double shared[4] = {st[kLossSum], st[kHits], static_cast<double>(samples), stop_requested() ? 1.0 : 0.0};
  m_comm.allreduce_sum(shared, 4, "the step's loss and stop flag");
  st[kLossSum] = shared[0];
  st[kHits] = shared[1];
  return {static_cast<int64_t>(shared[2]), shared[3] > 0};
}

void StepLoop::queue_grad_norm() {
  // Unscaled before anything reads them: the norm, the clipping and the update see the true gradients, and an
  // overflow (Inf or NaN in a scaled gradient) stays one, so the optimizer's gate skips the step.
  if (m_scaling) {
    const Tensor inv = m_scale_state.slice0(kInvScale, 1);
    if (!m_grad_chunks.empty())  // dist.zero 2: this rank's chunks are all the gradients it holds now
      for (Tensor& chunk : m_grad_chunks) ops::scale_by(chunk, inv);
    else
      for (Param* param : m_params) ops::scale_by(param->grad, inv);
  }
  m_param_sq.zero_();
  m_optimizer.grad_norm_sq(m_grad_sq, m_param_sq);
}

void StepLoop::update(std::span<const double> lrs, double max_norm, int64_t step, int64_t samples) {
  ++m_steps_run;
  m_optimizer.step(lrs, m_stats, max_norm);
  ops::accumulate_step(m_stats, m_window);
  if (m_scaling) ops::update_loss_scale(m_stats, m_scale_state, m_scale_hyper);
  m_verdict.queue(m_stats, m_param_sq, m_device, step, samples);
}

void StepLoop::set_window(const TrainProgress& p) {
  Tensor h = Tensor::zeros(Shape{3}, DType::f64);
  h.data<double>()[0] = p.window_loss;
  h.data<double>()[1] = p.window_hits;
  m_window.copy_from(h);
}

void StepLoop::set_scaler(const TrainProgress& p) {
  if (!m_scaling) return;
  Tensor h = Tensor::zeros(Shape{kLossScaleState}, DType::f64);
  double* s = h.data<double>();
  s[kScale] = p.loss_scale;
  s[kInvScale] = 1.0 / p.loss_scale;
  s[kGrowthTracker] = static_cast<double>(p.scale_growth_tracker);
  m_scale_state.copy_from(h);
}

void StepLoop::read_window(TrainProgress& p) {
  Tensor h = Tensor::empty(Shape{3}, DType::f64);
  h.copy_from(m_window);
  p.window_loss = h.data<double>()[0];
  p.window_hits = h.data<double>()[1];
}

void StepLoop::log_allreduce_cost(int64_t steps) const {
  // (NCCL's all-reduces run on a side stream the host never waits on: nothing to time.)
  if (!m_grad_sync || m_nccl || steps <= 0) return;
  spdlog::info(
      "all-reduce: {:.1f} ms per step, {:.0f}% of it hidden behind backward",
      1e3 * m_grad_sync->comm_seconds() / static_cast<double>(steps),
      std::max(0.0, 100.0 * (1.0 - m_grad_sync->exposed_seconds() / std::max(m_grad_sync->comm_seconds(), 1e-12))));
}

}  // namespace gt
