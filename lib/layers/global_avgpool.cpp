// global_avgpool: the mean over each channel's plane, [C, H, W] → [C].
#include "layers/layer.h"
#include "ops/pool2d.h"

namespace gt {
namespace {

// Mean over each channel's whole plane: [C, H, W] → [C]; an average pool whose window is the plane.
class GlobalAvgPool final : public Layer {
 public:
  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    if (in[0].rank() != 3)
      cfg.fail(fmt::format("global_avgpool needs [channels, height, width] inputs, got {}", in[0].str()));
    m_in = in[0];
    m_win = {in[0][1], in[0][2], 1, 1, 0, 0};
    return Shape{in[0][0]};
  }
  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    Tensor y4 = y.view(Shape{y.dim(0), m_in[0], 1, 1});
    ops::pool2d_forward(PoolKind::avg, *x[0], m_win, y4);
  }
  void backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext&) override {
    if (dx[0]) ops::pool2d_backward(PoolKind::avg, *x[0], dy.view(Shape{dy.dim(0), m_in[0], 1, 1}), m_win, *dx[0]);
  }
  int64_t forward_flops() const override { return m_in.numel(); }

 private:
  Shape m_in;
  Window2d m_win{};
};

}  // namespace

std::unique_ptr<Layer> make_global_avgpool(const ConfigNode&) { return std::make_unique<GlobalAvgPool>(); }

}  // namespace gt
