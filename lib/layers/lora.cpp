// LoRA's low-rank path, shared by the layers whose products it adapts (layers/lora.h).
#include "layers/lora.h"

#include "layers/params.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

#include <cmath>

namespace gt {

LoraConfig read_lora_settings(const ConfigNode& n, int64_t default_rank) {
  LoraConfig c;
  c.rank = n.has("rank") ? n["rank"].as_int(1, 1 << 16) : default_rank;
  c.alpha = n.get_double("alpha", static_cast<double>(c.rank), 0.0, 1e6);
  c.dropout = n.get_double("dropout", 0.0, 0.0, 1.0);
  if (c.dropout >= 1.0) n["dropout"].fail("expected a probability below 1");
  return c;
}

LoraConfig parse_lora(const ConfigNode& n) {
  if (!n.is_map()) n.fail("expected a map {rank: r, alpha: a, dropout: p}");
  n.expect_keys({"rank", "alpha", "dropout"});
  n.require("rank");
  return read_lora_settings(n, 0);
}

YAML::Node lora_yaml(const LoraConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  n["rank"] = c.rank;
  n["alpha"] = c.alpha;
  n["dropout"] = c.dropout;
  return n;
}

bool is_lora_tensor(const std::string& name) {
  auto ends = [&](const char* s) {
    const std::string_view t(s);
    return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
  };
  return ends("lora_A") || ends("lora_B");
}

void LoraAdapter::configure(const LoraConfig& cfg, int64_t in, int64_t out, std::string prefix) {
  m_cfg = cfg;
  m_in = in;
  m_out = out;
  m_prefix = std::move(prefix);
}

void LoraAdapter::init(Rng& rng, DType dtype, Device device) {
  if (!on()) return;
  const std::string a = m_prefix + "lora_A", b = m_prefix + "lora_B";
  m_a =
      uniform_param(a.c_str(), Shape{m_cfg.rank, m_in}, rng, 1.0 / std::sqrt(static_cast<double>(m_in)), dtype, device);
  m_b = constant_param(b.c_str(), Shape{m_out, m_cfg.rank}, 0.0, dtype, device);
  if (m_cfg.dropout > 0) m_key = rng.next_u64();
}

void LoraAdapter::append_params(std::vector<Param*>& out) {
  if (!on()) return;
  out.push_back(&m_a);
  out.push_back(&m_b);
}

void LoraAdapter::append_shapes(std::vector<std::pair<std::string, Shape>>& out) const {
  if (!on()) return;
  out.emplace_back(m_prefix + "lora_A", Shape{m_cfg.rank, m_in});
  out.emplace_back(m_prefix + "lora_B", Shape{m_out, m_cfg.rank});
}

void LoraAdapter::grow(int64_t rows) {
  const DType dt = m_a.value.dtype();
  const Device dev = m_a.value.device();
  if (!m_u.defined() || m_u.dim(0) < rows) {
    m_u = Tensor::empty(Shape{rows, m_cfg.rank}, dt, dev);
    m_g = Tensor::empty(Shape{rows, m_cfg.rank}, dt, dev);
  }
  if (m_cfg.dropout > 0 && (!m_xd.defined() || m_xd.dim(0) < rows)) {
    m_xd = Tensor::empty(Shape{rows, m_in}, dt, dev);
    m_tmp = Tensor::empty(Shape{rows, m_in}, dt, dev);
  }
}

void LoraAdapter::forward(const Tensor& x, Tensor& y, const LayerContext& ctx) {
  const int64_t n = x.dim(0);
  grow(n);
  const bool drop = ctx.training && m_cfg.dropout > 0;
  Tensor xd = drop ? m_xd.narrow0(n) : x;
  if (drop) ops::dropout(x, m_cfg.dropout, m_key, ctx.step, xd);
  Tensor u = m_u.narrow0(n);
  ops::matmul(xd, false, m_a.value, true, u, 0.0);  // u = dropout(x)·Aᵀ (n, r)
  ops::scale(u, m_cfg.scale());                     // · α/r
  ops::matmul(u, false, m_b.value, true, y, 1.0);   // y += u·Bᵀ
}

void LoraAdapter::backward(const Tensor& x, const ops::HalfMatrix* hx, const Tensor& dy, Tensor* dx,
                           const LayerContext& ctx) {
  const int64_t n = dy.dim(0);
  const double beta = ctx.accumulate_grads ? 1.0 : 0.0;
  const bool drop = m_cfg.dropout > 0;
  const Tensor u = m_u.narrow0(n);
  if (m_b.trains()) ops::matmul(dy, true, u, false, m_b.grad, beta);  // dB = dyᵀ·u (out, r)
  Tensor g = m_g.narrow0(n);
  ops::matmul(dy, false, m_b.value, false, g, 0.0);  // g = (α/r) · dy·B (n, r)
  ops::scale(g, m_cfg.scale());
  if (m_a.trains()) {  // dA = gᵀ·dropout(x) (r, in)
    if (drop)
      ops::matmul(g, true, m_xd.narrow0(n), false, m_a.grad, beta);
    else if (hx)
      ops::matmul_half_b(g, true, *hx, m_a.grad, beta);
    else
      ops::matmul(g, true, x, false, m_a.grad, beta);
  }
  if (!dx) return;
  if (!drop) {
    ops::matmul(g, false, m_a.value, false, *dx, 1.0);  // dx += g·A
    return;
  }
  Tensor t = m_tmp.narrow0(n);
  ops::matmul(g, false, m_a.value, false, t, 0.0);
  ops::dropout(t, m_cfg.dropout, m_key, ctx.step, t);  // the forward's mask, regenerated
  ops::add(*dx, t, *dx);
}

void LoraAdapter::merge_into(Tensor& w) const {
  GT_CHECK(w.device().is_cpu() && w.dtype() == DType::f32 && w.dim(0) == m_out && w.dim(1) == m_in,
           "merge_into: a host f32 weight of [{}, {}]", m_out, m_in);
  Tensor a = Tensor::empty(m_a.value.shape(), DType::f32), b = Tensor::empty(m_b.value.shape(), DType::f32);
  a.copy_from(m_a.value);
  b.copy_from(m_b.value);
  const double s = m_cfg.scale();
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* pw = w.data<float>();
  for (int64_t o = 0; o < m_out; ++o)
    for (int64_t i = 0; i < m_in; ++i) {
      double sum = 0;  // in f64, then rounded once
      for (int64_t k = 0; k < m_cfg.rank; ++k)
        sum += static_cast<double>(pb[o * m_cfg.rank + k]) * static_cast<double>(pa[k * m_in + i]);
      pw[o * m_in + i] = static_cast<float>(static_cast<double>(pw[o * m_in + i]) + s * sum);
    }
}

int64_t LoraAdapter::kept_numel(int64_t rows) const {
  if (!on()) return 0;
  return mul_sizes(rows, 2 * m_cfg.rank + (m_cfg.dropout > 0 ? 2 * m_in : 0));
}

int64_t LoraAdapter::forward_flops(int64_t rows) const {
  if (!on()) return 0;
  return mul_sizes(mul_sizes(2 * rows, m_cfg.rank), m_in + m_out);
}

}  // namespace gt
