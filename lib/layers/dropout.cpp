// dropout: zeroes elements at random in training, with masks regenerated (not stored) for the backward pass.
#include "ops/dropout.h"
#include "layers/layer.h"
#include "ops/wide.h"

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
      ops::convert(*x[0], y);  // (a copy, or into 16-bit activations: Model::set_activation_dtype)
  }
  void backward(const std::vector<const Tensor*>&, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    if (!dx[0]) return;
    if (ctx.training && m_p > 0)
      ops::dropout(dy, m_p, m_key, ctx.step, *dx[0]);  // the same mask, regenerated
    else
      ops::convert(dy, *dx[0]);
  }
  bool decodes() const override { return true; }                 // decoding is evaluation: the identity
  bool takes_half_activations() const override { return true; }  // (Model::set_activation_dtype)
  bool keyed_by_step() const override { return m_p > 0; }
  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["p"] = m_p;
    return n;
  }

 private:
  double m_p;
  uint64_t m_key = 0;
};

}  // namespace

std::unique_ptr<Layer> make_dropout(const ConfigNode& cfg) { return std::make_unique<Dropout>(cfg); }

}  // namespace gt
