// add: the element-wise sum of two or more inputs of one shape (residual connections).
#include "layers/layer.h"
#include "ops/elementwise.h"

#include <algorithm>

namespace gt {
namespace {

// Element-wise sum of two or more inputs of one shape.
class Add final : public Layer {
 public:
  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i] != in[0])
        cfg.fail(
            fmt::format("add needs inputs of one shape, got {} and {} (inputs 0 and {})", in[0].str(), in[i].str(), i));
    m_numel = in[0].numel() * static_cast<int64_t>(in.size() - 1);
    m_inputs = in.size();
    return in[0];
  }
  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    ops::add(*x[0], *x[1], y);
    for (size_t i = 2; i < x.size(); ++i) ops::add(y, *x[i], y);
  }
  // The model shares dy with the inputs it alone writes the gradient of (passes_gradient): those dx are null. The
  // others get a copy as blocks of rows (ops::copy_blocks), which the CPU copies on every thread: as one memcpy
  // (Tensor::copy_from) on the calling thread it was ~1.4 % of a gpt_bytes step with the other thread idle.
  void backward(const std::vector<const Tensor*>&, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext&) override {
    const int64_t rows = dy.dim(0), inner = dy.numel() / std::max<int64_t>(rows, 1);
    for (Tensor* d : dx)
      if (d) ops::copy_blocks(dy, *d, rows, inner, inner, 0);
  }
  bool passes_gradient() const override { return true; }
  bool takes_half_activations() const override { return true; }  // (Model::set_activation_dtype)
  // A sum of two: the residual add a dense layer or attention before it can run on its product (Model::chains).
  ops::Epilogue epilogue_step() const override { return {.add = m_inputs == 2}; }
  bool backward_reads_input(size_t) const override { return false; }
  bool backward_reads_output() const override { return false; }
  int64_t forward_flops() const override { return m_numel; }
  bool decodes() const override { return true; }

 private:
  int64_t m_numel = 0;
  size_t m_inputs = 0;
};

}  // namespace

std::unique_ptr<Layer> make_add(const ConfigNode&) { return std::make_unique<Add>(); }

}  // namespace gt
