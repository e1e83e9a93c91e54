// batchnorm1d and batchnorm2d: per-channel normalisation over the batch (or the global batch of a data-parallel
// run with dist.sync_batchnorm), with learned scale and shift and running statistics for evaluation.
#include "ops/batchnorm.h"
#include "core/backend.h"
#include "layers/params.h"

namespace gt {
namespace {

// Batch norm over channel dimension 0 of each sample: [C] or [C, L] (1d), [C, H, W] (2d).
class BatchNorm final : public Layer {
 public:
  BatchNorm(const ConfigNode& cfg, bool two_d)
      : m_two_d(two_d),
        m_momentum(cfg.get_double("momentum", 0.1, 0.0, 1.0)),
        m_eps(cfg.get_double("eps", 1e-5, 0.0, 1.0)) {}

  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    const bool fits = m_two_d ? in[0].rank() == 3 : in[0].rank() == 1 || in[0].rank() == 2;
    if (!fits)
      cfg.fail(fmt::format("{} needs {} inputs, got {}", m_two_d ? "batchnorm2d" : "batchnorm1d",
                           m_two_d ? "[channels, height, width]" : "[features] or [channels, length]", in[0].str()));
    m_channels = in[0][0];
    m_numel = in[0].numel();
    return in[0];
  }

