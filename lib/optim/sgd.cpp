// SGD with momentum, dampening, Nesterov and weight decay, exactly as torch.optim.SGD defines them.
#include "ops/optim.h"
#include "optim/optimizer.h"

#include "core/backend.h"

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
    const SgdHyper h = hyper(lr);
    put_hyper(h);
    if (!m_group.rows.empty()) ops::sgd_step_group(h, m_group, stats, max_norm);
    ++m_steps;
  }

  void stage_hyper(double lr) override { put_hyper(hyper(lr)); }

  std::vector<std::pair<std::string, Tensor*>> state() override {
    std::vector<std::pair<std::string, Tensor*>> out;
    for (size_t i = 0; i < m_momentum.size(); ++i)
      if (m_momentum[i].defined()) out.emplace_back(std::to_string(i) + ".momentum_buffer", &m_momentum[i]);
    return out;
  }

 private:
  SgdHyper hyper(double lr) const {
    return {lr, m_cfg.momentum, m_cfg.dampening, m_cfg.weight_decay, m_cfg.nesterov, m_steps == 0};
  }

  OptimizerConfig m_cfg;
  std::vector<Tensor> m_momentum;  // m_group's rows: value, grad, momentum
};

}  // namespace

void Optimizer::step(double lr) {
  if (!m_always_ok.defined()) m_always_ok = Tensor::zeros(Shape{kStepStats}, DType::f64, m_device);
  step(lr, m_always_ok, 0);
}

void Optimizer::hyper_on_device() {
  if (m_device.is_cpu() || m_group.hyper.defined()) return;
  // Room for either optimizer's hyperparameters (a few doubles and flags).
  static_assert(sizeof(AdamHyper) <= 256 && sizeof(SgdHyper) <= 256);
  m_group.hyper = Tensor::zeros(Shape{32}, DType::f64, m_device);
}

void Optimizer::write_hyper_bytes(const void* h, size_t bytes) {
  // From pageable host memory: the copy has taken the bytes when it returns (CUDA stages such a copy at once), so
  // `h` may live on the caller's stack; on the device it runs in stream order before the update that reads it.
  backend_copy_async(m_group.hyper.raw(), m_device, h, Device::cpu(), bytes);
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
