// The parts of a training run on their own: the non-finite verdict, a step on the CPU, step planning, the batch
// stager, device resolution and the worker-thread harness.
#include "data/batch_stager.h"
#include "graph/model.h"
#include "helpers.h"
#include "ops/devices.h"
#include "ops/math.h"
#include "parallel/comm.h"
#include "parallel/workers.h"
#include "profile/profiler.h"
#include "train/evaluation.h"
#include "train/setup.h"
#include "train/step.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>

using namespace gt;
using gt::test::synthetic_mlp;

namespace {

const std::string kPartsConfig = "name: parts\nseed: 5\n" +
                                 synthetic_mlp({.samples = 10, .features = 3, .classes = 2, .batch = 3, .hidden = 4}) +
                                 R"(optimizer: {type: sgd, lr: 0.1}
train: {epochs: 3, accumulate: 2}
)";

Experiment experiment(const std::string& overrides = "") {
  ConfigNode root = ConfigNode::load_string(kPartsConfig, "parts.yaml");
  if (!overrides.empty()) root = apply_override(root, overrides);
  return parse_experiment(root);
}

// The parameters as one list of numbers.
std::vector<float> flat_params(Model& model) {
  std::vector<float> out;
  for (Param* p : model.params()) {
    const float* v = p->value.data<float>();
    out.insert(out.end(), v, v + p->value.numel());
  }
  return out;
}

}  // namespace

TEST_CASE("a non-finite step is skipped, rolled back or ends the run as train.nonfinite and max_skips say",
          "[cpu][train]") {
  int64_t skips = 0, rollbacks = 0;
  SECTION("abort: at once, counting nothing") {
    CHECK(nonfinite_outcome(gt::NonFinitePolicy::abort, 3, skips, rollbacks) == StepOutcome::diverged);
    CHECK(skips == 0);
    CHECK(rollbacks == 0);
  }
  SECTION("skip: max_skips in a row, then the run diverges") {
    CHECK(nonfinite_outcome(gt::NonFinitePolicy::skip, 2, skips, rollbacks) == StepOutcome::skipped);
    CHECK(nonfinite_outcome(gt::NonFinitePolicy::skip, 2, skips, rollbacks) == StepOutcome::skipped);
    CHECK(skips == 2);
    CHECK(nonfinite_outcome(gt::NonFinitePolicy::skip, 2, skips, rollbacks) == StepOutcome::diverged);
    CHECK(rollbacks == 0);
    skips = 0;  // a finite step in between starts the count again
    CHECK(nonfinite_outcome(gt::NonFinitePolicy::skip, 2, skips, rollbacks) == StepOutcome::skipped);
  }
  SECTION("rollback: max_skips since the last checkpoint, then the run diverges") {
    CHECK(nonfinite_outcome(gt::NonFinitePolicy::rollback, 1, skips, rollbacks) == StepOutcome::rolled_back);
    CHECK(rollbacks == 1);
    CHECK(nonfinite_outcome(gt::NonFinitePolicy::rollback, 1, skips, rollbacks) == StepOutcome::diverged);
    CHECK(skips == 0);
  }
}

TEST_CASE("the deferred verdict hands each queued step to the host once, naming the first non-finite gradient",
          "[cpu][train]") {
  DeferredVerdict verdict({"layers.0.weight", "layers.0.bias", "layers.2.weight"});
  CHECK_FALSE(verdict.take());  // nothing queued
  Tensor stats = Tensor::zeros(Shape{kStepStats}, DType::f64);
  Tensor per_param = Tensor::zeros(Shape{3}, DType::f64);
  stats.data<double>()[kLossSum] = 6.5;
  stats.data<double>()[kGradSq] = 4.0;
  verdict.queue(stats, per_param, Device::cpu(), 7, 12);
  stats.data<double>()[kLossSum] = -1;  // the host copy was taken when the step was queued
  const auto ok = verdict.take();
  REQUIRE(ok);
  CHECK(ok->finite());
  CHECK(ok->step == 7);
  CHECK(ok->samples == 12);
  CHECK(ok->loss_sum == 6.5);
  CHECK(ok->grad_sq == 4.0);
  CHECK(ok->first_nonfinite.empty());
  CHECK_FALSE(verdict.take());  // taken once

  const double inf = std::numeric_limits<double>::infinity();
  per_param.data<double>()[1] = inf;
  per_param.data<double>()[2] = std::nan("");
  stats.data<double>()[kGradSq] = inf;
  verdict.queue(stats, per_param, Device::cpu(), 8, 12);
  const auto bad = verdict.take();
  REQUIRE(bad);
  CHECK_FALSE(bad->finite());
  CHECK(bad->first_nonfinite == "layers.0.bias");

  per_param.zero_();
  stats.data<double>()[kLossSum] = std::nan("");
  stats.data<double>()[kGradSq] = 1.0;
  verdict.queue(stats, per_param, Device::cpu(), 9, 12);
  const auto loss_only = verdict.take();
  REQUIRE(loss_only);
  CHECK_FALSE(loss_only->finite());
  CHECK(loss_only->first_nonfinite == "none (the loss itself)");
}

