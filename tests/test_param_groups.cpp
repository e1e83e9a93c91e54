// optimizer.param_groups: a grouped step equals separate optimizers at the groups' rates, each group follows the
// schedule from its own base rate, dist.zero keeps each slice in its parameter's group, the config refuses what it
// cannot mean, and a run with a group at lr 0 keeps that group's weights bit for bit.
#include "core/error.h"
#include "helpers.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "parallel/comm.h"
#include "parallel/zero.h"
#include "train/experiment.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <thread>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

// Rows that span several of the CPU loop's thread chunks and share chunks with rows of the other group.
const std::vector<int64_t> kSizes{40000, 3, 70001, 17};
// Parameter i's group: the second and fourth in group 1.
const std::vector<int> kGroups{0, 1, 0, 1};

std::vector<Param> seeded_params(uint64_t seed) {
  std::vector<Param> out;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    Param p{"p" + std::to_string(i), Tensor::empty(Shape{kSizes[i]}, DType::f32),
            Tensor::empty(Shape{kSizes[i]}, DType::f32)};
    for (int64_t k = 0; k < kSizes[i]; ++k) {
      p.value.data<float>()[k] = static_cast<float>(std::sin(0.37 * static_cast<double>(k + seed + i)));
      p.grad.data<float>()[k] = static_cast<float>(std::cos(0.11 * static_cast<double>(k * 3 + i)) * 0.5);
    }
    out.push_back(std::move(p));
  }
  return out;
}

void new_grads(std::vector<Param>& ps, int step) {
  for (size_t i = 0; i < ps.size(); ++i)
    for (int64_t k = 0; k < ps[i].grad.numel(); ++k)
      ps[i].grad.data<float>()[k] = static_cast<float>(std::sin(0.05 * static_cast<double>(k + 7 * step + i)));
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

OptimizerConfig two_groups(OptimizerType type) {
  OptimizerConfig cfg;
  cfg.type = type;
  cfg.lr = 0.01;
  cfg.weight_decay = 0.1;
  cfg.momentum = type == OptimizerType::sgd ? 0.9 : 0.0;
  ParamGroupConfig g;
  g.params = {"p1", "p3"};
  g.lr = 0.05;
  g.weight_decay = 0.0;
  cfg.param_groups.push_back(g);
  return cfg;
}

// The single-group optimizer that group g of `cfg` amounts to.
OptimizerConfig alone(const OptimizerConfig& cfg, size_t g) {
  OptimizerConfig one = cfg;
  one.param_groups.clear();
  one.lr = cfg.group_lr(g);
  one.weight_decay = cfg.group_weight_decay(g);
  return one;
}

// The rate the optimizer applied to each parameter in one step: SGD without momentum or decay, f64 p = 0 and g = 1
// make p = −lr exactly.
std::vector<double> applied_rates(Optimizer& opt, std::vector<Param>& ps, std::span<const double> lrs) {
  for (Param& p : ps) {
    p.value.data<double>()[0] = 0;
    p.grad.data<double>()[0] = 1;
  }
  opt.step(lrs, Tensor::zeros(Shape{kStepStats}, DType::f64), 0);
  std::vector<double> out;
  for (Param& p : ps) out.push_back(-p.value.data<double>()[0]);
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError");
  return "";
}

constexpr const char* kGroupsYaml = R"(name: g
device: cpu
data: {format: synthetic, samples: 64, input_shape: [8], targets: {classes: 3}, batch_size: 32}
model:
  layers:
    - {type: linear, out_features: 16}
    - relu
    - {type: linear, out_features: 3}
loss: cross_entropy
optimizer:
  type: adamw
  lr: 0.01
  param_groups:
    - params: ["layers.2.*"]
      lr: 0.1
    - params: ["*.bias", "layers.0.nothing*"]
      weight_decay: 0
)";

}  // namespace

