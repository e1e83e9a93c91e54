// SGD with momentum, dampening, Nesterov and weight decay, exactly as torch.optim.SGD defines them.
#include "ops/optim.h"
#include "optim/optimizer.h"

#include "core/backend.h"

#include <array>
#include <cstddef>
#include <cstring>

namespace gt {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerConfig& cfg, const std::vector<Param*>& params, const std::vector<int>& groups)
      : Optimizer(cfg, params, groups), m_cfg(cfg) {
    for (size_t i = 0; i < params.size(); ++i) {
      const Param* p = params[i];
      const AllocLabel label(optimizer_state_label("momentum", *p, i));  // named in an out-of-memory error
      m_momentum.push_back(cfg.momentum != 0 ? Tensor::zeros(p->value.shape(), p->value.dtype(), p->value.device())
                                             : Tensor());
      m_group.rows.push_back({p->value, p->grad, m_momentum.back()});
    }
  }

  void step(std::span<const double> lrs, const Tensor& stats, double max_norm) override {
    const SgdHyper h = hyper(lrs[0]);
    const std::vector<ops::GroupRate> rates = group_rates(lrs);
    put_hyper(h, rates);
    if (!m_group.rows.empty()) ops::sgd_step_group(h, m_group, stats, max_norm, rates);
    ++m_steps;
  }

  void stage_hyper(std::span<const double> lrs) override { put_hyper(hyper(lrs[0]), group_rates(lrs)); }

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

Optimizer::Optimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params, const std::vector<int>& groups)
    : m_param_group(groups) {
  static_assert(kMaxParamGroups == ops::kMaxGroupRates);
  if (!params.empty()) m_device = params[0]->value.device();
  for (size_t g = 0; g < cfg.groups(); ++g) m_base.push_back({cfg.group_lr(g), cfg.group_weight_decay(g)});
  GT_CHECK(groups.empty() || groups.size() == params.size(), "{} parameter groups for {} parameters", groups.size(),
           params.size());
  for (const int g : groups) GT_CHECK(g >= 0 && static_cast<size_t>(g) < m_base.size(), "parameter group {}", g);
  if (m_param_group.empty()) m_param_group.assign(params.size(), 0);
  // Without param_groups every row is in group 0: the group table stays empty.
  if (m_base.size() > 1) m_group.row_group.assign(m_param_group.begin(), m_param_group.end());
}

std::vector<ops::GroupRate> Optimizer::group_rates(std::span<const double> lrs) const {
  GT_CHECK(lrs.size() == m_base.size(), "{} learning rates for {} parameter groups", lrs.size(), m_base.size());
  std::vector<ops::GroupRate> out(m_base.size());
  for (size_t g = 0; g < out.size(); ++g) out[g] = {lrs[g], m_base[g].weight_decay};
  return out;
}

std::vector<double> Optimizer::rates_at(double lr) const {
  std::vector<double> out{lr};
  for (size_t g = 1; g < m_base.size(); ++g) out.push_back(m_base[g].lr * (lr / m_base[0].lr));
  return out;
}

void Optimizer::step(double lr) {
  if (!m_always_ok.defined()) m_always_ok = Tensor::zeros(Shape{kStepStats}, DType::f64, m_device);
  step(lr, m_always_ok, 0);
}

void Optimizer::hyper_on_device() {
  if (m_device.is_cpu() || m_group.hyper.defined()) return;
  // Room for either optimizer's hyperparameters (a few doubles and flags), then the groups' rates.
  m_group.hyper = Tensor::zeros(Shape{ops::kHyperDoubles}, DType::f64, m_device);
}

void Optimizer::write_hyper_bytes(const void* h, size_t bytes, std::span<const ops::GroupRate> rates) {
  // One copy of the block ops/optim.h lays out: the hyperparameters, then the rates.
  std::array<std::byte, ops::kHyperDoubles * sizeof(double)> block{};
  std::memcpy(block.data(), h, bytes);
  std::memcpy(block.data() + ops::kHyperRatesOffset, rates.data(), rates.size_bytes());
  // From pageable host memory: the copy has taken the bytes when it returns (CUDA stages such a copy at once), so
  // the block may live on the stack; on the device it runs in stream order before the update that reads it.
  backend_copy_async(m_group.hyper.raw(), m_device, block.data(), Device::cpu(),
                     ops::kHyperRatesOffset + rates.size_bytes());
}

std::vector<StateRange> Optimizer::state_ranges() {
  std::vector<StateRange> out;
  for (auto& [name, t] : state()) {  // "<parameter index>.<buffer>"
    const size_t dot = name.find('.');
    out.push_back({std::stoul(name.substr(0, dot)), name.substr(dot + 1), 0, t->view(Shape{t->numel()})});
  }
  return out;
}

namespace {
thread_local const std::vector<std::pair<std::string, Param*>>* t_param_names = nullptr;
}  // namespace

ParamNames::ParamNames(const std::vector<std::pair<std::string, Param*>>& named) : m_previous(t_param_names) {
  t_param_names = &named;
}
ParamNames::~ParamNames() { t_param_names = m_previous; }

std::string optimizer_state_label(const char* buffers, const Param& p, size_t i) {
  std::string of = p.name.empty() ? fmt::format("parameter {}", i) : p.name;
  if (t_param_names)
    for (const auto& [name, param] : *t_param_names)
      if (param == &p) of = name;
  return fmt::format("the optimizer state ({} of {}, {} elements)", buffers, of, p.value.numel());
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params,
                                          const std::vector<int>& groups) {
  if (cfg.type == OptimizerType::sgd) return std::make_unique<Sgd>(cfg, params, groups);
  return make_adam(cfg, params, groups);  // adam, adamw
}

}  // namespace gt