TEST_CASE("steps are planned from the batch, accumulation, ranks and max_steps, and an epoch needs a global batch",
          "[cpu][train]") {
  const Experiment exp = experiment();
  const LoadedData data = load_data(exp);
  Loader loader(data.train, exp.data.batch_size, /*shuffle=*/false, exp.seed);
  StepPlan s = plan_steps(exp, loader, data.train, 1);
  CHECK(s.batch == 3);
  CHECK(s.micro_per_epoch == 4);  // 10 samples: 3 + 3 + 3 + 1
  CHECK(s.per_epoch == 2);        // 2 micro-batches per step
  CHECK(s.total_steps == 6);
  CHECK(plan_steps(experiment("train.max_steps=5"), loader, data.train, 1).total_steps == 5);
  loader.shard(0, 2);
  s = plan_steps(exp, loader, data.train, 2);
  CHECK(s.micro_per_epoch == 1);  // one full global batch of 2 × 3; the other 4 samples are dropped
  CHECK(s.per_epoch == 1);
  loader.shard(0, 4);
  CHECK_THROWS_WITH(plan_steps(exp, loader, data.train, 4), Catch::Contains("fewer than one global batch (4 ranks"));
}

TEST_CASE("train.cuda_graphs plans full batches only: an epoch's last partial batch is dropped", "[cpu][train]") {
  ConfigNode root = apply_override(ConfigNode::load_string(kPartsConfig, "parts.yaml"), "train.accumulate=1");
  root = apply_override(root, "+train.cuda_graphs=true");
  const Experiment exp = parse_experiment(root);
  REQUIRE(exp.train.cuda_graphs);
  const LoadedData data = load_data(exp);
  Loader loader(data.train, exp.data.batch_size, /*shuffle=*/false, exp.seed);
  const StepPlan s = plan_steps(exp, loader, data.train, 1);
  CHECK(s.micro_per_epoch == 3);  // 10 samples: 3 + 3 + 3, the last 1 dropped
  CHECK(s.per_epoch == 3);
  CHECK(s.total_steps == 9);
  // Without it the partial batch is a step of its own.
  CHECK(plan_steps(
            parse_experiment(apply_override(ConfigNode::load_string(kPartsConfig, "parts.yaml"), "train.accumulate=1")),
            loader, data.train, 1)
            .micro_per_epoch == 4);
}

TEST_CASE(
    "a step on the CPU reads its batches, updates the parameters and queues its verdict, and a non-finite "
    "one leaves them as they were",
    "[cpu][train]") {
  const Experiment exp = experiment();
  RunOptions opts;
  opts.threads = 2;
  WorkerPlacement where;
  where.device = "cpu";
  RunSetup setup(exp, opts, where);
  Loader loader(setup.train(), setup.batch, /*shuffle=*/false, exp.seed);
  const StepPlan plan = plan_steps(exp, loader, setup.train(), 1);
  Profiler profiler;
  StepLoop step(exp, setup, plan, profiler);
  loader.start_epoch(0);

  const std::vector<float> before = flat_params(setup.model);
  const int64_t samples = step.forward_backward(loader, 0, plan.accumulate);
  CHECK(samples == 6);  // two micro-batches of 3
  const RankSums sums = step.sum_over_ranks(samples);
  CHECK(sums.samples == 6);
  CHECK_FALSE(sums.any_stop);
  step.queue_grad_norm();
  CHECK_FALSE(step.verdict().take());  // nothing queued until the update
  step.update(std::vector{0.1}, 0.0, 1, sums.samples);
  const auto r = step.verdict().take();
  REQUIRE(r);
  CHECK(r->finite());
  CHECK(r->step == 1);
  CHECK(r->samples == 6);
  CHECK(r->loss_sum > 0);
  CHECK(r->grad_sq > 0);
  CHECK(flat_params(setup.model) != before);

  // A NaN weight of the last layer makes the loss and the gradients non-finite: the device-side gate keeps the
  // parameters as they were, and the verdict names a parameter whose gradient went non-finite.
  std::vector<std::string> names;
  for (const auto& [name, param] : setup.model.named_params()) {
    names.push_back(name);
    if (name == "layers.2.weight") param->value.data<float>()[0] = std::nanf("");
  }
  const std::vector<float> poisoned = flat_params(setup.model);
  const int64_t n = step.forward_backward(loader, 1, plan.accumulate);
  CHECK(n == 4);  // the epoch's last two micro-batches: 3 + 1
  step.queue_grad_norm();
  step.update(std::vector{0.1}, 0.0, 2, step.sum_over_ranks(n).samples);
  const auto bad = step.verdict().take();
  REQUIRE(bad);
  CHECK_FALSE(bad->finite());
  CHECK(std::find(names.begin(), names.end(), bad->first_nonfinite) != names.end());
  const std::vector<float> after = flat_params(setup.model);
  REQUIRE(after.size() == poisoned.size());
  for (size_t i = 0; i < after.size(); ++i)
    if (!std::isnan(poisoned[i])) CHECK(after[i] == poisoned[i]);
}

