// concat: joins two or more inputs along one per-sample dimension (Inception-style blocks).
#include "layers/layer.h"
#include "ops/elementwise.h"

namespace gt {
namespace {

// Concatenation along one per-sample dimension (0 = channels for images; negative counts from the end).
class Concat final : public Layer {
 public:
  explicit Concat(const ConfigNode& cfg) : m_dim(cfg.get_int("dim", 0)) {}

  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    const auto rank = static_cast<int64_t>(in[0].rank());
    const int64_t d = m_dim < 0 ? m_dim + rank : m_dim;
    if (d < 0 || d >= rank)
      cfg["dim"].fail(fmt::format("dim {} is outside the inputs' {} per-sample dimensions", m_dim, rank));
    m_axis = static_cast<size_t>(d);
    Shape out = in[0];
    m_sizes.clear();
    for (size_t i = 0; i < in.size(); ++i) {
      bool fits = in[i].rank() == in[0].rank();
      for (size_t k = 0; fits && k < in[0].rank(); ++k) fits = k == m_axis || in[i][k] == in[0][k];
      if (!fits)
        cfg.fail(fmt::format("concat along dim {} needs inputs equal in every other dimension, got {} and {}", m_dim,
                             in[0].str(), in[i].str()));
      if (i > 0) out[m_axis] += in[i][m_axis];
      m_sizes.push_back(in[i][m_axis]);
    }
    // Per sample, everything before the axis is `outer` blocks and everything after is one block's tail.
    m_outer = 1;
    for (size_t k = 0; k < m_axis; ++k) m_outer *= in[0][k];
    m_tail = 1;
    for (size_t k = m_axis + 1; k < in[0].rank(); ++k) m_tail *= in[0][k];
    m_total = out[m_axis];
    return out;
  }

  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext&) override {
    const int64_t outer = y.dim(0) * m_outer;
    int64_t offset = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ops::copy_blocks(*x[i], y, outer, m_sizes[i] * m_tail, m_total * m_tail, offset);
      offset += m_sizes[i] * m_tail;
    }
  }
  void backward(const std::vector<const Tensor*>&, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext&) override {
    const int64_t outer = dy.dim(0) * m_outer;
    int64_t offset = 0;
    for (size_t i = 0; i < dx.size(); ++i) {
      if (dx[i]) ops::split_blocks(dy, *dx[i], outer, m_sizes[i] * m_tail, m_total * m_tail, offset);
      offset += m_sizes[i] * m_tail;
    }
  }
  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["dim"] = m_dim;
    return n;
  }

 private:
  int64_t m_dim;
  size_t m_axis = 0;
  int64_t m_outer = 1, m_tail = 1, m_total = 0;
  std::vector<int64_t> m_sizes;
};

}  // namespace

std::unique_ptr<Layer> make_concat(const ConfigNode& cfg) { return std::make_unique<Concat>(cfg); }

}  // namespace gt
