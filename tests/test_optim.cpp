// Optimizers and schedules against numbers computed by PyTorch itself (tests/reference/torch_refs.py, torch 1.13).
#include "optim/optimizer.h"

#include <catch2/catch.hpp>

using namespace gt;

namespace {

using Trace = std::vector<std::vector<double>>;

// Three steps on p = [1, −0.5, 2] with gradients [0.5, −1 + t, 0.25·t], as torch_refs.py does.
Trace run(const OptimizerConfig& cfg) {
  Param p{"w", Tensor::empty(Shape{3}, DType::f64), Tensor::empty(Shape{3}, DType::f64)};
  const double init[] = {1.0, -0.5, 2.0};
  std::copy(init, init + 3, p.value.data<double>());
  auto opt = make_optimizer(cfg, {&p});
  Trace out;
  for (int t = 0; t < 3; ++t) {
    p.grad.data<double>()[0] = 0.5;
    p.grad.data<double>()[1] = -1.0 + t;
    p.grad.data<double>()[2] = 0.25 * t;
    opt->step(cfg.lr);
    out.emplace_back(p.value.data<double>(), p.value.data<double>() + 3);
  }
  return out;
}

void check_trace(const Trace& got, const Trace& want) {
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t i = 0; i < want[t].size(); ++i) {
      INFO("step " << t << " element " << i);
      // In double the update is PyTorch's to rounding.
      CHECK(got[t][i] == Approx(want[t][i]).epsilon(1e-12));
    }
}

std::vector<double> lrs(const SchedulerConfig& s, int steps, int64_t total) {
  std::vector<double> out;
  for (int t = 0; t < steps; ++t) out.push_back(scheduled_lr(s, 0.1, t, total));
  return out;
}

void check_lrs(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t t = 0; t < want.size(); ++t) {
    INFO("step " << t);
    CHECK(got[t] == Approx(want[t]).epsilon(1e-9));
  }
}

}  // namespace

TEST_CASE("adam, adamw and amsgrad match torch.optim", "[cpu]") {
  OptimizerConfig adam;
  adam.type = OptimizerType::adam;
  adam.lr = 0.1;
  adam.beta2 = 0.99;
  adam.weight_decay = 0.1;
  check_trace(run(adam), {{0.9000000016666666, -0.4000000009523809, 1.9000000049999997},
                          {0.8000435398917464, -0.3300505707486285, 1.804676425770296},
                          {0.7001605668427914, -0.33365476201436517, 1.7101286888070266}});
  OptimizerConfig adamw;
  adamw.type = OptimizerType::adamw;
  adamw.lr = 0.1;
  adamw.weight_decay = 0.1;
  check_trace(run(adamw), {{0.890000002, -0.395000001, 1.98},
                           {0.7811000039800006, -0.3240441765241887, 1.8857863218517226},
                           {0.6732890059402006, -0.32939050609854853, 1.7840711983328312}});
  OptimizerConfig ams;
  ams.type = OptimizerType::adam;
  ams.lr = 0.1;
  ams.amsgrad = true;
  check_trace(run(ams), {{0.900000002, -0.400000001, 2.0},
                         {0.8000000040000006, -0.33302768782586634, 1.9255863218517226},
                         {0.7000000060000007, -0.34161445916546807, 1.8427290615513485}});
}

TEST_CASE("learning-rate schedules match torch.optim.lr_scheduler", "[cpu]") {
  SchedulerConfig s;
  s.type = ScheduleType::step;
  s.step_size = 3;
  s.gamma = 0.5;
  check_lrs(lrs(s, 8, 8), {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025});
  s = {};
  s.type = ScheduleType::multistep;
  s.milestones = {2, 5};
  s.gamma = 0.1;
  check_lrs(lrs(s, 8, 8), {0.1, 0.1, 0.01, 0.01, 0.01, 0.001, 0.001, 0.001});
  s = {};
  s.type = ScheduleType::exponential;
  s.gamma = 0.9;
  check_lrs(lrs(s, 5, 5), {0.1, 0.09, 0.081, 0.0729, 0.06561});
  s = {};
  s.type = ScheduleType::cosine;
  s.t_max = 6;
  s.eta_min = 0.01;
  check_lrs(lrs(s, 7, 7), {0.1, 0.09397114317029975, 0.07750000000000001, 0.055000000000000014, 0.032500000000000015,
                           0.01602885682970026, 0.01});
  s = {};
  s.type = ScheduleType::linear;
  s.start_factor = 0.5;
  s.end_factor = 0.1;
  s.total_iters = 4;
  check_lrs(lrs(s, 6, 6), {0.05, 0.04, 0.03, 0.02, 0.01, 0.01});
  s = {};
  s.type = ScheduleType::onecycle;
  s.max_lr = 1.0;
  check_lrs(lrs(s, 10, 10),
            {0.040000000000000036, 0.52, 1.0, 0.9504846320134737, 0.8117456539497631, 0.6112620219362893,
             0.38874197806371075, 0.18825834605023697, 0.049519367986526286, 4e-06});
}

TEST_CASE("warmup multiplies the schedule by a factor rising linearly to 1", "[cpu]") {
  SchedulerConfig s;
  s.warmup_steps = 4;
  s.warmup_start_factor = 0.2;
  // constant 0.1 × (0.2 + 0.8 · t/4) for t < 4, by hand
  check_lrs(lrs(s, 6, 6), {0.02, 0.04, 0.06, 0.08, 0.1, 0.1});
}

TEST_CASE("gradient clipping scales the global norm down to max_norm and leaves small gradients alone", "[cpu]") {
  Param a{"a", Tensor::zeros(Shape{2}, DType::f32), Tensor::empty(Shape{2}, DType::f32)};
  Param b{"b", Tensor::zeros(Shape{1}, DType::f32), Tensor::empty(Shape{1}, DType::f32)};
  a.grad.data<float>()[0] = 3;
  a.grad.data<float>()[1] = 0;
  b.grad.data<float>()[0] = 4;  // global norm 5
  Tensor scratch = Tensor::zeros(Shape{2}, DType::f64);
  CHECK(clip_grad_norm({&a, &b}, 10.0, scratch) == Approx(5));
  CHECK(b.grad.data<float>()[0] == 4.0f);  // under the limit: untouched
  CHECK(clip_grad_norm({&a, &b}, 1.0, scratch) == Approx(5));
  CHECK(a.grad.data<float>()[0] == Approx(3.0 / (5 + 1e-6)));
  CHECK(b.grad.data<float>()[0] == Approx(4.0 / (5 + 1e-6)));
  CHECK(clip_grad_norm({&a, &b}, 1.0, scratch) == Approx(1).epsilon(1e-5));
}
