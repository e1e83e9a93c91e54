// Learning-rate schedules as PyTorch's lr_scheduler classes compute them, stepped per optimizer step.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

namespace gt {
namespace {

constexpr double kPi = 3.14159265358979323846;

double schedule_value(const SchedulerConfig& s, double lr, int64_t t, int64_t total) {
  using enum ScheduleType;
  const auto td = static_cast<double>(t);
  if (s.type == step) return lr * std::pow(s.gamma, static_cast<double>(t / s.step_size));
  if (s.type == multistep) {
    const auto passed = std::upper_bound(s.milestones.begin(), s.milestones.end(), t) - s.milestones.begin();
    return lr * std::pow(s.gamma, static_cast<double>(passed));
  }
  if (s.type == exponential) return lr * std::pow(s.gamma, td);
  if (s.type == cosine) {  // CosineAnnealingLR's closed form
    const double period = static_cast<double>(s.t_max > 0 ? s.t_max : std::max<int64_t>(total, 1));
    return s.eta_min + (lr - s.eta_min) * (1 + std::cos(kPi * td / period)) / 2;
  }
  if (s.type == linear) {  // LinearLR
    const int64_t n = s.total_iters > 0 ? s.total_iters : std::max<int64_t>(total, 1);
    const double f = static_cast<double>(std::min(t, n)) / static_cast<double>(n);
    return lr * (s.start_factor + (s.end_factor - s.start_factor) * f);
  }
  if (s.type == onecycle) {  // OneCycleLR, cosine annealing, two phases
    const double max_lr = s.max_lr > 0 ? s.max_lr : lr;
    const double initial = max_lr / s.div_factor, final_lr = initial / s.final_div_factor;
    const double end_up = s.pct_start * static_cast<double>(total) - 1;
    const double end_down = static_cast<double>(total) - 1;
    auto anneal = [](double from, double to, double pct) { return to + (from - to) / 2 * (1 + std::cos(kPi * pct)); };
    if (td <= end_up) return anneal(initial, max_lr, end_up > 0 ? td / end_up : 1.0);
    return anneal(max_lr, final_lr, end_down > end_up ? (td - end_up) / (end_down - end_up) : 1.0);
  }
  return lr;  // constant
}

}  // namespace

double scheduled_lr(const SchedulerConfig& s, double lr, int64_t t, int64_t total_steps) {
  double v = schedule_value(s, lr, t, total_steps);
  if (t < s.warmup_steps) {
    const double f = static_cast<double>(t) / static_cast<double>(s.warmup_steps);
    v *= s.warmup_start_factor + (1 - s.warmup_start_factor) * f;
  }
  return v;
}

std::vector<double> group_lrs(const OptimizerConfig& o, const SchedulerConfig& s, int64_t t, int64_t total_steps,
                              double lr_scale) {
  std::vector<double> out{scheduled_lr(s, o.lr, t, total_steps) * lr_scale};
  for (size_t g = 1; g < o.groups(); ++g) {
    const double lr = o.group_lr(g);
    if (s.type == ScheduleType::onecycle && s.max_lr > 0) {  // the peak scaled as the group's base rate is
      SchedulerConfig scaled = s;
      scaled.max_lr = s.max_lr * (lr / o.lr);
      out.push_back(scheduled_lr(scaled, lr, t, total_steps) * lr_scale);
    } else {
      out.push_back(scheduled_lr(s, lr, t, total_steps) * lr_scale);
    }
  }
  return out;
}

}  // namespace gt