  void init_params(Rng&, DType dtype, Device device) override {
    // torch.nn.BatchNorm*: weight 1, bias 0, running mean 0, running variance 1.
    m_gamma = constant_param("weight", Shape{m_channels}, 1.0, dtype, device);
    m_beta = constant_param("bias", Shape{m_channels}, 0.0, dtype, device);
    m_running_mean = constant_tensor(Shape{m_channels}, 0.0, dtype, device);
    m_running_var = constant_tensor(Shape{m_channels}, 1.0, dtype, device);
    m_save_mean = Tensor::zeros(Shape{m_channels}, dtype, device);
    m_save_invstd = Tensor::zeros(Shape{m_channels}, dtype, device);
    m_save_scale = Tensor::zeros(Shape{m_channels}, dtype, device);
    m_save_shift = Tensor::zeros(Shape{m_channels}, dtype, device);
  }
  std::vector<Param*> params() override { return {&m_gamma, &m_beta}; }
  std::vector<std::pair<std::string, Tensor*>> buffers() override {
    return {{"running_mean", &m_running_mean}, {"running_var", &m_running_var}};
  }

  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext& ctx) override {
    // A recomputing call (train.recompute) normalises with the batch's statistics again, bit for bit as the first
    // call did, but the running statistics took this batch once already: the update goes to a sink of 2C elements,
    // made on the first such call (a training output does not depend on the running statistics).
    Tensor* running_mean = &m_running_mean;
    Tensor* running_var = &m_running_var;
    if (ctx.recompute && ctx.training) {
      if (!m_sink_mean.defined()) {
        const AllocLabel label("batch norm's running-statistics sink for recomputation");
        m_sink_mean = Tensor::zeros(m_running_mean.shape(), m_running_mean.dtype(), m_running_mean.device());
        m_sink_var = Tensor::zeros(m_running_var.shape(), m_running_var.dtype(), m_running_var.device());
      }
      running_mean = &m_sink_mean;
      running_var = &m_sink_var;
    }
    m_synced = ctx.training && ctx.sum_over_ranks != nullptr;
    if (m_epilogue.any()) {  // Model::chains leaves synchronised batch norm alone
      GT_CHECK(!m_synced, "batch norm with an epilogue over several ranks");
      ops::batchnorm_epilogue_forward(*x[0], m_gamma.value, m_beta.value, *running_mean, *running_var, m_momentum,
                                      m_eps, ctx.training, m_save_mean, m_save_invstd, m_save_scale, m_save_shift,
                                      m_epilogue, y);
      return;
    }
    if (m_synced) {
      m_global_count =
          ops::batchnorm_forward_sync(*x[0], m_gamma.value, m_beta.value, *running_mean, *running_var, m_momentum,
                                      m_eps, m_save_mean, m_save_invstd, y, *ctx.sum_over_ranks);
      return;
    }
    ops::batchnorm_forward(*x[0], m_gamma.value, m_beta.value, *running_mean, *running_var, m_momentum, m_eps,
                           ctx.training, m_save_mean, m_save_invstd, y);
  }
  void backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    Tensor none;
    Tensor& dgamma = grad_or_discard(m_gamma, m_discard[0]);
    Tensor& dbeta = grad_or_discard(m_beta, m_discard[1]);
    if (m_epilogue.any()) {
      ops::batchnorm_epilogue_backward(*x[0], m_gamma.value, m_save_mean, m_save_invstd, m_save_scale, m_save_shift,
                                       m_epilogue, y, dy, ctx.training, dx[0] ? *dx[0] : none, dgamma, dbeta,
                                       ctx.accumulate_grads ? 1.0 : 0.0);
      return;
    }
    if (m_synced && ctx.training && ctx.sum_over_ranks != nullptr) {
      ops::batchnorm_backward_sync(*x[0], m_gamma.value, m_save_mean, m_save_invstd, dy, m_global_count,
                                   dx[0] ? *dx[0] : none, dgamma, dbeta, ctx.accumulate_grads ? 1.0 : 0.0,
                                   *ctx.sum_over_ranks);
      return;
    }
    ops::batchnorm_backward(*x[0], m_gamma.value, m_save_mean, m_save_invstd, dy, ctx.training, dx[0] ? *dx[0] : none,
                            dgamma, dbeta, ctx.accumulate_grads ? 1.0 : 0.0);
  }
  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["momentum"] = m_momentum;
    n["eps"] = m_eps;
    return n;
  }
  int64_t forward_flops() const override { return 2 * m_numel; }
  std::vector<std::pair<std::string, Shape>> param_shapes() const override {
    return {{"weight", Shape{m_channels}}, {"bias", Shape{m_channels}}};
  }
  int64_t buffer_numel() const override { return 2 * m_channels; }
  // save_mean, save_invstd, and for an epilogue (Model::chains decides at allocate) save_scale and save_shift
  int64_t workspace_numel(int64_t) const override { return 4 * m_channels; }
  // A pool needs [C, H, W] samples (batchnorm2d); relu goes after either.
  bool takes_epilogue(const ops::Epilogue& ep) const override {
    return ep.any() && !ep.gelu_tanh && !ep.add && (m_two_d || !ep.max_pool_2x2);
  }
  void set_epilogue(const ops::Epilogue& ep) override { m_epilogue = ep; }

 private:
  bool m_two_d;
  double m_momentum, m_eps;
  int64_t m_channels = 0, m_numel = 0;
  Param m_gamma, m_beta;
  Tensor m_running_mean, m_running_var, m_save_mean, m_save_invstd;
  ops::Epilogue m_epilogue;           // set_epilogue: what runs in the forward's pass after the normalisation
  Tensor m_save_scale, m_save_shift;  // its per-channel affine map, which the backward recomputes the values with
  Tensor m_discard[2];                // grad_or_discard's, for a frozen weight or bias
  Tensor m_sink_mean, m_sink_var;     // train.recompute: where a recomputing call's running-statistics update goes
  bool m_synced = false;              // the last forward normalised over the ranks (its backward must too)
  int64_t m_global_count = 0;         // values per channel in that forward, over all ranks
};

}  // namespace

std::unique_ptr<Layer> make_batchnorm1d(const ConfigNode& cfg) { return std::make_unique<BatchNorm>(cfg, false); }
std::unique_ptr<Layer> make_batchnorm2d(const ConfigNode& cfg) { return std::make_unique<BatchNorm>(cfg, true); }

}  // namespace gt