TEST_CASE("a two-group step equals separate optimizers at the groups' rates, bit for bit", "[cpu]") {
  for (const OptimizerType type : {OptimizerType::sgd, OptimizerType::adam, OptimizerType::adamw})
    for (const double max_norm : {0.0, 1.0}) {
      INFO(to_string(type) << " max_norm " << max_norm);
      const OptimizerConfig cfg = two_groups(type);
      std::vector<Param> grouped = seeded_params(1), ref = seeded_params(1);
      std::vector<Param*> all;
      for (Param& p : grouped) all.push_back(&p);
      auto opt = make_optimizer(cfg, all, kGroups);
      REQUIRE(opt->groups() == 2);
      auto ref0 = make_optimizer(alone(cfg, 0), {&ref[0], &ref[2]});
      auto ref1 = make_optimizer(alone(cfg, 1), {&ref[1], &ref[3]});
      for (int step = 0; step < 3; ++step) {
        new_grads(grouped, step);
        new_grads(ref, step);
        // A clipped step: the coefficient from the statistics, the same for both.
        Tensor stats = Tensor::zeros(Shape{kStepStats}, DType::f64);
        stats.data<double>()[kGradSq] = 400.0 + step;
        const std::vector<double> lrs{0.01 * (1 + step), 0.05 / (1 + step)};
        opt->step(lrs, stats, max_norm);
        ref0->step(lrs[0], stats, max_norm);
        ref1->step(lrs[1], stats, max_norm);
      }
      for (size_t i = 0; i < grouped.size(); ++i) {
        INFO("parameter " << i);
        CHECK(same_bits(grouped[i].value, ref[i].value));
        CHECK_FALSE(same_bits(grouped[i].value, seeded_params(1)[i].value));  // it moved
      }
      // The groups differ: group 1's parameter at the default group's rate would land elsewhere.
      std::vector<Param> wrong = seeded_params(1);
      auto all_default = make_optimizer(alone(cfg, 0), {&wrong[1]});
      for (int step = 0; step < 3; ++step) {
        new_grads(wrong, step);
        all_default->step(0.01 * (1 + step));
      }
      CHECK_FALSE(same_bits(wrong[1].value, grouped[1].value));
    }
}

TEST_CASE("each group follows the schedule from its own rate, as torch's lr_scheduler steps each param group",
          "[cpu]") {
  OptimizerConfig cfg;
  cfg.type = OptimizerType::sgd;
  cfg.lr = 0.1;
  for (const double lr : {0.001, 0.0}) {
    ParamGroupConfig g;
    g.params = {"x"};
    g.lr = lr;
    cfg.param_groups.push_back(g);
  }
  std::vector<Param> ps;
  for (int i = 0; i < 3; ++i)
    ps.push_back({"p", Tensor::zeros(Shape{1}, DType::f64), Tensor::zeros(Shape{1}, DType::f64)});
  std::vector<Param*> ptrs{&ps[0], &ps[1], &ps[2]};
  auto opt = make_optimizer(cfg, ptrs, {0, 1, 2});
  SchedulerConfig s;
  s.type = ScheduleType::cosine;
  s.eta_min = 0.01;  // above group 1's rate: a rate scaled from the default group's would not rise towards it
  s.warmup_steps = 3;
  s.warmup_start_factor = 0.25;
  const int64_t total = 12;
  const double lr_scale = 0.5;  // a rollback's factor
  for (const int64_t t : {0, 1, 2, 3, 6, 11}) {
    INFO("step " << t);
    const std::vector<double> lrs = group_lrs(cfg, s, t, total, lr_scale);
    const std::vector<double> got = applied_rates(*opt, ps, lrs);
    for (size_t g = 0; g < 3; ++g) {
      INFO("group " << g);
      CHECK(got[g] == scheduled_lr(s, cfg.group_lr(g), t, total) * lr_scale);
    }
    // The default group's rate is the one the trainer computed before groups existed (and logs).
    CHECK(lrs[0] == scheduled_lr(s, cfg.lr, t, total) * lr_scale);
  }
  CHECK(group_lrs(cfg, s, 11, total, 1)[1] > 0.001);  // eta_min is each group's floor, as in torch
  // onecycle with an explicit max_lr: each group's peak is max_lr × lr_g / lr.
  s = {};
  s.type = ScheduleType::onecycle;
  s.max_lr = 1.0;
  s.pct_start = 0.5;
  double peak0 = 0, peak1 = 0;
  for (int64_t t = 0; t < 10; ++t) {
    const std::vector<double> lrs = group_lrs(cfg, s, t, 10, 1);
    peak0 = std::max(peak0, lrs[0]);
    peak1 = std::max(peak1, lrs[1]);
    CHECK(lrs[2] == 0);
  }
  CHECK(peak0 == Approx(1.0));
  CHECK(peak1 == Approx(0.01));
}

