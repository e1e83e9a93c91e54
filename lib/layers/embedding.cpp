// embedding: rows of a learned table picked by integer-valued inputs.
#include "ops/embedding.h"
#include "layers/params.h"

namespace gt {
namespace {

// Rows of a learned table picked by integer-valued inputs: [...] → [..., embedding_dim].
class Embedding final : public Layer {
 public:
  explicit Embedding(const ConfigNode& cfg) {
    cfg.require("num_embeddings");
    cfg.require("embedding_dim");
    m_vocab = cfg["num_embeddings"].as_size(1, limits::kExtent);
    m_dim = cfg["embedding_dim"].as_size(1, limits::kExtent);
    m_init_std = cfg.get_double("init_std", 1.0, 0.0, 1e6);
  }
  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode&) override {
    std::vector<int64_t> d = in[0].dims();
    d.push_back(m_dim);
    return Shape(d);
  }
  void init_params(Rng& rng, DType dtype, Device device) override {
    m_weight = normal_param("weight", Shape{m_vocab, m_dim}, rng, m_init_std, dtype, device);  // torch: N(0, 1)
  }
  std::vector<Param*> params() override { return {&m_weight}; }
  std::vector<std::pair<std::string, Shape>> param_shapes() const override {
    return {{"weight", Shape{m_vocab, m_dim}}};
  }
  Shape shared_weight_shape() const override { return Shape{m_vocab, m_dim}; }
  bool decodes() const override { return true; }                 // a row per index
  bool takes_half_activations() const override { return true; }  // (Model::set_activation_dtype)
  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    ops::embedding_forward(*x[0], m_weight.value, y);
  }
  void backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    if (m_weight.trains()) ops::embedding_backward(*x[0], dy, m_weight.grad, ctx.accumulate_grads ? 1.0 : 0.0);
    if (dx[0]) dx[0]->zero_();  // indices are not differentiable
  }
  bool reads_exact_inputs() const override { return true; }  // token ids: bf16 holds integers only up to 256
  bool backward_reads_output() const override { return false; }
  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["num_embeddings"] = m_vocab;
    n["embedding_dim"] = m_dim;
    n["init_std"] = m_init_std;
    return n;
  }

 private:
  int64_t m_vocab, m_dim;
  double m_init_std;
  Param m_weight;
};

}  // namespace

std::unique_ptr<Layer> make_embedding(const ConfigNode& cfg) { return std::make_unique<Embedding>(cfg); }

}  // namespace gt
