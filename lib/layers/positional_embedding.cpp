// positional_embedding: a learned row per position added to a sequence (GPT-2's wpe).
#include "layers/params.h"
#include "ops/matmul.h"
#include "ops/wide.h"

namespace gt {
namespace {

// y[t, :] = x[t, :] + P[t, :] for a sample of [T, C] and a table P of [max_len, C]. The T·C elements of a sample and
// the first T rows of P are both contiguous, so the forward is the dense layer's row-bias add over [B, T·C] and the
// table's gradient its row sum: no kernel of its own.
class PositionalEmbedding final : public Layer {
 public:
  explicit PositionalEmbedding(const ConfigNode& cfg) {
    cfg.require("max_len");
    m_max_len = cfg["max_len"].as_size(1, limits::kExtent);
  }
  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    if (in[0].rank() != 2) cfg.fail(fmt::format("positional_embedding takes samples of [T, C], got {}", in[0].str()));
    m_len = in[0][0];
    m_dim = in[0][1];
    if (m_len > m_max_len)
      cfg.fail(fmt::format("positional_embedding has max_len {} but the sequences are {} long", m_max_len, m_len));
    return in[0];
  }
  void init_params(Rng& rng, DType dtype, Device device) override {
    m_weight = normal_param("weight", Shape{m_max_len, m_dim}, rng, 0.02, dtype, device);  // GPT-2's and llm.c's wpe
  }
  std::vector<Param*> params() override { return {&m_weight}; }
  std::vector<std::pair<std::string, Shape>> param_shapes() const override {
    return {{"weight", Shape{m_max_len, m_dim}}};
  }
  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext& ctx) override {
    ops::convert(*x[0], y);  // (a copy, or into the 16-bit activations of Model::set_activation_dtype)
    if (ctx.decode) {        // positions [position, position + t) of one sequence: those rows of the table
      const int64_t t = y.numel() / m_dim;
      GT_CHECK(ctx.position >= 0 && ctx.position + t <= m_max_len, "positional_embedding: positions [{}, {}) of {}",
               ctx.position, ctx.position + t, m_max_len);
      Tensor rows = y.view(Shape{1, t * m_dim});
      ops::add_row_bias(rows, m_weight.value.slice0(ctx.position, t).view(Shape{t * m_dim}));
      return;
    }
    Tensor rows = y.view(Shape{y.shape()[0], m_len * m_dim});
    ops::add_row_bias(rows, used(m_weight.value));
  }
  bool decodes() const override { return true; }
  bool takes_half_activations() const override { return true; }  // (Model::set_activation_dtype)
  void backward(const std::vector<const Tensor*>&, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    if (m_weight.trains()) {
      Tensor grad = used(m_weight.grad);  // rows past T get no gradient: they stay as zeroed at creation
      ops::sum_rows(dy.view(Shape{dy.shape()[0], m_len * m_dim}), grad, ctx.accumulate_grads ? 1.0 : 0.0);
    }
    if (dx[0]) ops::convert(dy, *dx[0]);
  }
  int64_t forward_flops() const override { return m_len * m_dim; }
  bool backward_reads_input(size_t) const override { return false; }
  bool backward_reads_output() const override { return false; }
  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["max_len"] = m_max_len;
    return n;
  }

 private:
  /// The first T rows of a [max_len, C] table as one row of T·C elements.
  Tensor used(const Tensor& table) const { return table.slice0(0, m_len).view(Shape{m_len * m_dim}); }

  int64_t m_max_len = 0, m_len = 0, m_dim = 0;
  Param m_weight;
};

}  // namespace

std::unique_ptr<Layer> make_positional_embedding(const ConfigNode& cfg) {
  return std::make_unique<PositionalEmbedding>(cfg);
}

}  // namespace gt
