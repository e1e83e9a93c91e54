// Parameter initialisation and argument helpers shared by the layers.
#include "layers/params.h"

namespace gt {

int64_t Layer::param_numel() const {
  int64_t total = 0;
  for (const auto& [name, shape] : param_shapes()) {
    const std::optional<int64_t> sum = checked_add(total, shape.numel());
    if (!sum) throw SizeOverflow("the parameter count does not fit in 64 bits");
    total = *sum;
  }
  return total;
}

Tensor& grad_or_discard(Param& p, Tensor& discard) {
  if (p.trains()) return p.grad;
  if (!discard.defined()) discard = Tensor::empty(p.value.shape(), p.value.dtype(), p.value.device());
  return discard;
}

Tensor constant_tensor(const Shape& shape, double value, DType dtype, Device device) {
  Tensor host = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < shape.numel(); ++i) {
    if (dtype == DType::f64)
      host.data<double>()[i] = value;
    else
      host.data<float>()[i] = static_cast<float>(value);
  }
  if (device.is_cpu()) return host;
  Tensor t = Tensor::empty(shape, dtype, device);
  t.copy_from(host);
  return t;
}

namespace {

// A parameter whose values are draw() in order, made on the host and moved to `device`.
template <class Draw>
Param drawn_param(const char* name, const Shape& shape, DType dtype, Device device, Draw&& draw) {
  Tensor host = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const double v = draw();
    if (dtype == DType::f64)
      host.data<double>()[i] = v;
    else
      host.data<float>()[i] = static_cast<float>(v);
  }
  Param p{name, host, Tensor::zeros(shape, dtype, device)};
  if (!device.is_cpu()) {
    p.value = Tensor::empty(shape, dtype, device);
    p.value.copy_from(host);
  }
  return p;
}

}  // namespace

Param uniform_param(const char* name, const Shape& shape, Rng& rng, double bound, DType dtype, Device device) {
  return drawn_param(name, shape, dtype, device, [&] { return rng.uniform(-bound, bound); });
}

Param normal_param(const char* name, const Shape& shape, Rng& rng, double std, DType dtype, Device device) {
  return drawn_param(name, shape, dtype, device, [&] { return std * rng.normal(); });
}

Param constant_param(const char* name, const Shape& shape, double value, DType dtype, Device device) {
  return Param{name, constant_tensor(shape, value, dtype, device), Tensor::zeros(shape, dtype, device)};
}

std::pair<int64_t, int64_t> read_pair(const ConfigNode& cfg, const char* key, std::pair<int64_t, int64_t> fallback,
                                      int64_t min) {
  const ConfigNode n = cfg[key];
  if (!n.defined()) return fallback;
  if (n.is_sequence()) {
    if (n.size() != 2) n.fail("expected an integer or a list of two integers [height, width]");
    return {n.at(0).as_size(min, limits::kExtent), n.at(1).as_size(min, limits::kExtent)};
  }
  const int64_t v = n.as_size(min, limits::kExtent);
  return {v, v};
}

YAML::Node pair_node(std::pair<int64_t, int64_t> p) {
  if (p.first == p.second) return YAML::Node(p.first);
  YAML::Node n(YAML::NodeType::Sequence);
  n.push_back(p.first);
  n.push_back(p.second);
  n.SetStyle(YAML::EmitterStyle::Flow);
  return n;
}

}  // namespace gt
