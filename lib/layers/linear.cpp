// linear: y = x·Wᵀ + b over the last dimension, through the backend GEMM.
#include "layers/lora.h"
#include "layers/params.h"
#include "ops/activation.h"
#include "ops/epilogue.h"
#include "ops/matmul.h"

#include <cmath>

namespace gt {
namespace {

class Linear final : public Layer {
 public:
  Linear(int64_t out, bool bias, bool tied, double init_std, LoraConfig lora)
      : m_out(out), m_has_bias(bias), m_tied(tied), m_init_std(init_std), m_lora_arg(lora) {}

  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    if (in[0].rank() == 0) cfg.fail("linear needs an input with at least one dimension");
    m_in = in[0][in[0].rank() - 1];
    m_rows_per_sample = in[0].numel() / m_in;
    m_rank = in[0].rank();
    if (m_lora_arg.on()) m_lora.configure(m_lora_arg, m_in, m_out, "");
    Shape out = in[0];
    out[out.rank() - 1] = m_out;
    return out;
  }

  void init_params(Rng& rng, DType dtype, Device device) override {
    // torch.nn.Linear: kaiming_uniform_(a=√5) gives U(−1/√in, 1/√in) for the weight; the bias uses the same bound.
    // init_std (GPT-2's scheme): N(0, std) weights and zero biases.
    const double bound = 1.0 / std::sqrt(static_cast<double>(m_in));
    if (!m_tied)
      m_weight = m_init_std > 0 ? normal_param("weight", Shape{m_out, m_in}, rng, m_init_std, dtype, device)
                                : uniform_param("weight", Shape{m_out, m_in}, rng, bound, dtype, device);
    if (m_has_bias)
      m_bias = m_init_std > 0 ? constant_param("bias", Shape{m_out}, 0.0, dtype, device)
                              : uniform_param("bias", Shape{m_out}, rng, bound, dtype, device);
  }

  std::vector<Param*> params() override {
    std::vector<Param*> out;
    if (!m_tied) out.push_back(&m_weight);
    if (m_has_bias) out.push_back(&m_bias);
    m_lora.append_params(out);
    return out;
  }
  // LoRA: on this layer's product, a tied head's too (the embedding's lookup keeps the shared table as it is).
  std::vector<std::string> lora_targets() const override { return {"weight"}; }
  void add_lora(const std::string&, const LoraConfig& cfg) override { m_lora.configure(cfg, m_in, m_out, ""); }
  void init_lora(Rng& rng, DType dtype, Device device) override { m_lora.init(rng, dtype, device); }
  void merge_lora() override {
    if (!m_lora.on()) return;
    if (m_tied)
      throw ConfigError(
          "a LoRA adapter on a tied layer (tied_to) cannot be folded into the table it shares with the "
          "embedding, whose lookup does not use it: export the weights without --merge-lora");
    m_lora.merge_into(m_weight.value);
    m_lora = LoraAdapter();
  }
  Shape tied_weight_shape() const override { return m_tied ? Shape{m_out, m_in} : Shape(); }
  // The shared weight's gradient is written here first (this layer runs backward before the embedding it reads,
  // which the model then makes add its part), so the two uses are summed. A table with more rows than out_features
  // (llm.c's vocabulary padded to Vp) is used through its first out_features rows.
  void tie_weight(Param& shared) override { m_w = &shared; }

  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext& ctx) override {
    const Tensor x2 = as_rows(*x[0], m_in);  // (B·rows, in)
    Tensor y2 = as_rows(y, m_out);           // (B·rows, out)
    const Tensor bias = m_has_bias ? m_bias.value : Tensor();
    if (m_lora.on()) {  // (no epilogue: takes_epilogue says no)
      ops::linear_forward(x2, m_w->value.narrow0(m_out), bias, y2);
      m_lora.forward(x2, y2, ctx);
      return;
    }
    if (m_epilogue.add) {  // a fused chain: y is the residual sum of the product and x[1] (Model::chains)
      ops::linear_forward_add(x2, m_w->value.narrow0(m_out), bias, as_rows(*x[1], m_out), y2);
      return;
    }
    if (!m_epilogue.activates()) {
      ops::linear_forward(x2, m_w->value.narrow0(m_out), bias, y2);
      return;
    }
    // A fused chain: y is the activation's output. GELU's backward reads its input, kept in training; relu's
    // derivative is read off its output.
    Tensor h;
    if (m_epilogue.gelu_tanh && ctx.training) {
      if (!m_h.defined() || m_h.dim(0) < x2.dim(0)) m_h = Tensor::empty(Shape{x2.dim(0), m_out}, y.dtype(), y.device());
      h = m_h.narrow0(x2.dim(0));
    }
    ops::linear_forward_act(x2, m_w->value.narrow0(m_out), bias, activation(), h, y2);
  }

