// The training loop: epochs of optimizer steps, each followed by the hooks that are due, driving the parts of a run
// (setup.h, step.h, evaluation.h, hooks.h); and train_worker, which builds one worker's run (placement.cpp places
// the workers).
#include "train/trainer.h"

#include "core/atomic_file.h"
#include "core/backend.h"
#include "core/json.h"
#include "graph/model.h"
#include "log/logging.h"
#include "log/progress.h"
#include "log/report.h"
#include "ops/devices.h"
#include "optim/optimizer.h"
#include "parallel/comm.h"
#include "parallel/workers.h"
#include "parallel/zero.h"
#include "profile/profiler.h"
#include "train/evaluation.h"
#include "train/hooks.h"
#include "train/setup.h"
#include "train/signals.h"
#include "train/step.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

namespace gt {
namespace fs = std::filesystem;

namespace {

// The parts of one worker's run that the loop drives, built in this order by train_worker.
struct RunParts {
  RunSetup& setup;
  RunSummary& summary;
  RunReporter& reporter;
  CheckpointHook& checkpoints;
  Loader& loader;
  const StepPlan& plan;
  StepLoop& step;
  Profiler& profiler;
  bool threaded;  ///< one of several worker threads of a process (sharing its memory counters)
};

// How an epoch's steps ended: every one done (or the run's last), a rollback to redo them from, or the run's end.
enum class EpochEnd { done, rolled_back, stopped };

// A step as the loop goes on from it: its outcome, when the host knows it, and its learning rate.
struct StepDone {
  StepOutcome outcome = StepOutcome::ok;
  double lr = 0;
};

// One worker's loop over epochs and steps, and what it does between steps and at the end.
class TrainLoop {
 public:
  TrainLoop(const Experiment& exp, const RunParts& parts, bool progress_bar, RunClock::time_point wall_start)
      : m_exp(exp),
        m_setup(parts.setup),
        m_p(parts.setup.progress),
        m_sum(parts.summary),
        m_reporter(parts.reporter),
        m_checkpoints(parts.checkpoints),
        m_loader(parts.loader),
        m_plan(parts.plan),
        m_step(parts.step),
        m_profiler(parts.profiler),
        m_threaded(parts.threaded),
        m_gpu(parts.setup.device.is_cuda()),
        m_wall_start(wall_start),
        m_clock(parts.setup.progress),
        m_bar(progress_bar, parts.plan, m_clock, parts.reporter.monitor(), wall_start),
        m_evaluator(exp, parts.setup.model, parts.setup.test(), parts.step.x(), parts.step.y(), *parts.setup.comm) {}

  RunSummary run();

 private:
  EpochEnd run_epoch();
  StepDone step();
  void after_step(const StepDone& done, bool last);
  bool stop_after_step();
  bool end_epoch();
  StepOutcome resolve();
  bool overflow_skip(const StepReading& r);
  void roll_back(const std::string& what, int64_t from_step);
  void diverge(const std::string& what, int64_t step);
  double close_window();
  void log_window(const StepDone& done);
  void note_data_wait(double wait_s, double window_s, int64_t steps);
  void save_checkpoint();
  RunSummary finish();