TEST_CASE("param_groups: an unmatched pattern, an unknown key or a bad lr is a ConfigError naming the key",
          "[cpu][config]") {
  const ConfigNode root = ConfigNode::load_string(kGroupsYaml, "t.yaml");
  const Experiment exp = parse_experiment_without_data_files(root);
  REQUIRE(exp.optimizer.param_groups.size() == 2);
  CHECK(exp.optimizer.group_lr(1) == 0.1);
  CHECK(exp.optimizer.group_weight_decay(1) == 0.01);  // adamw's default, from the top level
  CHECK(exp.optimizer.group_lr(2) == 0.01);
  CHECK(exp.optimizer.group_weight_decay(2) == 0.0);
  const std::vector<std::string> names{"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"};
  // layers.0.nothing* matches nothing: named with its group's key and line.
  CHECK_THAT(error_of([&] { param_group_of(exp.optimizer, names); }),
             Catch::Contains("optimizer.param_groups[1].params") && Catch::Contains("layers.0.nothing*") &&
                 Catch::Contains("t.yaml:16:"));
  // The first group that matches takes a parameter: layers.2.bias is group 1's, not the bias group's.
  OptimizerConfig ok = exp.optimizer;
  ok.param_groups[1].params.pop_back();
  CHECK(param_group_of(ok, names) == std::vector<int>{0, 2, 1, 1});
  auto bad = [](const std::string& from, const std::string& to) {
    std::string y = kGroupsYaml;
    y.replace(y.find(from), from.size(), to);
    return error_of([&] { parse_experiment_without_data_files(ConfigNode::load_string(y, "t.yaml")); });
  };
  CHECK_THAT(bad("      lr: 0.1", "      momentum: 0.1"),
             Catch::Contains("optimizer.param_groups[0]") && Catch::Contains("momentum"));
  CHECK_THAT(bad("      lr: 0.1", "      lr: -0.1"), Catch::Contains("optimizer.param_groups[0].lr"));
  CHECK_THAT(bad("      lr: 0.1", "      lr: fast"), Catch::Contains("optimizer.param_groups[0].lr"));
  CHECK_THAT(bad(R"(params: ["layers.2.*"])", "params: []"), Catch::Contains("optimizer.param_groups[0].params"));
  CHECK_THAT(
      bad("    - params: [\"*.bias\", \"layers.0.nothing*\"]\n      weight_decay: 0\n", "    - weight_decay: 0.5\n"),
      Catch::Contains("optimizer.param_groups[1]") && Catch::Contains("params"));
}

