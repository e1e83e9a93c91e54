// Adam and AdamW (optionally AMSGrad), exactly as torch.optim defines them.
#include "ops/ops.h"
#include "optim/optimizer.h"

#include <cmath>

namespace gt {
namespace {

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerConfig& cfg, const std::vector<Param*>& params) : m_cfg(cfg), m_params(params) {
    for (Param* p : params) {
      const auto& v = p->value;
      m_m.push_back(Tensor::zeros(v.shape(), v.dtype(), v.device()));
      m_v.push_back(Tensor::zeros(v.shape(), v.dtype(), v.device()));
      m_vmax.push_back(cfg.amsgrad ? Tensor::zeros(v.shape(), v.dtype(), v.device()) : Tensor());
    }
  }

  void step(double lr) override {
    const double t = static_cast<double>(m_steps + 1);
    const AdamHyper h{lr,
                      m_cfg.beta1,
                      m_cfg.beta2,
                      m_cfg.eps,
                      m_cfg.weight_decay,
                      1.0 - std::pow(m_cfg.beta1, t),
                      std::sqrt(1.0 - std::pow(m_cfg.beta2, t)),
                      m_cfg.type == "adamw"};
    for (size_t i = 0; i < m_params.size(); ++i)
      ops::adam_step(h, m_cfg.amsgrad, m_params[i]->value, m_params[i]->grad, m_m[i], m_v[i], m_vmax[i]);
    ++m_steps;
  }

  std::vector<std::pair<std::string, Tensor*>> state() override {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (size_t i = 0; i < m_params.size(); ++i) {
      out.emplace_back(std::to_string(i) + ".exp_avg", &m_m[i]);
      out.emplace_back(std::to_string(i) + ".exp_avg_sq", &m_v[i]);
      if (m_cfg.amsgrad) out.emplace_back(std::to_string(i) + ".max_exp_avg_sq", &m_vmax[i]);
    }
    return out;
  }

 private:
  OptimizerConfig m_cfg;
  std::vector<Param*> m_params;
  std::vector<Tensor> m_m, m_v, m_vmax;
};

}  // namespace

std::unique_ptr<Optimizer> make_adam(const OptimizerConfig& cfg, const std::vector<Param*>& params) {
  return std::make_unique<Adam>(cfg, params);
}

}  // namespace gt