  const Experiment& m_exp;
  RunSetup& m_setup;
  TrainProgress& m_p;
  RunSummary& m_sum;
  RunReporter& m_reporter;
  CheckpointHook& m_checkpoints;
  Loader& m_loader;
  const StepPlan& m_plan;
  StepLoop& m_step;
  Profiler& m_profiler;
  bool m_threaded, m_gpu;
  StepPeakWindow m_peaks;  ///< the host tensors' peak over the steps (summary.json's memory)
  RunClock::time_point m_wall_start;
  TrainClock m_clock;
  ProgressBar m_bar;
  Evaluator m_evaluator;
  bool m_any_stop = false;    ///< several ranks: some rank was asked to stop (learnt with the step's sums)
  int64_t m_wait_steps = 0;   ///< steps since the last log window (the data wait's denominator)
  bool m_wait_noted = false;  ///< the data-wait line is logged once a run
  /// Wall seconds since the last log window in evaluations and in checkpoint writes: outside the training clock,
  /// named in the next train row so that the rows' times add up to elapsed_s.
  double m_eval_s = 0, m_checkpoint_s = 0;
  void evaluate();
};

RunSummary TrainLoop::run() {
  if (m_exp.train.nonfinite == NonFinitePolicy::rollback && !m_setup.plan.from) {
    spdlog::info("train.nonfinite: rollback: writing the step-0 checkpoint to return to");
    save_checkpoint();
  }
  m_sum.exit_reason = ExitReason::completed;
  const AllocLabel label("a training step's buffers or, under dist.zero 3, a unit of weights gathered whole");
  m_peaks.open(m_threaded);
  while (m_p.epoch < m_plan.epochs && m_p.step < m_plan.total_steps) {
    const EpochEnd end = run_epoch();
    if (end == EpochEnd::rolled_back) continue;
    if (end == EpochEnd::stopped || !end_epoch()) break;
  }
  m_peaks.close();
  return finish();
}

EpochEnd TrainLoop::run_epoch() {
  // Shards read all along (tokens) must still be the files opened: one rewritten in place is refused here, by name.
  for (const Dataset* d : {&m_setup.train(), &m_setup.test()})
    if (d->tokens) d->tokens->check_unchanged();
  m_loader.start_epoch(m_p.epoch, m_p.micro_done * m_plan.batch * m_setup.world);
  m_clock.restart();
  m_bar.start_epoch(m_p);
  while (m_p.micro_done < m_plan.micro_per_epoch) {
    const StepDone done = step();
    if (done.outcome == StepOutcome::diverged) return EpochEnd::stopped;
    if (done.outcome == StepOutcome::rolled_back) return EpochEnd::rolled_back;
    const bool last = m_p.step == m_plan.total_steps;
    after_step(done, last);
    if (last) {
      if (m_p.step < m_plan.per_epoch * m_plan.epochs) m_sum.exit_reason = ExitReason::max_steps;
      return EpochEnd::done;
    }
    if (stop_after_step()) return EpochEnd::stopped;
  }
  return EpochEnd::done;
}

// One optimizer step over up to `accumulate` micro-batches. On a GPU the host learns the previous step's outcome
// once this one's work is queued, and this one's only when it next needs it.
StepDone TrainLoop::step() {
  static const std::string kOptimizer = "optimizer";
  TrainProgress& p = m_p;
  const int64_t micros = std::min(m_plan.accumulate, m_plan.micro_per_epoch - p.micro_done);
  const std::vector<double> lrs = group_lrs(m_exp.optimizer, m_exp.scheduler, p.step, m_plan.total_steps, p.lr_scale);
  const double lr = lrs[0];  // the default parameter group's, which the log shows
  if (m_exp.train.profile_steps > 0 && p.step + 1 == m_exp.train.profile_start) m_profiler.enable(true);
  m_profiler.begin_step();
  int64_t samples = 0;
  if (m_step.graph_due()) {  // train.cuda_graphs: one GPU, one micro-batch, nothing for the ranks to sum
    samples = m_step.stage_batch(m_loader);
    p.micro_done += micros;
    m_any_stop = false;
    // Where a skipped step is possible (train.nonfinite: skip, or a loss scaler's overflow skips), its outcome must
    // be known before this update is queued: the skip takes back the step count this update's bias corrections are
    // computed from (as below). Otherwise the host learns it while this step runs: a divergence ends the run and a
    // rollback reloads the state either way.
    const bool skips = m_exp.train.nonfinite == NonFinitePolicy::skip || m_exp.train.loss_scaling();
    StepOutcome before = skips ? resolve() : StepOutcome::ok;
    if (before == StepOutcome::diverged || before == StepOutcome::rolled_back) return {before, lr};
    m_step.graph_step(lrs, m_exp.train.grad_clip, p.step, samples);
    if (!skips) before = resolve();
    if (before == StepOutcome::diverged || before == StepOutcome::rolled_back) return {before, lr};
    m_step.queue_verdict(p.step + 1, samples);
  } else {
    samples = m_step.forward_backward(m_loader, p.step, micros);
    p.micro_done += micros;
    SpanScope scope(&m_profiler, kOptimizer, to_string(m_exp.optimizer.type), "update");
    const RankSums sums = m_step.sum_over_ranks(samples);
    samples = sums.samples;
    m_any_stop = sums.any_stop;
    m_step.queue_grad_norm();
    // The previous step's outcome, now that this one's work is queued (a skip of it needs nothing more here).
    const StepOutcome before = m_gpu ? resolve() : StepOutcome::ok;
    if (before == StepOutcome::diverged || before == StepOutcome::rolled_back) return {before, lr};
    m_step.update(lrs, m_exp.train.grad_clip, p.step + 1, samples);
  }
  m_profiler.end_step();
  ++p.step;
  ++m_wait_steps;
  m_checkpoints.mark_dirty();
  p.train_samples += samples;
  p.window_samples += samples;  // resolve() takes a skipped step's samples back out
  p.epoch_samples += samples;
  const int64_t profile_end = m_exp.train.profile_start + m_exp.train.profile_steps;  // steps are 1-based here
  if (m_profiler.enabled() && (p.step + 1 == profile_end || p.step == m_plan.total_steps))
    finish_profile(m_profiler, m_sum.run_dir, m_setup.lead, m_exp.train.profile_start);
  const bool last = p.step == m_plan.total_steps;
  const bool checkpoint_due = m_exp.checkpoint.every_steps > 0 && p.step % m_exp.checkpoint.every_steps == 0;
  if (!m_gpu || last || p.step % m_exp.train.log_every == 0 || m_evaluator.due_after_step(p, last) || checkpoint_due ||
      p.micro_done == m_plan.micro_per_epoch || stop_requested() || m_any_stop)
    return {resolve(), lr};  // the host needs this step's outcome before it goes on
  return {StepOutcome::ok, lr};
}

void TrainLoop::after_step(const StepDone& done, bool last) {
  TrainProgress& p = m_p;
  if ((p.step % m_exp.train.log_every == 0 || last) && p.window_samples > 0) log_window(done);
  m_bar.after_step(p, p.micro_done == m_plan.micro_per_epoch || last);
  if (m_evaluator.due_after_step(p, last)) {
    m_clock.stop();
    evaluate();
    m_clock.restart();
  }
  const bool epoch_checkpoint_next = p.micro_done == m_plan.micro_per_epoch && m_exp.checkpoint.every_epochs > 0 &&
                                     (p.epochs_done + 1) % m_exp.checkpoint.every_epochs == 0;
  if (m_exp.checkpoint.every_steps > 0 && p.step % m_exp.checkpoint.every_steps == 0 && !last &&
      !epoch_checkpoint_next) {
    m_clock.stop();
    save_checkpoint();
    m_clock.restart();
  }
}

// A stop asked for by a signal here or, with several ranks, on any rank (they all stop after the same step).
bool TrainLoop::stop_after_step() {
  const int sig = m_setup.world > 1 ? (m_any_stop ? std::max(stop_requested(), 1) : 0) : stop_requested();
  if (!sig) return false;
  m_clock.stop();
  spdlog::warn("{} received: stopping after step {}", sig > 1 ? signal_name(sig) : "a stop on another rank", m_p.step);
  m_sum.exit_reason = ExitReason::interrupted;
  return true;
}

// The end of an epoch (or of the run, at max_steps inside one); false when the run ends here.
bool TrainLoop::end_epoch() {
  TrainProgress& p = m_p;
  // The open log window's loss from this epoch joins the epoch's loss; the window itself stays open across the
  // boundary (its samples and its time go on together, so its rate is samples over the time that made them).
  if (p.window_samples > 0) {
    m_step.read_window(p);  // waits for the device
    p.epoch_loss += p.window_loss - p.window_loss_carried;
    p.window_loss_carried = p.window_loss;
  }
  m_clock.stop();
  p.final_train_loss = p.epoch_loss / static_cast<double>(std::max<int64_t>(p.epoch_samples, 1));
  if (m_evaluator.due_at_epoch_end(p)) evaluate();
  p.epochs_done = p.epoch + 1;
  m_checkpoints.mark_dirty();
  if (p.micro_done < m_plan.micro_per_epoch) return false;  // max_steps ended the run: a resume continues the epoch
  p.epoch += 1;
  p.micro_done = 0;
  p.epoch_loss = 0;
  p.epoch_samples = 0;
  const bool more = p.step < m_plan.total_steps && p.epoch < m_plan.epochs;
  if (m_exp.checkpoint.every_epochs > 0 && p.epochs_done % m_exp.checkpoint.every_epochs == 0 && more)
    save_checkpoint();
  if (const int sig = m_setup.world > 1 ? 0 : stop_requested(); sig && more) {
    spdlog::warn("{} received: stopping after step {}", signal_name(sig), p.step);
    m_sum.exit_reason = ExitReason::interrupted;
    return false;
  }
  return true;
}

// What the host learns of the newest queued step. The device has already skipped the update of a non-finite one;
// this decides what else happens (train.nonfinite).
StepOutcome TrainLoop::resolve() {
  const std::optional<StepReading> r = m_step.verdict().take();
  if (!r) return StepOutcome::ok;
  TrainProgress& p = m_p;
  p.grad_norm = std::sqrt(r->grad_sq);
  if (m_exp.train.loss_scaling() && overflow_skip(*r)) return StepOutcome::ok;
  if (r->finite()) {
    p.skips_in_row = 0;
    m_bar.add_step(r->loss_sum, r->samples);
    return StepOutcome::ok;
  }
  const std::string what =
      fmt::format("step {}: non-finite {} (loss sum {}, gradient norm {}); first non-finite gradient: {}", r->step,
                  std::isfinite(r->loss_sum) ? "gradient" : "loss", r->loss_sum, p.grad_norm, r->first_nonfinite);
  // The update did not happen: the optimizer's step count and the statistics' sample counts take it back.
  m_setup.optimizer->undo_step();
  p.window_samples -= r->samples;
  p.epoch_samples -= r->samples;
  const StepOutcome outcome =
      nonfinite_outcome(m_exp.train.nonfinite, m_exp.train.max_skips, p.skips_in_row, m_checkpoints.rollbacks());
  if (outcome == StepOutcome::skipped) {
    spdlog::warn("{}: the step is skipped ({} in a row, train.max_skips {})", what, p.skips_in_row,
                 m_exp.train.max_skips);
    m_reporter.metrics().write(JsonObject().add("type", "skip").add("step", r->step).add("epoch", p.epoch + 1));
  } else if (outcome == StepOutcome::rolled_back) {
    roll_back(what, r->step);
  } else {
    diverge(what, r->step);
  }
  return outcome;
}

// The host's copy of the loss scaler takes the step the device's did (the same update on the same verdict, in step
// order). A non-finite step at a scale above kScaleFloor is an overflow: the device skipped it and halved the scale,
// and it does not count against train.nonfinite; at or below the floor the scale amplifies nothing, so a NaN there
// is the model's or the data's and goes on to the policy. (PyTorch's GradScaler has no floor and would halve it
// for ever.) A fixed scale has no backoff: every non-finite step goes to the policy. True when it was an overflow.
bool TrainLoop::overflow_skip(const StepReading& r) {
  constexpr double kScaleFloor = 1.0;
  TrainProgress& p = m_p;
  const double used = p.loss_scale;
  double s[kLossScaleState] = {p.loss_scale, 1.0 / p.loss_scale, static_cast<double>(p.scale_growth_tracker)};
  const LossScaleHyper& h = m_exp.train.loss_scale.hyper;
  loss_scale_update(s, r.finite(), h);
  p.loss_scale = s[kScale];
  p.scale_growth_tracker = static_cast<int64_t>(s[kGrowthTracker]);
  if (r.finite() || !h.dynamic || used <= kScaleFloor) return false;
  ++p.overflow_skips;
  m_setup.optimizer->undo_step();
  p.window_samples -= r.samples;
  p.epoch_samples -= r.samples;
  spdlog::info(
      "step {}: gradient overflow at loss scale {:g}: the step is skipped and the scale is now {:g} ({} "
      "overflow skips so far)",
      r.step, used, p.loss_scale, p.overflow_skips);
  return true;
}

void TrainLoop::roll_back(const std::string& what, int64_t from_step) {
  const std::string back = m_checkpoints.roll_back(m_p);
  m_step.reset_graph();  // train.cuda_graphs: warmed up and captured again on the reloaded state
  m_step.set_window(m_p);
  m_step.set_scaler(m_p);
  // metrics.jsonl keeps the diverging steps' rows: the rollback row follows them.
  spdlog::warn("{}: rolled back to {} (step {}); learning rate now × {}", what, back, m_p.step, m_p.lr_scale);
  m_reporter.metrics().write(JsonObject()
                                 .add("type", "rollback")
                                 .add("from_step", from_step)
                                 .add("to_step", m_p.step)
                                 .add("lr_scale", m_p.lr_scale));
}

void TrainLoop::diverge(const std::string& what, int64_t step) {
  m_clock.stop();
  const NonFinitePolicy mode = m_exp.train.nonfinite;
  spdlog::error(
      "training diverged: {} (train.nonfinite: {}{})", what, to_string(mode),
      mode == NonFinitePolicy::abort ? "" : fmt::format(", more than max_skips {} in a row", m_exp.train.max_skips));
  m_sum.exit_reason = ExitReason::diverged;
  m_p.step = step - 1;  // the diverging step made no update
}

// Ends the log window: its loss sum joins the epoch's and is returned.
double TrainLoop::close_window() {
  m_step.read_window(m_p);  // waits for the device, so the window's time includes its work
  m_clock.stop();
  const double loss_sum = m_p.window_loss;
  m_p.epoch_loss += loss_sum - m_p.window_loss_carried;  // (the part from ended epochs is in theirs)
  m_p.window_loss = m_p.window_hits = m_p.window_loss_carried = 0;
  m_step.clear_window();
  return loss_sum;
}

void TrainLoop::log_window(const StepDone& done) {
  LogWindow w;
  w.loss = close_window() / static_cast<double>(m_p.window_samples);
  w.samples_per_sec = static_cast<double>(m_p.window_samples) / std::max(m_clock.window_seconds(), 1e-9);
  w.lr = done.lr;
  w.skipped = done.outcome == StepOutcome::skipped;
  // The same span of steps and training seconds as the rate: the data wait's share of the step time.
  const double wait_s = m_step.take_data_wait_seconds();
  const int64_t steps = std::max<int64_t>(m_wait_steps, 1);
  w.data_wait_ms = 1e3 * wait_s / static_cast<double>(steps);
  w.train_s = m_clock.window_seconds();
  w.eval_s = m_eval_s;
  w.checkpoint_s = m_checkpoint_s;
  m_eval_s = m_checkpoint_s = 0;
  note_data_wait(wait_s, m_clock.window_seconds(), steps);
  m_wait_steps = 0;
  m_reporter.log_train(m_p, m_plan.total_steps, w);
  m_p.window_samples = 0;
  m_clock.clear_window();
  m_clock.restart();
}

// Once a run: the log window in which getting batches ready took more than 10 % of the step time. Without loader
// threads this time is on the training thread, added to every step; with them it is the time the step waited for
// their next batch. What it is made of is what the config sets.
void TrainLoop::note_data_wait(double wait_s, double window_s, int64_t steps) {
  if (m_wait_noted || !m_setup.lead || window_s <= 0 || wait_s <= 0.10 * window_s) return;
  m_wait_noted = true;
  const AugmentConfig& aug = m_exp.data.augment;
  std::string made_of = "gathering the samples";
  if (m_exp.data.format == DataFormat::tokens) made_of = "cutting the token windows from the shards";
  if (aug.any())
    made_of += fmt::format(" and data.augment ({}{}{})", aug.crop_padding >= 0 ? "random_crop" : "",
                           aug.crop_padding >= 0 && aug.hflip ? ", " : "", aug.hflip ? "hflip" : "");
  if (m_setup.device.is_cuda()) made_of += ", then queueing the copy to the device";
  const int64_t workers = m_exp.data.workers;
  made_of += workers == 0 ? "; data.workers: N prepares batches on N threads beside the step"
                          : fmt::format("; more data.workers than {} prepare them faster (on free cores)", workers);
  if (aug.any()) made_of += "; data.augment is the part of it the config can make cheaper";
  if (m_setup.device.is_cuda() && !aug.any() && m_exp.data.format != DataFormat::tokens &&
      m_exp.data.device_resident == AutoSwitch::off)
    made_of += "; data.device_resident: auto keeps a training set that fits on the device and gathers it there";
  const double step_ms = 1e3 * window_s / static_cast<double>(steps);
  spdlog::info("data wait: {:.0f}% of the step time ({:.3g} ms of {:.3g} ms per step, up to step {}) goes to {}: {}",
               100 * wait_s / window_s, 1e3 * wait_s / static_cast<double>(steps), step_ms, m_p.step,
               workers == 0 ? "getting batches ready on the training thread"
                            : fmt::format("waiting for the {} loader thread(s)", workers),
               made_of);
}

void TrainLoop::save_checkpoint() {
  const auto start = RunClock::now();
  m_step.read_window(m_p);
  const WholeWeights whole(*m_setup.optimizer);  // dist.zero 3: the model file holds the whole weights
  m_checkpoints.save(m_p, m_reporter.metrics().bytes());
  m_checkpoint_s += seconds_since(start);
}

void TrainLoop::evaluate() {
  const auto start = RunClock::now();
  const WholeWeights whole(*m_setup.optimizer);  // (ranks evaluate different numbers of batches)
  m_evaluator.run(m_p, m_reporter.metrics());
  m_eval_s += seconds_since(start);
}

// The last checkpoint, the final weights and summary.json (a diverged run leaves its last good checkpoint as it is).
RunSummary TrainLoop::finish() {
  m_bar.close();
  if (m_setup.lead) m_step.log_allreduce_cost(m_p.step);
  const bool diverged = m_sum.exit_reason == ExitReason::diverged;
  if (!diverged && m_checkpoints.dirty()) save_checkpoint();  // the final one (or the one an interruption resumes from)
  // The final weights are written before summary.json, so that a summary always means the weights are there.
  if (!diverged) {
    const WholeWeights whole(*m_setup.optimizer);
    if (m_setup.lead) write_final_weights(m_sum.run_dir, m_setup.model, m_exp.name, m_p.step);
  }
  summarize(m_sum, m_p, seconds_since(m_wall_start));
  m_sum.memory = gather_memory_peaks(*m_setup.comm, m_setup.device, m_threaded, m_peaks);  // every rank comes here
  if (m_sum.test_loss) m_sum.test_bpb = bits_per_byte(m_setup.test(), m_exp, *m_sum.test_loss);
  if (m_setup.lead) write_summary(m_sum.run_dir, m_exp.name, m_sum, m_setup.world, m_setup.threads);
  if (m_setup.lead && m_exp.logging.report) write_report_logged(m_sum.run_dir);
  if (diverged) return m_sum;
  spdlog::info("{}: {} steps, {:.0f} samples/s, final train loss {}{} → {}",
               m_sum.exit_reason == ExitReason::interrupted
                   ? fmt::format("interrupted (resume with: {})", resume_command(m_sum.run_dir))
                   : "done",
               m_sum.steps, m_sum.samples_per_sec,
               m_sum.final_train_loss ? fmt::format("{:.4f}", *m_sum.final_train_loss) : "n/a (no epoch ended)",
               m_sum.test_accuracy ? fmt::format(", test accuracy {:.4f}", *m_sum.test_accuracy) : std::string(),
               m_sum.run_dir);
  return m_sum;
}

}  // namespace

// One worker: its parts built in order (the run directory only once the set-up found nothing wrong), then the loop.
RunSummary train_worker(const Experiment& exp, const RunOptions& opts, const WorkerPlacement& where) {
  const auto wall_start = RunClock::now();
  RunSetup setup(exp, opts, where);
  RunSummary sum;
  // The batches and steps first (nothing written yet): a resume with nothing left to train (a run that stopped at
  // train.max_steps, resumed with the same limit) ends here, its files untouched.
  Loader loader(setup.train(), setup.batch, exp.data.shuffle, exp.seed, exp.data.augment);
  loader.shard(setup.comm->rank(), setup.world);
  const StepPlan plan = plan_steps(exp, loader, setup.train(), setup.world);
  if (setup.plan.from && (setup.progress.step >= plan.total_steps || setup.progress.epoch >= plan.epochs)) {
    const std::string where_now =
        fmt::format("{}: at step {} of {} (train.max_steps {}, train.epochs {})", setup.plan.run_dir,
                    setup.progress.step, plan.total_steps, exp.train.max_steps, exp.train.epochs);
    if (opts.resume != "auto")
      throw ConfigError(
          fmt::format("--resume {}: nothing left to train, {}: raise --max-steps or --epochs, or "
                      "continue it into a new folder with --out",
                      opts.resume, where_now));
    spdlog::info("{}; nothing left to train, nothing written", where_now);
    sum.run_dir = setup.plan.run_dir;
    sum.exit_reason = exp.train.max_steps > 0 && setup.progress.step >= exp.train.max_steps ? ExitReason::max_steps
                                                                                            : ExitReason::completed;
    return sum;
  }
  if (setup.lead) {
    sum.run_dir = make_run_dir(exp.name, setup.plan.run_dir, !opts.resume.empty());
    setup.run_lock.acquire(sum.run_dir);  // (a new folder: locked now that it exists)
  }
  if (setup.world > 1) broadcast_string(*setup.comm, sum.run_dir, "the run directory");
  if (setup.lead && setup.plan.from) carry_metrics(*setup.plan.from, sum.run_dir);
  sum.device = setup.device.str();
  if (exp.data.format == DataFormat::images) sum.bad_files = setup.train().bad_files + setup.test().bad_files;
  const fs::path dir = sum.run_dir;
  const RunLogFile log_file(setup.lead ? (dir / "train.log").string() : std::string());
  if (setup.lead) {
    write_file_atomic((dir / "config.resolved.yaml").string(), run_config_text(setup.resolved_config));
    write_overrides_and_tokenizer(sum.run_dir, opts.overrides, setup.train().tokenizer ? setup.train() : setup.test());
    record_init_weights(sum.run_dir, setup.init, sum);
  }
  RunReporter reporter(exp, setup, sum.run_dir, where.threaded, where.process_gpus, wall_start);
  CheckpointHook checkpoints(exp, setup, sum.run_dir);
  log_run_start(exp, setup, plan, sum.run_dir, opts.local_rank);
  reporter.continue_metrics(setup.plan.from ? &setup.progress : nullptr);
  if (setup.plan.from) log_resume(*setup.plan.from, setup.progress, setup.resolved_config, setup.world, plan.batch);

  Profiler profiler;
  const AllocLabel label("the gradient buckets and the step's buffers (dist.bucket_mb)");  // until the loop's own
  StepLoop step(exp, setup, plan, profiler);
  profiler.set_device(setup.device);
  setup.model.set_profiler(&profiler);
  // The live progress display (rank 0) stands for the periodic step lines on the console; train.log still gets
  // them. auto: on a terminal, not under a launcher (whose ranks' output is usually collected, even through a
  // pseudo-terminal); true: always; false or --no-progress: never.
  const ProgressBarMode mode = exp.logging.progress;
  const bool progress_bar = setup.lead && opts.progress && mode != ProgressBarMode::never &&
                            spdlog::should_log(spdlog::level::info) &&
                            (mode == ProgressBarMode::always || (console_is_live() && !opts.launched));
  TrainLoop loop(exp,
                 {.setup = setup,
                  .summary = sum,
                  .reporter = reporter,
                  .checkpoints = checkpoints,
                  .loader = loader,
                  .plan = plan,
                  .step = step,
                  .profiler = profiler,
                  .threaded = where.threaded},
                 progress_bar, wall_start);
  return loop.run();
}

}  // namespace gt
