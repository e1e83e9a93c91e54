// optimizer.param_groups on a GPU: the fused update reads each row's rate and weight decay from its group, as
// kernel arguments and, under train.cuda_graphs, from the device block each step writes, and matches the CPU.
// Without a usable device each case prints why and exits with ctest's skip code (cuda_helpers.h).
#include "cuda_helpers.h"
#include "ops/stream.h"
#include "optim/optimizer.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

// Rows of one element, a ragged block, and several 2^16-element chunks, alternating between the groups.
const std::vector<int64_t> kSizes{1, 70001, 31, 65536 + 3};
const std::vector<int> kGroups{1, 0, 1, 0};

std::vector<Param> params_on(Device device) {
  std::vector<Param> out;
  uint64_t seed = 301;
  for (const int64_t n : kSizes) {
    Tensor v = seeded(Shape{n}, seed), g = seeded(Shape{n}, seed + 1, -0.5, 0.5);
    out.push_back(Param{"p", device.is_cuda() ? to_cuda(v) : v, device.is_cuda() ? to_cuda(g) : g});
    seed += 2;
  }
  return out;
}

std::vector<Param*> pointers(std::vector<Param>& ps) {
  std::vector<Param*> out;
  for (Param& p : ps) out.push_back(&p);
  return out;
}

}  // namespace

TEST_CASE("CUDA two-group steps match the CPU, with kernel arguments and replayed from a captured graph", "[cuda]") {
  require_gpu();
  // Each step's rates differ per group, and change every step: a replay must read them from the device block.
  const std::vector<std::vector<double>> lrs = {{0.01, 0.1}, {0.02, 0.05}, {0.005, 0.2}, {0.03, 0.0}};
  for (const OptimizerType type : {OptimizerType::sgd, OptimizerType::adamw}) {
    INFO(to_string(type));
    OptimizerConfig cfg;
    cfg.type = type;
    cfg.lr = 0.01;
    cfg.momentum = 0.9;
    cfg.weight_decay = 0.1;
    ParamGroupConfig g;
    g.params = {"p"};
    g.lr = 0.1;
    g.weight_decay = 0.0;
    cfg.param_groups.push_back(g);
    std::vector<Param> cpu = params_on(Device::cpu()), plain = params_on(Device::cuda(0)),
                       graphed = params_on(Device::cuda(0));
    auto on_cpu = make_optimizer(cfg, pointers(cpu), kGroups);
    auto op_by_op = make_optimizer(cfg, pointers(plain), kGroups);
    auto replayed = make_optimizer(cfg, pointers(graphed), kGroups);
    replayed->hyper_on_device();
    const Tensor stats_host = Tensor::zeros(Shape{kStepStats}, DType::f64);
    const Tensor stats = to_cuda(stats_host);  // finite: the gate is open
    for (const auto& step : lrs) {
      on_cpu->step(step, stats_host, 0);
      op_by_op->step(step, stats, 0);
    }
    replayed->step(lrs[0], stats, 0);  // a warm-up step makes the group's device table (host work)
    StepGraph graph(Device::cuda(0));
    replayed->stage_hyper(lrs[1]);
    graph.begin_capture();
    replayed->set_capturing(true);
    replayed->step(lrs[1], stats, 0);
    replayed->set_capturing(false);
    graph.end_capture("the optimizer update");
    graph.launch();
    for (size_t i = 2; i < lrs.size(); ++i) {
      replayed->stage_step(lrs[i]);
      graph.launch();
    }
    for (size_t i = 0; i < kSizes.size(); ++i) {
      INFO("parameter " << i << " in group " << kGroups[i]);
      const Tensor a = to_host(plain[i].value), b = to_host(graphed[i].value);
      CHECK(std::memcmp(a.raw(), b.raw(), a.bytes()) == 0);  // the same kernel on the same rates: bit for bit
      // ops/math.h's update on both sides in f32; nvcc contracts a·b + c into FMAs the CPU build may round twice,
      // a few ulp per step over four steps of values up to 4: 1e-6 + 1e-5·|cpu|, as the single-group tests.
      check_close(a, cpu[i].value, 1e-6, 1e-5);
    }
  }
}
