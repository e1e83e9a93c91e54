// SGD with momentum, dampening, Nesterov and weight decay, exactly as torch.optim.SGD defines them.
#include "ops/optim.h"
#include "optim/optimizer.h"

namespace gt {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerConfig& cfg, const std::vector<Param*>& params) : Optimizer(params), m_cfg(cfg) {
    for (Param* p : params) {
      m_momentum.push_back(cfg.momentum != 0 ? Tensor::zeros(p->value.shape(), p->value.dtype(), p->value.device())
                                             : Tensor());
      m_group.rows.push_back({p->value, p->grad, m_momentum.back()});
    }
  }

  void step(double lr, const Tensor& stats, double max_norm) override {
    const SgdHyper h{lr, m_cfg.momentum, m_cfg.dampening, m_cfg.weight_decay, m_cfg.nesterov, m_steps == 0};
    if (!m_group.rows.empty()) ops::sgd_step_group(h, m_group, stats, max_norm);
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
  std::vector<Tensor> m_momentum;  // m_group's rows: value, grad, momentum
};

}  // namespace

void Optimizer::step(double lr) {
  if (!m_always_ok.defined()) m_always_ok = Tensor::zeros(Shape{kStepStats}, DType::f64, m_device);
  step(lr, m_always_ok, 0);
}

std::vector<StateRange> Optimizer::state_ranges() {
  std::vector<StateRange> out;
  for (auto& [name, t] : state()) {  // "<parameter index>.<buffer>"
    const size_t dot = name.find('.');
    out.push_back({std::stoul(name.substr(0, dot)), name.substr(dot + 1), 0, t->view(Shape{t->numel()})});
  }
  return out;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params) {
  if (cfg.type == OptimizerType::sgd) return std::make_unique<Sgd>(cfg, params);
  return make_adam(cfg, params);  // adam, adamw
}

}  // namespace gt
