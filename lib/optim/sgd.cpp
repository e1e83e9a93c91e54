// SGD with momentum, dampening, Nesterov and weight decay, exactly as torch.optim.SGD defines them.
#include "ops/ops.h"
#include "optim/optimizer.h"

namespace gt {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerConfig& cfg, const std::vector<Param*>& params) : m_cfg(cfg), m_params(params) {
    for (Param* p : params)
      m_momentum.push_back(cfg.momentum != 0 ? Tensor::zeros(p->value.shape(), p->value.dtype(), p->value.device())
                                             : Tensor());
  }

  void step(double lr) override {
    const SgdHyper h{lr, m_cfg.momentum, m_cfg.dampening, m_cfg.weight_decay, m_cfg.nesterov, m_steps == 0};
    for (size_t i = 0; i < m_params.size(); ++i) ops::sgd_step(h, m_params[i]->value, m_params[i]->grad, m_momentum[i]);
    ++m_steps;
  }

  std::vector<std::pair<std::string, Tensor*>> state() override {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (size_t i = 0; i < m_momentum.size(); ++i)
      if (m_momentum[i].defined()) out.emplace_back(std::to_string(i) + ".momentum_buffer", &m_momentum[i]);
    return out;
  }

 private:
  OptimizerConfig m_cfg;
  std::vector<Param*> m_params;
  std::vector<Tensor> m_momentum;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params) {
  if (cfg.type == "sgd") return std::make_unique<Sgd>(cfg, params);
  if (cfg.type == "adam" || cfg.type == "adamw") return make_adam(cfg, params);
  throw Error(fmt::format("unknown optimizer {}", cfg.type));
}

}  // namespace gt
