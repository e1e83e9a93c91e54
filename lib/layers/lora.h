// LoRA (Hu et al. 2021, as Hugging Face PEFT applies it): a weight product x·Wᵀ gains a low-rank path
// (α/r) · dropout(x)·Aᵀ·Bᵀ with A [r, in] drawn as torch.nn.Linear draws a weight and B [out, r] zero, so that a new
// adapter leaves the model's output as it was. Only A and B learn when train.lora freezes the rest. Dense layers and
// attention's qkv and output projections share this path, on the CPU and on CUDA alike (ops::matmul).
#pragma once

#include "config/config.h"
#include "layers/layer.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gt {

/// Reads `{rank: r, alpha: a, dropout: p}` (alpha defaults to r, PEFT's scale of 1; dropout to 0); ConfigError
/// naming the key otherwise.
LoraConfig parse_lora(const ConfigNode& n);
/// rank (default `default_rank`), alpha (default the rank) and dropout of a map whose keys were checked: parse_lora's
/// and train.lora's shared part.
LoraConfig read_lora_settings(const ConfigNode& n, int64_t default_rank);
/// The same as config.resolved.yaml writes it.
YAML::Node lora_yaml(const LoraConfig& c);
/// Whether `name` is an adapter's tensor: its product's prefix and "lora_A" or "lora_B" ("h.0.fc.lora_A").
bool is_lora_tensor(const std::string& name);

/// One adapter on a product of `in` inputs and `out` outputs, its tensors named `prefix` + "lora_A" and "lora_B".
class LoraAdapter {
 public:
  /// After the layer's infer_shape; `prefix` is "" for a dense layer, "qkv." or "proj." inside attention.
  void configure(const LoraConfig& cfg, int64_t in, int64_t out, std::string prefix);
  bool on() const { return m_cfg.on(); }
  const LoraConfig& config() const { return m_cfg; }
  /// A uniform in ±1/√in (torch.nn.Linear's weight, PEFT's lora_A), B zero; the dropout key drawn after them.
  void init(Rng& rng, DType dtype, Device device);
  void append_params(std::vector<Param*>& out);
  void append_shapes(std::vector<std::pair<std::string, Shape>>& out) const;

  /// y (n, out) += (α/r) · dropout(x)·Aᵀ·Bᵀ for rows x (n, in). What backward reads is kept (u = (α/r)·dropout(x)·Aᵀ,
  /// and dropout(x) when dropout is on); an evaluation drops nothing.
  void forward(const Tensor& x, Tensor& y, const LayerContext& ctx);
  /// From dy (n, out) of the last training forward: A's and B's gradients (added to under ctx.accumulate_grads), and
  /// dx += the path's share when dx is given. x is the forward's input, or `hx` its 16-bit copy
  /// (LayerContext::half_input) when x holds other numbers.
  void backward(const Tensor& x, const ops::HalfMatrix* hx, const Tensor& dy, Tensor* dx, const LayerContext& ctx);
  /// W (out, in) += (α/r) · B·A: the product with the adapter folded in (W on the host, f32).
  void merge_into(Tensor& w) const;

  /// What forward keeps for backward for `rows` rows and what a call needs besides (u and its gradient, dropout's
  /// two copies of x): elements.
  int64_t kept_numel(int64_t rows) const;
  int64_t forward_flops(int64_t rows) const;

 private:
  void grow(int64_t rows);

  LoraConfig m_cfg;
  int64_t m_in = 0, m_out = 0;
  std::string m_prefix;
  Param m_a, m_b;
  uint64_t m_key = 0;
  Tensor m_u, m_g, m_xd, m_tmp;  // per row: u and its gradient (r each), dropout(x) and dropout's dx share (in each)
};

}  // namespace gt
