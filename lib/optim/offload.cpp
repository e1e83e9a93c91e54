// The host side of dist.offload: optimizer (optim/offload.h).
#include "optim/offload.h"

#include "ops/math.h"

#include <omp.h>

#include <utility>

namespace gt {

OffloadOptimizer::OffloadOptimizer(const OptimizerConfig& cfg, const std::vector<Param*>& params,
                                   const std::vector<int>& groups, bool delayed)
    : Optimizer(cfg, params, groups), m_params(params), m_delayed(delayed) {
  m_host.reserve(params.size());  // m_inner keeps pointers to them
  for (Param* p : params) {
    GT_CHECK(p->value.dtype() == DType::f32, "dist.offload keeps f32 master weights, not {} ({})",
             dtype_name(p->value.dtype()), p->name);
    Tensor value = Tensor::empty_pinned(p->value.shape(), DType::f32);
    value.copy_from(p->value);
    m_host.push_back({p->name, value, Tensor::zeros(p->value.shape(), DType::f32)});
    m_group.rows.push_back({p->value, p->grad});  // the norm is summed where the gradients are
  }
  std::vector<Param*> rows;
  for (Param& p : m_host) rows.push_back(&p);
  m_inner = make_optimizer(cfg, rows, groups);
  m_stats = Tensor::zeros(Shape{kStepStats}, DType::f64);
}

OffloadOptimizer::~OffloadOptimizer() {
  if (m_update.joinable()) m_update.join();
}

void OffloadOptimizer::step(std::span<const double> lrs, const Tensor& stats, double max_norm) {
  settle();  // delayed: the last step's update, into the parameters before this one's starts
  // Each copy to the host waits for the device's work on its source: the backward pass that wrote the gradients,
  // the norm that summed them into the statistics.
  for (size_t i = 0; i < m_params.size(); ++i) m_host[i].grad.copy_from(m_params[i]->grad);
  m_stats.copy_from(stats);
  m_inner->set_steps_taken(m_steps);  // undo_step and set_steps_taken reach this one: Adam's bias correction
  ++m_steps;
  if (!m_delayed) {
    m_inner->step(lrs, m_stats, max_norm);
    put_weights();
    return;
  }
  // On a thread of its own, with one OpenMP thread: the training thread's passes keep the cores they were given.
  // It touches the host buffers alone, which nothing reads before settle() has joined it.
  const std::vector<double> rates(lrs.begin(), lrs.end());
  m_update = std::thread([this, rates, max_norm] {
    try {
      omp_set_num_threads(1);
      m_inner->step(rates, m_stats, max_norm);
    } catch (...) {
      m_error = std::current_exception();
    }
  });
}

bool OffloadOptimizer::settle() {
  if (!m_update.joinable()) return false;
  m_update.join();
  if (m_error) std::rethrow_exception(std::exchange(m_error, nullptr));
  put_weights();
  return true;
}

void OffloadOptimizer::put_weights() {
  for (size_t i = 0; i < m_params.size(); ++i) m_params[i]->value.copy_from(m_host[i].value);
}

void OffloadOptimizer::take_weights() {
  if (m_update.joinable()) {  // an update of weights that are being replaced: finished, and not applied
    m_update.join();
    m_error = nullptr;
  }
  for (size_t i = 0; i < m_params.size(); ++i) m_host[i].value.copy_from(m_params[i]->value);
}

int64_t OffloadOptimizer::host_bytes() const {
  int64_t n = 0;
  for (const Param& p : m_host) n += p.value.bytes() + p.grad.bytes();
  for (const auto& [name, t] : m_inner->state()) n += t->bytes();
  return n;
}

}  // namespace gt
