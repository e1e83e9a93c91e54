// conv2d: 2-D convolution over [C, H, W] samples (on the CPU: Winograd F(2×2, 3×3) or im2col + GEMM,
// ops/cpu/conv_algo.h).
#include "ops/conv2d.h"
#include "layers/params.h"

#include <cmath>

namespace gt {
namespace {

class Conv2d final : public Layer {
 public:
  explicit Conv2d(const ConfigNode& cfg) {
    cfg.require("out_channels");
    cfg.require("kernel_size");
    m_out = cfg["out_channels"].as_size(1, limits::kExtent);
    m_kernel = read_pair(cfg, "kernel_size", {1, 1}, 1);
    m_stride = read_pair(cfg, "stride", {1, 1}, 1);
    m_padding = read_pair(cfg, "padding", {0, 0}, 0);
    m_dilation = read_pair(cfg, "dilation", {1, 1}, 1);
    m_groups = cfg.get_size("groups", 1, 1, limits::kExtent);
    m_has_bias = cfg.get_bool("bias", true);
    if (m_out % m_groups != 0)
      cfg["groups"].fail(fmt::format("out_channels {} is not divisible by groups {}", m_out, m_groups));
  }

  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    if (in[0].rank() != 3) cfg.fail(fmt::format("conv2d needs [channels, height, width] inputs, got {}", in[0].str()));
    m_in_c = in[0][0];
    if (m_in_c % m_groups != 0)
      cfg.fail(fmt::format("input channels {} are not divisible by groups {}", m_in_c, m_groups));
    m_win = {m_kernel.first,  m_kernel.second,  m_stride.first,   m_stride.second,
             m_padding.first, m_padding.second, m_dilation.first, m_dilation.second};
    const int64_t oh = window_out(in[0][1], m_win.kh, m_win.sh, m_win.ph, m_win.dh);
    const int64_t ow = window_out(in[0][2], m_win.kw, m_win.sw, m_win.pw, m_win.dw);
    if (oh < 1 || ow < 1)
      cfg.fail(fmt::format("a {}×{} kernel (dilation {}×{}, padding {}×{}) does not fit a {} input", m_win.kh, m_win.kw,
                           m_win.dh, m_win.dw, m_win.ph, m_win.pw, in[0].str()));
    m_out_hw = oh * ow;
    return Shape{m_out, oh, ow};
  }

  void init_params(Rng& rng, DType dtype, Device device) override {
    // torch.nn.Conv2d: kaiming_uniform_(a=√5) → U(±1/√fan_in), fan_in = C/groups·kh·kw; the bias likewise.
    const int64_t fan_in = m_in_c / m_groups * m_win.kh * m_win.kw;
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    m_weight = uniform_param("weight", Shape{m_out, m_in_c / m_groups, m_win.kh, m_win.kw}, rng, bound, dtype, device);
    if (m_has_bias) m_bias = uniform_param("bias", Shape{m_out}, rng, bound, dtype, device);
  }

  std::vector<Param*> params() override {
    if (m_has_bias) return {&m_weight, &m_bias};
    return {&m_weight};
  }

  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    ops::conv2d_forward(*x[0], m_weight.value, m_bias.value, m_win, m_groups, y);
  }

  void backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    Tensor none;  // (a frozen parameter's grad is undefined: the op computes no gradient for it)
    ops::conv2d_backward(*x[0], m_weight.value, dy, m_win, m_groups, dx[0] ? *dx[0] : none, m_weight.grad, m_bias.grad,
                         ctx.accumulate_grads ? 1.0 : 0.0);
  }

  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["out_channels"] = m_out;
    n["kernel_size"] = pair_node(m_kernel);
    n["stride"] = pair_node(m_stride);
    n["padding"] = pair_node(m_padding);
    n["dilation"] = pair_node(m_dilation);
    n["groups"] = m_groups;
    n["bias"] = m_has_bias;
    return n;
  }

  int64_t forward_flops() const override {
    return mul_sizes(mul_sizes(mul_sizes(mul_sizes(2 * m_out, m_out_hw), m_in_c / m_groups), m_win.kh), m_win.kw);
  }
  std::vector<std::pair<std::string, Shape>> param_shapes() const override {
    std::vector<std::pair<std::string, Shape>> out{
        {"weight", Shape{m_out, m_in_c / m_groups, m_kernel.first, m_kernel.second}}};
    if (m_has_bias) out.emplace_back("bias", Shape{m_out});
    return out;
  }
  int64_t product_weight_numel() const override { return param_shapes()[0].second.numel(); }

 private:
  int64_t m_out, m_groups, m_in_c = 0, m_out_hw = 0;
  std::pair<int64_t, int64_t> m_kernel, m_stride, m_padding, m_dilation;
  bool m_has_bias;
  Window2d m_win{};
  Param m_weight, m_bias;
};

}  // namespace

std::unique_ptr<Layer> make_conv2d(const ConfigNode& cfg) { return std::make_unique<Conv2d>(cfg); }

}  // namespace gt
