// Adam and AdamW (optionally AMSGrad), exactly as torch.optim defines them.
#include "core/backend.h"
#include "ops/optim.h"
#include "optim/optimizer.h"

#include <cmath>

namespace gt {
namespace {

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerConfig& cfg, const std::vector<Param*>& params, const std::vector<int>& groups)
      : Optimizer(cfg, params, groups), m_cfg(cfg) {
    for (size_t i = 0; i < params.size(); ++i) {
      const Param* p = params[i];
      const auto& v = p->value;
      // Named in an out-of-memory error: the optimizer state is often what does not fit.
      const AllocLabel label(optimizer_state_label("exp_avg, exp_avg_sq", *p, i));
      m_m.push_back(Tensor::zeros(v.shape(), v.dtype(), v.device()));
      m_v.push_back(Tensor::zeros(v.shape(), v.dtype(), v.device()));
      m_vmax.push_back(cfg.amsgrad ? Tensor::zeros(v.shape(), v.dtype(), v.device()) : Tensor());
      m_group.rows.push_back({p->value, p->grad, m_m.back(), m_v.back(), m_vmax.back()});
    }
  }

  void step(std::span<const double> lrs, const Tensor& stats, double max_norm) override {
    const AdamHyper h = hyper(lrs[0]);
    const std::vector<ops::GroupRate> rates = group_rates(lrs);
    put_hyper(h, rates);
    if (!m_group.rows.empty()) ops::adam_step_group(h, m_cfg.amsgrad, m_group, stats, max_norm, rates);
    ++m_steps;
  }

  void stage_hyper(std::span<const double> lrs) override { put_hyper(hyper(lrs[0]), group_rates(lrs)); }

  std::vector<std::pair<std::string, Tensor*>> state() override {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (size_t i = 0; i < m_m.size(); ++i) {
      out.emplace_back(std::to_string(i) + ".exp_avg", &m_m[i]);
      out.emplace_back(std::to_string(i) + ".exp_avg_sq", &m_v[i]);
      if (m_cfg.amsgrad) out.emplace_back(std::to_string(i) + ".max_exp_avg_sq", &m_vmax[i]);
    }
    return out;
  }

 private:
  AdamHyper hyper(double lr) const {
    const double t = static_cast<double>(m_steps + 1);
    return {lr,
            m_cfg.beta1,
            m_cfg.beta2,
            m_cfg.eps,
            m_cfg.weight_decay,
            1.0 - std::pow(m_cfg.beta1, t),
            std::sqrt(1.0 - std::pow(m_cfg.beta2, t)),
            m_cfg.type == OptimizerType::adamw};
  }

  OptimizerConfig m_cfg;
  std::vector<Tensor> m_m, m_v, m_vmax;  // m_group's rows: value, grad, m, v, vmax
};

}  // namespace

std::unique_ptr<Optimizer> make_adam(const OptimizerConfig& cfg, const std::vector<Param*>& params,
                                     const std::vector<int>& groups) {
  return std::make_unique<Adam>(cfg, params, groups);
}

}  // namespace gt