  void backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    const Tensor x2 = as_rows(*x[0], m_in);
    Tensor dy2 = as_rows(dy, m_out);
    // A fused activation: dy is the activation's output gradient; this layer's own goes to scratch. (A residual sum's
    // gradient is the product's: the add passes it on.)
    if (m_epilogue.activates()) {
      Tensor dh = scratch(ctx, dy2.numel()).view(dy2.shape());
      const Tensor y2 = as_rows(y, m_out);
      // relu'(h) is h > 0, which is y > 0 (y = h there, 0 or NaN elsewhere, as h is).
      ops::activation_backward(activation(), m_epilogue.relu ? y2 : m_h.narrow0(y2.dim(0)), y2, dy2, dh);
      dy2 = dh;
    }
    const double beta = ctx.accumulate_grads ? 1.0 : 0.0;
    // (train.freeze: a frozen weight gets no gradient, a frozen bias none either)
    Tensor dw = m_w->trains() ? m_w->grad.narrow0(m_out) : Tensor();
    Tensor db = m_has_bias && m_bias.trains() ? m_bias.grad : Tensor();
    Tensor dx2 = dx[0] ? as_rows(*dx[0], m_in) : Tensor();
    // dW (out, in) = dyᵀ · x, db (out) = Σ_rows dy and dx (B·rows, in) = dy · W, sharing what the backend can; x kept
    // in 16 bits is the weight's product's operand as it is
    const ops::HalfMatrix* h = ctx.half_input(0);
    const ops::HalfMatrix x_half = h ? ops::HalfMatrix{h->data, h->format, x2.dim(0), x2.dim(1)} : ops::HalfMatrix{};
    ops::linear_backward(dy2, x2, h ? &x_half : nullptr, m_w->value.narrow0(m_out), dw, db, dx2, beta);
    if (dw.defined()) {
      // A shared table's rows past out_features get no gradient from here; this layer writes first, so it clears them.
      const int64_t spare = m_w->grad.dim(0) - m_out;
      if (spare > 0 && !ctx.accumulate_grads) m_w->grad.slice0(m_out, spare).zero_();
    }
    if (m_lora.on()) m_lora.backward(x2, h ? &x_half : nullptr, dy2, dx[0] ? &dx2 : nullptr, ctx);
  }

  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["out_features"] = m_out;
    n["bias"] = m_has_bias;
    if (m_init_std > 0) n["init_std"] = m_init_std;
    if (m_lora_arg.on()) n["lora"] = lora_yaml(m_lora_arg);
    return n;
  }

  int64_t forward_flops() const override {
    return mul_sizes(mul_sizes(2 * m_rows_per_sample, m_in), m_out) + m_lora.forward_flops(m_rows_per_sample);
  }
  bool backward_reads_output() const override { return false; }
  bool keyed_by_step() const override { return m_lora.config().dropout > 0; }  // the adapter's dropout masks
  bool backward_takes_half_input(size_t k) const override { return k == 0; }
  bool takes_half_input_on_cuda() const override { return true; }
  bool decodes() const override { return m_rank > 1; }           // over the last dimension, so per position of [T, …]
  bool takes_half_activations() const override { return true; }  // (Model::set_activation_dtype; an adapter too)
  std::vector<std::pair<std::string, Shape>> param_shapes() const override {
    std::vector<std::pair<std::string, Shape>> out;
    if (!m_tied) out.emplace_back("weight", Shape{m_out, m_in});
    if (m_has_bias) out.emplace_back("bias", Shape{m_out});
    m_lora.append_shapes(out);
    return out;
  }
  int64_t product_weight_numel() const override { return mul_sizes(m_out, m_in); }  // a tied table's first m_out rows
  int64_t product_bias_numel() const override { return m_has_bias ? m_out : 0; }
  // Fused chains (Model::chains): relu or GPT-2's GELU after the product, or the residual add, on each block of it as
  // it is finished (CPU) or in cuBLASLt's epilogue (CUDA).
  bool takes_epilogue(const ops::Epilogue& ep) const override {
    if (m_lora.on()) return false;  // the adapter's path joins the product before any epilogue could run
    return ep == ops::Epilogue{.relu = true} || ep == ops::Epilogue{.gelu_tanh = true} ||
           ep == ops::Epilogue{.add = true};
  }
  bool takes_epilogue_on_cuda() const override { return true; }
  void set_epilogue(const ops::Epilogue& ep) override { m_epilogue = ep; }
  // With GELU as its epilogue, the layer keeps GELU's input (x·Wᵀ + b) for the backward pass.
  int64_t workspace_numel(int64_t batch) const override {
    const int64_t rows = mul_sizes(batch, m_rows_per_sample);
    return (m_epilogue.gelu_tanh ? mul_sizes(rows, m_out) : 0) + m_lora.kept_numel(rows);
  }
  // With an activation as its epilogue, the gradient of x·Wᵀ + b within backward.
  int64_t scratch_numel(int64_t batch) const override {
    return m_epilogue.activates() ? mul_sizes(mul_sizes(batch, m_rows_per_sample), m_out) : 0;
  }

 private:
  static Tensor as_rows(const Tensor& t, int64_t cols) { return t.view(Shape{t.numel() / cols, cols}); }
  Activation activation() const { return m_epilogue.relu ? Activation::relu : Activation::gelu_tanh; }
  // The call's scratch: the model's, or (a layer run alone) one of its own, grown to the largest call.
  Tensor scratch(const LayerContext& ctx, int64_t numel) {
    if (ctx.scratch) return ctx.scratch->narrow0(numel);
    if (!m_own_scratch.defined() || m_own_scratch.numel() < numel)
      m_own_scratch = Tensor::empty(Shape{numel}, m_w->value.dtype(), m_w->value.device());
    return m_own_scratch.narrow0(numel);
  }

  int64_t m_out, m_in = 0, m_rows_per_sample = 1;
  size_t m_rank = 0;
  bool m_has_bias, m_tied;
  double m_init_std;      ///< > 0: N(0, std) weights and zero biases; 0: torch.nn.Linear's uniform
  LoraConfig m_lora_arg;  ///< the layer's own `lora:` (train.lora's come through add_lora)
  LoraAdapter m_lora;
  Param m_weight, m_bias;
  Param* m_w = &m_weight;    // the weight in use: m_weight, or the shared one (tied_to)
  ops::Epilogue m_epilogue;  // set_epilogue: what this layer runs after its product (none: the layer alone)
  Tensor m_h;                // GELU's input, kept by a training forward with GELU as the epilogue
  Tensor m_own_scratch;
};

}  // namespace

std::unique_ptr<Layer> make_linear(const ConfigNode& cfg) {
  cfg.require("out_features");
  return std::make_unique<Linear>(cfg["out_features"].as_size(1, limits::kExtent), cfg.get_bool("bias", true),
                                  cfg.has("tied_to"), cfg.get_double("init_std", 0.0, 0.0, 1e6),
                                  cfg.has("lora") ? parse_lora(cfg["lora"]) : LoraConfig());
}

}  // namespace gt
