// softmax: probabilities over the last dimension.
#include "ops/softmax.h"
#include "layers/layer.h"

namespace gt {
namespace {

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

}  // namespace

std::unique_ptr<Layer> make_softmax(const ConfigNode&) { return std::make_unique<Softmax>(); }

}  // namespace gt