TEST_CASE("the batch stager on the CPU hands the loader's batches straight to the step's tensors", "[cpu][data]") {
  Dataset d;
  d.inputs = Tensor::empty(Shape{5, 2}, DType::f32);
  d.targets = Tensor::empty(Shape{5}, DType::i32);
  d.num_classes = 5;
  for (int i = 0; i < 5; ++i) {
    d.inputs.data<float>()[2 * i] = static_cast<float>(i);
    d.inputs.data<float>()[2 * i + 1] = static_cast<float>(10 * i);
    d.targets.data<int32_t>()[i] = i;
  }
  Loader loader(d, 2, /*shuffle=*/false, 1);
  loader.start_epoch(0);
  BatchStager stager(d, 2, Device::cpu());
  Tensor x = Tensor::empty(Shape{2, 2}, DType::f32), y = Tensor::empty(Shape{2}, DType::i32);
  Profiler profiler;
  profiler.enable(true);
  profiler.begin_step();
  std::vector<int64_t> sizes;
  std::vector<int32_t> seen;
  for (int64_t n; (n = stager.next(loader, x, y, &profiler)) > 0;) {
    sizes.push_back(n);
    for (int64_t i = 0; i < n; ++i) {
      CHECK(x.data<float>()[2 * i + 1] == 10 * x.data<float>()[2 * i]);
      seen.push_back(y.data<int32_t>()[i]);
      CHECK(x.data<float>()[2 * i] == static_cast<float>(seen.back()));
    }
  }
  profiler.end_step();
  CHECK(sizes == std::vector<int64_t>{2, 2, 1});
  CHECK(seen == std::vector<int32_t>{0, 1, 2, 3, 4});
  CHECK_THAT(profiler.table(), Catch::Contains("data"));
}

TEST_CASE("devices resolve by name: cpu as asked, auto to the CPU without a usable GPU, and a missing GPU is refused",
          "[cpu]") {
  std::string reason;
  CHECK(resolve_device("cpu", reason) == Device::cpu());
  CHECK(reason == "requested");
  if (query_cuda().devices.empty()) {
    CHECK(resolve_device("auto", reason) == Device::cpu());
    CHECK_THAT(reason, Catch::StartsWith("auto: "));
  }
  CHECK_THROWS_AS(resolve_device("cuda:99", reason), Error);
  CHECK_THROWS_AS(resolve_device("tpu", reason), Error);
}

TEST_CASE("the worker-thread harness runs one worker per communicator and reports a worker's own failure",
          "[cpu][dist]") {
  SECTION("every worker runs and meets the others") {
    auto comms = make_thread_comms(3, 10.0);
    std::vector<double> sums(3);
    run_worker_threads(comms, 5.0, [&](int rank) {
      double v = rank + 1;
      comms[static_cast<size_t>(rank)]->allreduce_sum(&v, 1, "the ranks");
      sums[static_cast<size_t>(rank)] = v;
    });
    CHECK(sums == std::vector<double>{6, 6, 6});
  }
  SECTION("a failing worker ends the others, and its error is the one rethrown") {
    auto comms = make_thread_comms(2, 60.0);
    std::atomic<int> peers_stopped{0};
    try {
      run_worker_threads(comms, 5.0, [&](int rank) {
        if (rank == 1) throw DataError("rank 1's own failure");
        double v = 1;
        try {
          comms[0]->allreduce_sum(&v, 1, "the step's loss");  // rank 1 never arrives
        } catch (const PeerFailure&) {
          ++peers_stopped;
          throw;
        }
      });
      FAIL("the failure was not rethrown");
    } catch (const DataError& e) {
      CHECK_THAT(e.what(), Catch::Equals("rank 1's own failure"));
    }
    CHECK(peers_stopped == 1);
  }
}

