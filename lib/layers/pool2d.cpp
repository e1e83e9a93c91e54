// maxpool2d and avgpool2d: windowed pooling over [C, H, W] samples (one class, the kind picks the op).
#include "ops/pool2d.h"
#include "layers/params.h"

namespace gt {
namespace {

class Pool2d final : public Layer {
 public:
  Pool2d(PoolKind kind, const ConfigNode& cfg) : m_kind(kind) {
    cfg.require("kernel_size");
    m_kernel = read_pair(cfg, "kernel_size", {1, 1}, 1);
    m_stride = read_pair(cfg, "stride", m_kernel, 1);
    m_padding = read_pair(cfg, "padding", {0, 0}, 0);
    if (m_padding.first * 2 > m_kernel.first || m_padding.second * 2 > m_kernel.second)
      cfg["padding"].fail("padding must be at most half the kernel size");
  }

  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    if (in[0].rank() != 3) cfg.fail(fmt::format("pooling needs [channels, height, width] inputs, got {}", in[0].str()));
    m_win = {m_kernel.first, m_kernel.second, m_stride.first, m_stride.second, m_padding.first, m_padding.second};
    const int64_t oh = window_out(in[0][1], m_win.kh, m_win.sh, m_win.ph, 1);
    const int64_t ow = window_out(in[0][2], m_win.kw, m_win.sw, m_win.pw, 1);
    if (oh < 1 || ow < 1)
      cfg.fail(fmt::format("a {}×{} window does not fit a {} input", m_win.kh, m_win.kw, in[0].str()));
    m_numel = mul_sizes(mul_sizes(mul_sizes(mul_sizes(in[0][0], oh), ow), m_win.kh), m_win.kw);
    return Shape{in[0][0], oh, ow};
  }

  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    if (m_relu)
      ops::max_pool_relu_forward(*x[0], y);
    else
      ops::pool2d_forward(m_kind, *x[0], m_win, y);
  }
  void backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext&) override {
    if (!dx[0]) return;
    if (m_relu)
      ops::max_pool_relu_backward(*x[0], y, dy, *dx[0]);
    else
      ops::pool2d_backward(m_kind, *x[0], dy, m_win, *dx[0]);
  }
  ops::Epilogue epilogue_step() const override { return {.max_pool_2x2 = is_max_2x2()}; }
  bool takes_epilogue(const ops::Epilogue& ep) const override {
    return is_max_2x2() && ep == ops::Epilogue{.relu = true};
  }
  void set_epilogue(const ops::Epilogue& ep) override { m_relu = ep.relu; }
  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["kernel_size"] = pair_node(m_kernel);
    n["stride"] = pair_node(m_stride);
    n["padding"] = pair_node(m_padding);
    return n;
  }
  int64_t forward_flops() const override { return m_numel; }

 private:
  bool is_max_2x2() const {
    return m_kind == PoolKind::max && m_win.kh == 2 && m_win.kw == 2 && m_win.sh == 2 && m_win.sw == 2 &&
           m_win.ph == 0 && m_win.pw == 0;
  }

  PoolKind m_kind;
  std::pair<int64_t, int64_t> m_kernel, m_stride, m_padding;
  Window2d m_win{};
  int64_t m_numel = 0;
  bool m_relu = false;  // set_epilogue: relu runs in the pool's pass
};

}  // namespace

std::unique_ptr<Layer> make_maxpool2d(const ConfigNode& cfg) { return std::make_unique<Pool2d>(PoolKind::max, cfg); }
std::unique_ptr<Layer> make_avgpool2d(const ConfigNode& cfg) { return std::make_unique<Pool2d>(PoolKind::avg, cfg); }

}  // namespace gt
