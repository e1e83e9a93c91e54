// Gradient clipping by global norm.
#include "ops/optim.h"
#include "optim/optimizer.h"

#include <cmath>

namespace gt {

double global_grad_norm(const std::vector<Param*>& params, Tensor& scratch) {
  Tensor norm_sq = scratch.slice0(0, 1);
  norm_sq.zero_();
  for (Param* p : params) ops::sum_squares(p->grad, norm_sq);
  return std::sqrt(norm_sq.data<double>()[0]);
}

double clip_grad_norm(const std::vector<Param*>& params, double max_norm, Tensor& scratch) {
  // The decision needs the norm on the host: one sync per step.
  const double norm = global_grad_norm(params, scratch);
  Tensor coef_t = scratch.slice0(1, 1);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) {
    coef_t.data<double>()[0] = coef;
    for (Param* p : params) ops::scale_by(p->grad, coef_t);
  }
  return norm;
}

}  // namespace gt
