// Test-set evaluation: the batches shared out over the ranks, their sums reduced once at the end.
#include "train/evaluation.h"

#include "core/checked.h"
#include "core/json.h"
#include "core/parallel.h"
#include "data/batch_stager.h"
#include "graph/model.h"
#include "log/logging.h"
#include "log/metrics.h"
#include "ops/devices.h"
#include "ops/elementwise.h"
#include "ops/optim.h"
#include "ops/precision.h"
#include "ops/wide.h"
#include "parallel/comm.h"
#include "train/loss.h"
#include "train/resume.h"
#include "train/setup.h"

#include <cmath>
#include <thread>

namespace gt {

void check_tta(const Experiment& exp, const Shape& sample) {
  if (exp.data.tta_hflip && sample.rank() != 3)
    exp.at.tta.fail(
        fmt::format("test-time flips work on [channels, height, width] images; the samples are {}", sample.str()));
}

std::optional<double> bits_per_byte(const Dataset& test, const Experiment& exp, double loss) {
  if (!test.bytes_known()) return std::nullopt;
  if (!test.tokenizer) return loss / std::log(2.0);  // a byte is a token
  const int64_t t = test.tokens->block_size();
  int64_t windows = test.size();
  if (exp.train.eval_tokens > 0) windows = std::min(windows, (exp.train.eval_tokens + t - 1) / t);
  // The UTF-8 bytes of every target evaluated (the end-of-text id stands for no text: none).
  const Tokenizer& tok = *test.tokenizer;
  std::vector<int64_t> bytes_of(static_cast<size_t>(tok.vocab_size()));
  for (uint32_t id = 0; id < tok.vocab_size(); ++id)
    bytes_of[id] = id == tok.end_of_text() ? 0 : static_cast<int64_t>(tok.token_bytes(id).size());
  std::vector<int64_t> per_window(static_cast<size_t>(windows), 0);
  parallel_for(windows, 64, [&](int64_t b, int64_t e) {
    std::vector<float> x(static_cast<size_t>(t));
    std::vector<int32_t> y(static_cast<size_t>(t));
    for (int64_t i = b; i < e; ++i) {
      test.tokens->window(i, x.data(), y.data());
      for (const int32_t id : y)
        per_window[static_cast<size_t>(i)] +=
            static_cast<size_t>(id) < bytes_of.size() ? bytes_of[static_cast<size_t>(id)] : 0;
    }
  });
  int64_t bytes = 0;
  for (const int64_t b : per_window) bytes += b;
  if (bytes == 0) return std::nullopt;
  return loss * static_cast<double>(windows * t) / (std::log(2.0) * static_cast<double>(bytes));
}

EvalResult evaluate(Model& model, const Experiment& exp, const Dataset& test, Tensor& x, Tensor& y, Tensor& stats,
                    Communicator& comm) {
  Loader loader(test, x.dim(0), /*shuffle=*/false, exp.seed);
  if (test.tokens && exp.train.eval_tokens > 0) {
    const int64_t t = test.tokens->block_size();
    loader.limit((exp.train.eval_tokens + t - 1) / t);  // whole windows: eval_tokens rounded up
  }
  loader.start_epoch(0);
  // data.tta.hflip: a second loader yields the same batches mirrored; the first pass's output waits in `mean`, a
  // [batch, …] copy of the model's output (the second forward overwrites the model's own), for the average.
  const bool tta = exp.data.tta_hflip;
  Loader mirrored(test, x.dim(0), /*shuffle=*/false, exp.seed, AugmentConfig{.mirror = true});
  mirrored.start_epoch(0);
  Tensor mean, half;
  if (tta) {
    mean = Tensor::empty(model.output_shape().batched(x.dim(0)), DType::f32, x.device());
    half = Tensor::empty(Shape{1}, DType::f64, x.device());
    Tensor h = Tensor::empty(Shape{1}, DType::f64);
    *h.data<double>() = 0.5;
    half.copy_from(h);
  }
  stats.zero_();
  const LayerContext ctx{.training = false};
  const ProductPrecisionScope autocast(exp.train.precision);  // the test set is seen as the training step sees it
  Tensor none;
  // On the trainer's thread (evaluations are short and rare); pinned as the training batches are.
  BatchStager stager(test, x.dim(0), x.device(), {.pinned = exp.data.pin_memory != AutoSwitch::off});
  const int64_t size = loader.size();
  for (int64_t k = 0; k * x.dim(0) < size; ++k) {
    if (k % comm.size() != comm.rank()) {  // another rank's batch
      loader.skip();
      mirrored.skip();
      continue;
    }
    const int64_t n = stager.next(loader, x, y);
    const Tensor& out = model.forward(x.narrow0(n), ctx);
    if (!tta) {
      compute_loss(exp.loss, out, y.narrow0(n), 1.0, none, stats);
      continue;
    }
    Tensor m = mean.narrow0(n);
    ops::convert(out, m);         // (a 16-bit output widened: Model::set_activation_dtype)
    stager.next(mirrored, x, y);  // the same samples and labels, mirrored
    ops::add(m, model.forward(x.narrow0(n), ctx), m);
    ops::scale_by(m, half);
    compute_loss(exp.loss, m, y.narrow0(n), 1.0, none, stats);
  }
  Tensor host = Tensor::empty(Shape{2}, DType::f64);
  host.copy_from(stats.narrow0(2));  // the one wait of the evaluation
  double* s = host.data<double>();
  comm.allreduce_sum(s, 2, "the evaluation sums");
  EvalResult r;
  r.samples = size;
  r.loss = s[0] / static_cast<double>(size);
  if (test.num_classes > 0) r.accuracy = s[1] / static_cast<double>(size);
  r.bpb = bits_per_byte(test, exp, r.loss);
  return r;
}

Evaluator::Evaluator(const Experiment& exp, Model& model, const Dataset& test, Tensor& x, Tensor& y, Communicator& comm)
    : m_exp(exp),
      m_model(model),
      m_test(test),
      m_x(x),
      m_y(y),
      m_comm(comm),
      m_stats(Tensor::zeros(Shape{2}, DType::f64, x.device())) {}

bool Evaluator::due_after_step(const TrainProgress& p, bool last) const {
  return m_test.size() > 0 && m_exp.train.eval_every > 0 && (p.step % m_exp.train.eval_every == 0 || last);
}

bool Evaluator::due_at_epoch_end(const TrainProgress& p) const {
  return m_test.size() > 0 && m_exp.train.eval_every == 0 && p.last_eval_step != p.step;
}

void Evaluator::run(TrainProgress& p, MetricsSink& metrics) {
  const EvalResult r = evaluate(m_model, m_exp, m_test, m_x, m_y, m_stats, m_comm);
  p.test_loss = r.loss;
  p.test_accuracy = r.accuracy;
  p.last_eval_step = p.step;
  spdlog::info("eval epoch {}/{} | step {} | test_loss {:.4f} | test_accuracy {}{}", p.epoch + 1, m_exp.train.epochs,
               p.step, r.loss, r.accuracy ? fmt::format("{:.4f}", *r.accuracy) : "n/a",
               r.bpb ? fmt::format(" | test_bpb {:.4f}", *r.bpb) : "");
  JsonObject row = JsonObject()
                       .add("type", "eval")
                       .add("step", p.step)
                       .add("epoch", p.epoch + 1)
                       .add("test_loss", r.loss)
                       .add("test_accuracy", r.accuracy);
  if (r.bpb) row.add("test_bpb", r.bpb);
  metrics.write(row);
}

EvalSummary evaluate_weights(const Experiment& exp, const std::string& weights_path, int threads) {
  set_num_threads(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
  std::string reason;
  const Device device = resolve_device(exp.devices.empty() ? exp.device : exp.devices[0], reason);
  const LoadedData data = load_data(exp);
  if (data.test.size() == 0) exp.at.data.fail("eval needs a test set (data.test, or test_samples for synthetic)");
  check_tta(exp, data.train.input_shape());
  Model model = Model::build(exp.model, data.train.input_shape(), DType::f32, device, exp.seed);
  model.check_batch(exp.data.batch_size, exp.at.batch_size);
  check_loss_fits(exp.loss, model.output_shape(), data.train, exp.at.loss, &data.test);
  load_finite_weights(model, weights_file(weights_path, exp.checkpoint));
  const int64_t batch = exp.data.batch_size;
  model.allocate(batch);
  Tensor x = Tensor::empty(data.test.input_shape().batched(batch), DType::f32, device);
  Tensor y = Tensor::empty(data.test.target_shape().batched(batch), data.test.target_dtype(), device);
  Tensor stats = Tensor::zeros(Shape{2}, DType::f64, device);
  const auto local = make_local_comm();
  const EvalResult r = evaluate(model, exp, data.test, x, y, stats, *local);
  return {r.samples, r.loss, r.accuracy, r.bpb,
          data.test.tokens ? checked_mul(r.samples, data.test.tokens->block_size()).value_or(0) : 0};
}

}  // namespace gt