// data.tta.hflip: the evaluation scores the mean of the logits of each test image and of its mirror image. A linear
// model on [1, 2, 3] images is not mirror-symmetric, so the expected figures, worked out here from its weights, differ
// from plain evaluation's; 7 test samples in batches of 3 end in a partial batch.
TEST_CASE("data.tta.hflip scores the mean logits of each test image and its mirror, and needs images", "[cpu][data]") {
  const Experiment exp = experiment(
      "data={format: synthetic, samples: 8, test_samples: 7, input_shape: [1, 2, 3], targets: {classes: 3}, "
      "batch_size: 3, tta: {hflip: true}}");
  REQUIRE(exp.data.tta_hflip);
  ConfigNode flat = ConfigNode::load_string("{layers: [flatten, {type: linear, out_features: 3}]}", "model.yaml");
  const LoadedData data = load_data(exp);
  Model model = Model::build(parse_model_spec(flat), data.train.input_shape(), DType::f32, Device::cpu(), exp.seed);
  model.allocate(3);
  const std::vector<Param*> params = model.params();
  REQUIRE(params.size() == 2);
  const float* w = params[0]->value.data<float>();  // [3, 6]
  const float* b = params[1]->value.data<float>();  // [3]

  double loss = 0, plain_loss = 0;
  int hits = 0;
  const float* in = data.test.inputs.data<float>();
  const int32_t* labels = data.test.targets.data<int32_t>();
  for (int64_t i = 0; i < 7; ++i) {
    const float* v = in + i * 6;
    double mean[3], plain[3];
    for (int c = 0; c < 3; ++c) {
      double s = b[c], m = b[c];
      for (int r = 0; r < 2; ++r)
        for (int k = 0; k < 3; ++k) {
          s += double{w[c * 6 + r * 3 + k]} * v[r * 3 + k];
          m += double{w[c * 6 + r * 3 + k]} * v[r * 3 + (2 - k)];  // the mirror image's pixel
        }
      plain[c] = s;
      mean[c] = 0.5 * (s + m);
    }
    auto nll = [&](const double* z) {
      const double mx = std::max({z[0], z[1], z[2]});
      return mx + std::log(std::exp(z[0] - mx) + std::exp(z[1] - mx) + std::exp(z[2] - mx)) - z[labels[i]];
    };
    loss += nll(mean) / 7;
    plain_loss += nll(plain) / 7;
    hits += std::max_element(mean, mean + 3) - mean == labels[i];
  }
  REQUIRE(std::abs(loss - plain_loss) > 1e-3);  // the mirror changes the figures this test checks

  Tensor x = Tensor::empty(data.test.input_shape().batched(3), DType::f32);
  Tensor y = Tensor::empty(data.test.target_shape().batched(3), data.test.target_dtype());
  Tensor stats = Tensor::zeros(Shape{2}, DType::f64);
  const auto comm = make_local_comm();
  const EvalResult r = evaluate(model, exp, data.test, x, y, stats, *comm);
  CHECK(r.samples == 7);
  CHECK(r.loss == Approx(loss).epsilon(1e-5));
  REQUIRE(r.accuracy);
  CHECK(*r.accuracy == Approx(hits / 7.0));

  // Without the key the same weights give the plain figures.
  const Experiment off = experiment(
      "data={format: synthetic, samples: 8, test_samples: 7, input_shape: [1, 2, 3], targets: {classes: 3}, "
      "batch_size: 3}");
  CHECK(evaluate(model, off, data.test, x, y, stats, *comm).loss == Approx(plain_loss).epsilon(1e-5));

  // Samples that are not [C, H, W] images have no left and right: a config error naming the key.
  CHECK_THROWS_WITH(check_tta(exp, Shape{6}), Catch::Contains("data.tta") && Catch::Contains("[6]"));
}
