// dropout, softmax and embedding.
#include "layers/params.h"
#include "ops/ops.h"

namespace gt {
namespace {

// Zeroes each element with probability p in training and scales the rest by 1/(1−p); the identity in evaluation.
class Dropout final : public Layer {
 public:
  explicit Dropout(const ConfigNode& cfg) {
    cfg.require("p");
    m_p = cfg["p"].as_double(0.0, 1.0);
    if (m_p >= 1.0) cfg["p"].fail("expected a probability below 1");
  }
  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode&) override { return in[0]; }
  void init_params(Rng& rng, DType, Device) override { m_key = rng.next_u64(); }  // one mask stream per layer
  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext& ctx) override {
    if (ctx.training && m_p > 0)
      ops::dropout(*x[0], m_p, m_key, ctx.step, y);
    else
      y.copy_from(*x[0]);
  }
  void backward(const std::vector<const Tensor*>&, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    if (!dx[0]) return;
    if (ctx.training && m_p > 0)
      ops::dropout(dy, m_p, m_key, ctx.step, *dx[0]);  // the same mask, regenerated
    else
      dx[0]->copy_from(dy);
  }
  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["p"] = m_p;
    return n;
  }

 private:
  double m_p;
  uint64_t m_key = 0;
};

// Softmax over the last dimension (for outputs that should be probabilities; cross_entropy takes raw logits).
class Softmax final : public Layer {
 public:
  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    if (in[0].rank() == 0) cfg.fail("softmax needs an input with at least one dimension");
    m_dim = in[0][in[0].rank() - 1];
    m_numel = in[0].numel();
    return in[0];
  }
  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    ops::softmax_forward(*x[0], m_dim, y);
  }
  void backward(const std::vector<const Tensor*>&, const Tensor& y, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext&) override {
    if (dx[0]) ops::softmax_backward(y, dy, m_dim, *dx[0]);
  }
  int64_t forward_flops() const override { return 4 * m_numel; }

 private:
  int64_t m_dim = 0, m_numel = 0;
};

// Rows of a learned table picked by integer-valued inputs: [...] → [..., embedding_dim].
class Embedding final : public Layer {
 public:
  explicit Embedding(const ConfigNode& cfg) {
    cfg.require("num_embeddings");
    cfg.require("embedding_dim");
    m_vocab = cfg["num_embeddings"].as_int(1);
    m_dim = cfg["embedding_dim"].as_int(1);
  }
  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode&) override {
    std::vector<int64_t> d = in[0].dims();
    d.push_back(m_dim);
    return Shape(d);
  }
  void init_params(Rng& rng, DType dtype, Device device) override {
    // torch.nn.Embedding: N(0, 1).
    Tensor host = Tensor::empty(Shape{m_vocab, m_dim}, dtype);
    for (int64_t i = 0; i < host.numel(); ++i) {
      if (dtype == DType::f64)
        host.data<double>()[i] = rng.normal();
      else
        host.data<float>()[i] = static_cast<float>(rng.normal());
    }
    m_weight = Param{"weight", Tensor::empty(host.shape(), dtype, device), Tensor::zeros(host.shape(), dtype, device)};
    m_weight.value.copy_from(host);
  }
  std::vector<Param*> params() override { return {&m_weight}; }
  int64_t param_numel() const override { return m_vocab * m_dim; }
  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    ops::embedding_forward(*x[0], m_weight.value, y);
  }
  void backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    ops::embedding_backward(*x[0], dy, m_weight.grad, ctx.accumulate_grads ? 1.0 : 0.0);
    if (dx[0]) dx[0]->zero_();  // indices are not differentiable
  }
  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["num_embeddings"] = m_vocab;
    n["embedding_dim"] = m_dim;
    return n;
  }

 private:
  int64_t m_vocab, m_dim;
  Param m_weight;
};

}  // namespace

std::unique_ptr<Layer> make_dropout(const ConfigNode& cfg) { return std::make_unique<Dropout>(cfg); }
std::unique_ptr<Layer> make_softmax(const ConfigNode&) { return std::make_unique<Softmax>(); }
std::unique_ptr<Layer> make_embedding(const ConfigNode& cfg) { return std::make_unique<Embedding>(cfg); }

}  // namespace gt
