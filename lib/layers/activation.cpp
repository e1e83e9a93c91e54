// relu, tanh, sigmoid, gelu: element-wise layers over the shared math in ops/math.h.
#include "ops/activation.h"
#include "layers/layer.h"

namespace gt {
namespace {

class ActivationLayer final : public Layer {
 public:
  explicit ActivationLayer(Activation a) : m_act(a) {}

  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode&) override {
    m_numel = in[0].numel();
    return in[0];
  }
  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    ops::activation_forward(m_act, *x[0], y);
  }
  void backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    if (!dx[0]) return;
    if (const ops::HalfMatrix* h = ctx.half_input(0))  // x kept in 16 bits: widened piece by piece as it is read
      ops::activation_backward_half_x(m_act, {h->data, h->format, 1, x[0]->numel()}, dy, *dx[0]);
    else
      ops::activation_backward(m_act, *x[0], y, dy, *dx[0]);
  }
  int64_t forward_flops() const override { return m_numel; }
  // ops/math.h's act_backward: relu and the GELUs read x, tanh and sigmoid their output.
  bool backward_reads_input(size_t) const override { return !reads_output(); }
  bool backward_reads_output() const override { return reads_output(); }
  bool backward_takes_half_input(size_t) const override { return !reads_output(); }
  bool decodes() const override { return true; }
  bool takes_half_activations() const override { return true; }  // (Model::set_activation_dtype)
  ops::Epilogue epilogue_step() const override {
    return {.relu = m_act == Activation::relu, .gelu_tanh = m_act == Activation::gelu_tanh};
  }
  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    if (m_act == Activation::gelu || m_act == Activation::gelu_tanh)
      n["approximate"] = m_act == Activation::gelu ? "none" : "tanh";
    return n;
  }

 private:
  bool reads_output() const { return m_act == Activation::tanh || m_act == Activation::sigmoid; }

  Activation m_act;
  int64_t m_numel = 0;
};

}  // namespace

std::unique_ptr<Layer> make_relu(const ConfigNode&) { return std::make_unique<ActivationLayer>(Activation::relu); }
std::unique_ptr<Layer> make_tanh(const ConfigNode&) { return std::make_unique<ActivationLayer>(Activation::tanh); }
std::unique_ptr<Layer> make_sigmoid(const ConfigNode&) {
  return std::make_unique<ActivationLayer>(Activation::sigmoid);
}
std::unique_ptr<Layer> make_gelu(const ConfigNode& cfg) {
  const bool tanh = cfg.get_choice("approximate", "none", {"none", "tanh"}) == "tanh";
  return std::make_unique<ActivationLayer>(tanh ? Activation::gelu_tanh : Activation::gelu);
}

}  // namespace gt