TEST_CASE("dist.zero: a sharded two-group step equals the unsharded one", "[cpu][dist]") {
  const OptimizerConfig cfg = two_groups(OptimizerType::adamw);
  std::vector<Param> plain = seeded_params(2);
  std::vector<Param*> plain_ptrs;
  for (Param& p : plain) plain_ptrs.push_back(&p);
  auto ref = make_optimizer(cfg, plain_ptrs, kGroups);
  const std::vector<double> lrs{0.02, 0.07};
  ref->step(lrs, Tensor::zeros(Shape{kStepStats}, DType::f64), 0);
  constexpr int kRanks = 3;
  for (const int stage : {1, 2}) {
    INFO("stage " << stage);
    auto comms = make_thread_comms(kRanks, 30.0);
    std::vector<std::vector<Param>> replicas(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
      threads.emplace_back([&, r] {
        auto& mine = replicas[static_cast<size_t>(r)];
        mine = seeded_params(2);
        std::vector<Param*> ptrs;
        for (Param& p : mine) ptrs.push_back(&p);
        // One bucket: the slices cut across parameters of both groups.
        ZeroOptimizer zero(cfg, ptrs, plan_buckets({ptrs}, 1e3), *comms[static_cast<size_t>(r)], stage, kGroups);
        if (stage == 2)  // the shard's gradients: this rank's chunk of the (here unreduced) whole
          for (size_t b = 0; b < zero.grad_chunks().size(); ++b) {
            const Tensor& chunk = zero.grad_chunks()[b];
            const int64_t n = chunk.numel(), begin = n * r;
            int64_t at = 0;
            for (Param& p : mine)
              for (int64_t k = 0; k < p.grad.numel(); ++k, ++at)
                if (at >= begin && at < begin + n) chunk.data<float>()[at - begin] = p.grad.data<float>()[k];
          }
        zero.step(lrs, Tensor::zeros(Shape{kStepStats}, DType::f64), 0);
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r)
      for (size_t i = 0; i < plain.size(); ++i) {
        INFO("rank " << r << " parameter " << i);
        CHECK(same_bits(replicas[static_cast<size_t>(r)][i].value, plain[i].value));
      }
  }
}

TEST_CASE("a run with a param group at lr 0 keeps its weights bit for bit and writes the groups back", "[e2e]") {
  TempDir dir;
  std::string yaml = kTinyConfig;
  yaml.replace(yaml.find("optimizer: {type: sgd, lr: 0.1}"), 31,
               "optimizer:\n  type: adamw\n  lr: 0.01\n  weight_decay: 0.1\n  param_groups:\n"
               "    - params: [\"layers.0.*\"]\n      lr: 0\n    - params: [\"*.bias\"]\n      weight_decay: 0\n");
  write_text(dir / "g.yaml", yaml);
  write_text(dir / "t.yaml", kTinyConfig);
  // The fresh weights of the same seed: SGD at lr 1e-30 moves no weight by a bit.
  const auto fresh = run_gputrain(
      fmt::format("train {} --quiet --threads 2 --out {} --set optimizer.lr=1e-30", dir / "t.yaml", dir / "fresh"));
  INFO(fresh.output);
  REQUIRE(fresh.exit_code == 0);
  const auto r = run_gputrain(fmt::format("train {} --threads 2 --no-progress --out {}", dir / "g.yaml", dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto weights = [](const std::string& path) {
    std::map<std::string, std::vector<float>> out;
    for (const auto& [name, t] : read_safetensors(path))
      out[name] = std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
    return out;
  };
  const auto before = weights(dir / "fresh/model.safetensors"), after = weights(dir / "run/model.safetensors");
  REQUIRE(before.count("layers.0.weight"));
  CHECK(bit_differences(after.at("layers.0.weight"), before.at("layers.0.weight")) == 0);
  CHECK(bit_differences(after.at("layers.0.bias"), before.at("layers.0.bias")) == 0);
  CHECK(bit_differences(after.at("layers.2.weight"), before.at("layers.2.weight")) > 0);  // the default group trains
  CHECK(bit_differences(after.at("layers.2.bias"), before.at("layers.2.bias")) > 0);
  // config.resolved.yaml keeps the groups with the keys they gave, and runs again as a config.
  const std::string resolved = read_text(dir / "run/config.resolved.yaml");
  CHECK_THAT(resolved, Catch::Contains("param_groups") && Catch::Contains("layers.0.*"));
  // The log says what each group holds: layers.0's bias is the first group's, which matches it first.
  const std::string log = read_text(dir / "run/train.log");
  CHECK_THAT(
      log, Catch::Contains("optimizer group 0 [the rest]: lr 0.01, weight_decay 0.1, 1 parameters (48 elements)") &&
               Catch::Contains("optimizer group 1 [layers.0.*]: lr 0, weight_decay 0.1, 2 parameters (144 elements)") &&
               Catch::Contains("optimizer group 2 [*.bias]: lr 0.01, weight_decay 0, 1 parameters (3 elements)"));
  const auto again = run_gputrain(fmt::format("check {}", dir / "run/config.resolved.yaml"));
  INFO(again.output);
  CHECK(again.exit_code == 0);
  // A pattern that matches no parameter stops the run with exit 2 at its key.
  const auto none = run_gputrain(
      fmt::format("train {} --quiet --threads 2 --out {} --set 'optimizer.param_groups[0].params=[head.*]'",
                  dir / "g.yaml", dir / "none"));
  CHECK(none.exit_code == 2);
  CHECK_THAT(none.output, Catch::Contains("optimizer.param_groups[0].params") && Catch::Contains("head.*"));
}
