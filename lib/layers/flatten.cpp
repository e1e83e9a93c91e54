// flatten: [C, H, W] → [C·H·W] per sample, as a view of the input (no copy, nothing to do backward).
#include "layers/layer.h"

namespace gt {
namespace {

class Flatten final : public Layer {
 public:
  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode&) override { return Shape{in[0].numel()}; }
  bool is_view() const override { return true; }
  // The graph never calls these for a view layer; they are defined for callers that run layers one by one.
  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    if (x[0]->raw() != y.raw()) y.copy_from(x[0]->view(y.shape()));
  }
  void backward(const std::vector<const Tensor*>&, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext&) override {
    if (dx[0] && dx[0]->raw() != dy.raw()) dx[0]->copy_from(dy.view(dx[0]->shape()));
  }
};

}  // namespace

std::unique_ptr<Layer> make_flatten(const ConfigNode&) { return std::make_unique<Flatten>(); }

}  // namespace gt
