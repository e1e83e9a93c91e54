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
    const SgdHyper h{static_cast<float>(lr),
                     static_cast<float>(m_cfg.momentum),
                     static_cast<float>(m_cfg.dampening),
                     static_cast<float>(m_cfg.weight_decay),
                     m_cfg.nesterov,
                     m_steps == 0};
    for (size_t i = 0; i < m_params.size(); ++i) ops::sgd_step(h, m_params[i]->value, m_params[i]->grad, m_momentum[i]);
    ++m_steps;
  }

 private:
  OptimizerConfig m_cfg;
  std::vector<Param*> m_params;
  std::vector<Tensor> m_momentum;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params) {
  if (cfg.type == "sgd") return std::make_unique<Sgd>(cfg, params);
  throw Error(fmt::format("unknown optimizer {}", cfg.type));
}

}  // namespace gt
