// layernorm: normalisation over the last dimension of each sample, with learned scale and shift.
#include "ops/layernorm.h"
#include "layers/params.h"

namespace gt {
namespace {

// Layer norm over the last dimension of each sample (torch.nn.LayerNorm(last_dim)).
class LayerNorm final : public Layer {
 public:
  explicit LayerNorm(const ConfigNode& cfg) : m_eps(cfg.get_double("eps", 1e-5, 0.0, 1.0)) {}

  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    if (in[0].rank() == 0) cfg.fail("layernorm needs an input with at least one dimension");
    m_dim = in[0][in[0].rank() - 1];
    m_rows_per_sample = in[0].numel() / m_dim;
    m_rank = in[0].rank();
    return in[0];
  }
  void init_params(Rng&, DType dtype, Device device) override {
    m_gamma = constant_param("weight", Shape{m_dim}, 1.0, dtype, device);
    m_beta = constant_param("bias", Shape{m_dim}, 0.0, dtype, device);
    m_dtype = dtype;
    m_device = device;
  }
  std::vector<Param*> params() override { return {&m_gamma, &m_beta}; }

  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    const int64_t rows = x[0]->dim(0) * m_rows_per_sample;
    if (!m_save_mean.defined() || m_save_mean.numel() < rows) {  // grows once, to the largest batch
      m_save_mean = Tensor::empty(Shape{rows}, m_dtype, m_device);
      m_save_invstd = Tensor::empty(Shape{rows}, m_dtype, m_device);
    }
    ops::layernorm_forward(*x[0], m_gamma.value, m_beta.value, m_eps, m_save_mean, m_save_invstd, y);
  }
  void backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    Tensor none;
    ops::layernorm_backward(*x[0], m_gamma.value, m_save_mean, m_save_invstd, dy, dx[0] ? *dx[0] : none,
                            grad_or_discard(m_gamma, m_discard[0]), grad_or_discard(m_beta, m_discard[1]),
                            ctx.accumulate_grads ? 1.0 : 0.0);
  }
  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["eps"] = m_eps;
    return n;
  }
  int64_t forward_flops() const override { return 5 * m_dim * m_rows_per_sample; }
  std::vector<std::pair<std::string, Shape>> param_shapes() const override {
    return {{"weight", Shape{m_dim}}, {"bias", Shape{m_dim}}};
  }
  bool backward_reads_output() const override { return false; }  // x and the saved statistics
  bool takes_half_activations() const override { return true; }  // (Model::set_activation_dtype)
  bool decodes() const override { return m_rank > 1; }           // over the last dimension, so per position of [T, …]
  // save_mean and save_invstd: one per row, allocated by the first forward of the largest batch.
  int64_t workspace_numel(int64_t batch) const override { return 2 * batch * m_rows_per_sample; }

 private:
  double m_eps;
  int64_t m_dim = 0, m_rows_per_sample = 1;
  size_t m_rank = 0;
  DType m_dtype = DType::f32;
  Device m_device;
  Param m_gamma, m_beta;
  Tensor m_save_mean, m_save_invstd;
  Tensor m_discard[2];  // grad_or_discard's, for a frozen weight or bias
};

}  // namespace

std::unique_ptr<Layer> make_layernorm(const ConfigNode& cfg) { return std::make_unique<LayerNorm>(cfg); }

}  // namespace gt
