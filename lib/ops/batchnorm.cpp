// The contract of batch normalisation (ops/batchnorm.h): shapes, dtypes and devices, then the backend's entry point.
#include "ops/batchnorm.h"

#include "ops/dispatch.h"

namespace gt::ops {
namespace {

// The synchronised variants have a CPU implementation only.
void require_cpu(const Operands& op) {
  if (!op.device().is_cpu())
    throw Error(fmt::format("dist.sync_batchnorm: synchronised batch norm on {} is not built", op.device().str()));
}

// The epilogues' shapes: y is x's with a 2×2 pool's ⌊H/2⌋ × ⌊W/2⌋, or x's own.
void check_epilogue(const Tensor& x, const Tensor& y, const Epilogue& ep, const char* op) {
  if (ep.max_pool_2x2)
    GT_CHECK(x.rank() == 4 && y.rank() == 4 && y.dim(0) == x.dim(0) && y.dim(1) == x.dim(1) &&
                 y.dim(2) == x.dim(2) / 2 && y.dim(3) == x.dim(3) / 2 && y.dim(2) >= 1 && y.dim(3) >= 1,
             "{}: x {} y {} for a 2×2 pool", op, x.shape().str(), y.shape().str());
  else
    GT_CHECK(y.numel() == x.numel(), "{}: x {} y {}", op, x.shape().str(), y.shape().str());
}

}  // namespace

void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                       Tensor& save_invstd, Tensor& y) {
  const Operands op("batchnorm", {&x, &gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd, &y});
  GT_CHECK(x.rank() >= 2 && x.dim(1) == gamma.numel() && y.numel() == x.numel(), "batchnorm x {} gamma {}",
           x.shape().str(), gamma.shape().str());
  GT_DISPATCH(op, batchnorm_forward(x, gamma, beta, running_mean, running_var, momentum, eps, training, save_mean,
                                    save_invstd, y));
}

void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                        const Tensor& dy, bool training, Tensor& dx, Tensor& dgamma, Tensor& dbeta, double beta) {
  const Operands op("batchnorm_backward", {&x, &gamma, &dy, &dx, &dgamma, &dbeta}, {&save_mean, &save_invstd});
  GT_CHECK(dy.numel() == x.numel() && (!dx.defined() || dx.numel() == x.numel()), "batchnorm_backward sizes");
  GT_DISPATCH(op, batchnorm_backward(x, gamma, save_mean, save_invstd, dy, training, dx, dgamma, dbeta, beta));
}

int64_t batchnorm_forward_sync(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                               Tensor& running_var, double momentum, double eps, Tensor& save_mean, Tensor& save_invstd,
                               Tensor& y, const SumOverRanks& sum_over_ranks) {
  const Operands op("batchnorm_sync", {&x, &gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd, &y});
  GT_CHECK(x.rank() >= 2 && x.dim(1) == gamma.numel() && y.numel() == x.numel(), "batchnorm x {} gamma {}",
           x.shape().str(), gamma.shape().str());
  require_cpu(op);
  return cpu::batchnorm_forward_sync(x, gamma, beta, running_mean, running_var, momentum, eps, save_mean, save_invstd,
                                     y, sum_over_ranks);
}

void batchnorm_backward_sync(const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                             const Tensor& dy, int64_t global_count, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                             double beta, const SumOverRanks& sum_over_ranks) {
  const Operands op("batchnorm_sync_backward", {&x, &gamma, &dy, &dx, &dgamma, &dbeta}, {&save_mean, &save_invstd});
  GT_CHECK(dy.numel() == x.numel() && (!dx.defined() || dx.numel() == x.numel()), "batchnorm_backward sizes");
  require_cpu(op);
  cpu::batchnorm_backward_sync(x, gamma, save_mean, save_invstd, dy, global_count, dx, dgamma, dbeta, beta,
                               sum_over_ranks);
}

void batchnorm_epilogue_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                                Tensor& running_var, double momentum, double eps, bool training, Tensor& save_mean,
                                Tensor& save_invstd, Tensor& save_scale, Tensor& save_shift, const Epilogue& ep,
                                Tensor& y) {
  const Operands op("batchnorm_epilogue", {&x, &gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd,
                                           &save_scale, &save_shift, &y});
  GT_CHECK(x.rank() >= 2 && x.dim(1) == gamma.numel() && save_scale.numel() == gamma.numel() &&
               save_shift.numel() == gamma.numel(),
           "batchnorm_epilogue x {} gamma {}", x.shape().str(), gamma.shape().str());
  check_epilogue(x, y, ep, "batchnorm_epilogue");
  GT_CHECK(op.device().is_cpu(), "batchnorm_epilogue on {}: the epilogues are CPU-only", op.device().str());
  cpu::batchnorm_epilogue_forward(x, gamma, beta, running_mean, running_var, momentum, eps, training, save_mean,
                                  save_invstd, save_scale, save_shift, ep, y);
}

void batchnorm_epilogue_backward(const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                                 const Tensor& save_invstd, const Tensor& save_scale, const Tensor& save_shift,
                                 const Epilogue& ep, const Tensor& y, const Tensor& dy, bool training, Tensor& dx,
                                 Tensor& dgamma, Tensor& dbeta, double beta) {
  const Operands op("batchnorm_epilogue_backward", {&x, &gamma, &y, &dy, &dx, &dgamma, &dbeta},
                    {&save_mean, &save_invstd, &save_scale, &save_shift});
  check_epilogue(x, y, ep, "batchnorm_epilogue_backward");
  GT_CHECK(dy.shape() == y.shape() && (!dx.defined() || dx.numel() == x.numel()), "batchnorm_epilogue_backward sizes");
  GT_CHECK(op.device().is_cpu(), "batchnorm_epilogue_backward on {}: the epilogues are CPU-only", op.device().str());
  cpu::batchnorm_epilogue_backward(x, gamma, save_mean, save_invstd, save_scale, save_shift, ep, y, dy, training, dx,
                                   dgamma, dbeta, beta);
}

}  // namespace gt::ops
