// causal_self_attention: GPT-2's attention block — qkv projection, causal multi-head attention, output projection.
#include "layers/lora.h"
#include "layers/params.h"
#include "ops/attention.h"
#include "ops/matmul.h"

namespace gt {
namespace {

// Samples of [T, C] → [T, C]: qkv = x·W_qkvᵀ + b_qkv ([T, 3C], llm.c's c_attn), att = causal softmax(q·kᵀ/√d)·v
// per head (ops/attention.h), y = att·W_projᵀ + b_proj (c_proj). The products run over all B·T rows at once.
// `dropout: p` drops attention probabilities in training (nanoGPT's attn_dropout); evaluation and decoding do not.
class CausalSelfAttention final : public Layer {
 public:
  explicit CausalSelfAttention(const ConfigNode& cfg) {
    cfg.require("heads");
    m_heads = cfg["heads"].as_int(1, 1 << 16);
    m_bias = cfg.get_bool("bias", true);
    m_proj_init_std = cfg.get_double("proj_init_std", 0.02, 0.0, 1e6);
    m_dropout = cfg.get_double("dropout", 0.0, 0.0, 1.0);
    if (m_dropout >= 1.0) cfg["dropout"].fail("expected a probability below 1");
    if (cfg.has("lora")) m_lora_arg = parse_lora(cfg["lora"]);
  }

  Shape infer_shape(const std::vector<Shape>& in, const ConfigNode& cfg) override {
    if (in[0].rank() != 2) cfg.fail(fmt::format("causal_self_attention takes samples of [T, C], got {}", in[0].str()));
    m_len = in[0][0];
    m_dim = in[0][1];
    if (m_dim % m_heads != 0) cfg["heads"].fail(fmt::format("{} channels do not split into {} heads", m_dim, m_heads));
    if (m_lora_arg.on()) {
      add_lora("qkv.weight", m_lora_arg);
      add_lora("proj.weight", m_lora_arg);
    }
    return in[0];
  }

  void init_params(Rng& rng, DType dtype, Device device) override {
    // GPT-2 (and llm.c): weights N(0, 0.02), biases zero.
    m_qkv_w = normal_param("qkv.weight", Shape{3 * m_dim, m_dim}, rng, 0.02, dtype, device);
    m_proj_w = normal_param("proj.weight", Shape{m_dim, m_dim}, rng, m_proj_init_std, dtype, device);
    if (m_bias) {
      m_qkv_b = constant_param("qkv.bias", Shape{3 * m_dim}, 0.0, dtype, device);
      m_proj_b = constant_param("proj.bias", Shape{m_dim}, 0.0, dtype, device);
    }
    // One mask stream per layer, drawn after the weights and only with dropout, so that a model without it
    // initialises exactly as it did before the option existed.
    if (m_dropout > 0) m_key = rng.next_u64();
    m_dtype = dtype;
    m_device = device;
  }
  std::vector<Param*> params() override {
    std::vector<Param*> out{&m_qkv_w, &m_qkv_b, &m_proj_w, &m_proj_b};
    if (!m_bias) out = {&m_qkv_w, &m_proj_w};
    m_lora_qkv.append_params(out);
    m_lora_proj.append_params(out);
    return out;
  }
  // LoRA on either projection (PEFT's c_attn and c_proj).
  std::vector<std::string> lora_targets() const override { return {"qkv.weight", "proj.weight"}; }
  void add_lora(const std::string& target, const LoraConfig& cfg) override {
    if (target == "qkv.weight") m_lora_qkv.configure(cfg, m_dim, 3 * m_dim, "qkv.");
    if (target == "proj.weight") m_lora_proj.configure(cfg, m_dim, m_dim, "proj.");
  }
  void init_lora(Rng& rng, DType dtype, Device device) override {
    m_lora_qkv.init(rng, dtype, device);
    m_lora_proj.init(rng, dtype, device);
  }
  void merge_lora() override {
    if (m_lora_qkv.on()) m_lora_qkv.merge_into(m_qkv_w.value);
    if (m_lora_proj.on()) m_lora_proj.merge_into(m_proj_w.value);
    m_lora_qkv = m_lora_proj = LoraAdapter();
  }

  void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext& ctx) override {
    // With the residual add as its epilogue (Model::chains), y is x[1] plus the output projection.
    const Tensor* residual = m_epilogue_add ? x[1] : nullptr;
    if (ctx.decode) {
      decode(*x[0], residual, y, ctx.position);
      return;
    }
    const int64_t b = x[0]->dim(0);
    grow(b, ctx);
    // q, k, v and the attention output in f32: the layer's own when training keeps them so, else the scratch (an
    // evaluation keeps nothing; 16-bit storage keeps copies, made below). With 16-bit activations
    // (Model::set_activation_dtype) training writes them in 16 bits where they are kept, and makes no copy.
    const bool keep_wide = ctx.training && !ctx.half_storage;
    const bool kept_16 = ctx.training && ctx.half_storage && is_half(x[0]->dtype());
    Tensor qkv = kept_16 ? kept_qkv(b) : keep_wide ? m_qkv.narrow0(b) : part(ctx, b, 0, 3 * m_dim);
    Tensor att = kept_16 ? kept_att(b) : keep_wide ? m_att.narrow0(b) : part(ctx, b, 3 * m_dim, m_dim);
    Tensor lse = ctx.training ? m_lse.narrow0(b) : Tensor();  // (only a backward reads it)
    Tensor qkv2 = rows(qkv, 3 * m_dim), att2 = rows(att, m_dim), y2 = rows(y, m_dim);
    ops::linear_forward(rows(*x[0], m_dim), m_qkv_w.value, m_bias ? m_qkv_b.value : Tensor(), qkv2);
    if (m_lora_qkv.on()) m_lora_qkv.forward(rows(*x[0], m_dim), qkv2, ctx);
    ops::attention_forward(qkv, m_heads, dropout_of(ctx), att, lse);
    project(att2, residual, y2, ctx);
    if (ctx.training && ctx.half_storage && !kept_16) {
      ops::pack_activation(m_half_format, qkv, m_qkv16->ptr);
      ops::pack_activation(m_half_format, att, m_att16->ptr);
    }
  }

  void backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy, const std::vector<Tensor*>& dx,
                const LayerContext& ctx) override {
    const int64_t b = x[0]->dim(0);
    const double beta = ctx.accumulate_grads ? 1.0 : 0.0;
    // The forward kept q, k, v and the output in 16 bits: read as they are beside 16-bit activations, else widened
    // into the scratch.
    const bool kept_16 = m_qkv16 && is_half(x[0]->dtype());
    Tensor qkv = kept_16 ? kept_qkv(b) : m_qkv16 ? part(ctx, b, 0, 3 * m_dim) : m_qkv.narrow0(b);
    Tensor att = kept_16 ? kept_att(b) : m_qkv16 ? part(ctx, b, 3 * m_dim, m_dim) : m_att.narrow0(b);
    if (m_qkv16 && !kept_16) {
      ops::unpack_activation(m_half_format, m_qkv16->ptr, qkv);
      ops::unpack_activation(m_half_format, m_att16->ptr, att);
    }
    const Tensor lse = m_lse.narrow0(b);
    Tensor dqkv = part(ctx, b, 4 * m_dim, 3 * m_dim), datt = part(ctx, b, 7 * m_dim, m_dim);
    if (kept_16) {  // 16-bit gradients too, in the first half of their f32 parts: the products read them as they are
      dqkv = dqkv.reinterpret(kept_dtype(), dqkv.shape());
      datt = datt.reinterpret(kept_dtype(), datt.shape());
    }
    Tensor delta = scratch(ctx).slice0(b * m_len * 8 * m_dim, b * m_len * m_heads).view(Shape{b, m_heads, m_len});
    const Tensor dy2 = rows(dy, m_dim), att2 = rows(att, m_dim), x2 = rows(*x[0], m_dim);
    Tensor datt2 = rows(datt, m_dim), dqkv2 = rows(dqkv, 3 * m_dim);
    // (train.freeze: a frozen parameter gets no gradient)
    if (m_proj_w.trains()) ops::matmul(dy2, true, att2, false, m_proj_w.grad, beta);  // dW_proj = dyᵀ·att
    if (m_bias && m_proj_b.trains()) ops::sum_rows(dy2, m_proj_b.grad, beta);
    ops::matmul(dy2, false, m_proj_w.value, false, datt2, 0.0);  // datt = dy·W_proj
    if (m_lora_proj.on()) m_lora_proj.backward(att2, nullptr, dy2, &datt2, ctx);
    ops::attention_backward(qkv, att, lse, datt, m_heads, dropout_of(ctx), delta, dqkv);
    if (m_qkv_w.trains()) {
      if (const ops::HalfMatrix* h = ctx.half_input(0))  // x kept in 16 bits: the product reads that copy
        ops::matmul_half_b(dqkv2, true, {h->data, h->format, x2.dim(0), x2.dim(1)}, m_qkv_w.grad, beta);
      else
        ops::matmul(dqkv2, true, x2, false, m_qkv_w.grad, beta);  // dW_qkv = dqkvᵀ·x
    }
    if (m_bias && m_qkv_b.trains()) ops::sum_rows(dqkv2, m_qkv_b.grad, beta);
    Tensor dx2 = dx[0] ? rows(*dx[0], m_dim) : Tensor();
    if (dx[0]) ops::matmul(dqkv2, false, m_qkv_w.value, false, dx2, 0.0);  // dx = dqkv·W_qkv
    if (m_lora_qkv.on()) m_lora_qkv.backward(x2, ctx.half_input(0), dqkv2, dx[0] ? &dx2 : nullptr, ctx);
  }

  bool decodes() const override { return true; }
  bool takes_half_activations() const override { return true; }  // (Model::set_activation_dtype; adapters too)
  bool backward_reads_output() const override { return false; }  // its own att, saved by forward
  // Fused chains (Model::chains, CPU): the residual add after the layer, on each block of the output projection.
  // The backward pass is the same: the add passes dy on.
  // (Not with an adapter on the output projection: its path must join the product before the residual does, as the
  // layers one after another add them.)
  bool takes_epilogue(const ops::Epilogue& ep) const override {
    return ep == ops::Epilogue{.add = true} && !m_lora_proj.on();
  }
  void set_epilogue(const ops::Epilogue& ep) override { m_epilogue_add = ep.add; }
  bool backward_takes_half_input(size_t k) const override { return k == 0; }
  bool keyed_by_step() const override {
    return m_dropout > 0 || m_lora_qkv.config().dropout > 0 || m_lora_proj.config().dropout > 0;
  }

  YAML::Node resolved_args() const override {
    YAML::Node n(YAML::NodeType::Map);
    n["heads"] = m_heads;
    n["bias"] = m_bias;
    n["proj_init_std"] = m_proj_init_std;
    n["dropout"] = m_dropout;
    if (m_lora_arg.on()) n["lora"] = lora_yaml(m_lora_arg);
    return n;
  }
  // The two projections (3C² and C² multiply-adds per token) and q·kᵀ and p·v over the causal half (i + 1 keys for
  // query i, C multiply-adds each).
  int64_t forward_flops() const override {
    // Checked: a long sequence of wide rows multiplies past 64 bits before its weights or outputs do.
    const int64_t proj = mul_sizes(mul_sizes(4 * m_len, m_dim), m_dim);
    const int64_t scores = mul_sizes(mul_sizes(m_len, m_len + 1), m_dim);
    return mul_sizes(2, checked_add(proj, scores).value_or(-1), "attention FLOPs") + m_lora_qkv.forward_flops(m_len) +
           m_lora_proj.forward_flops(m_len);
  }
  std::vector<std::pair<std::string, Shape>> param_shapes() const override {
    std::vector<std::pair<std::string, Shape>> out{{"qkv.weight", Shape{3 * m_dim, m_dim}}};
    if (m_bias) out.emplace_back("qkv.bias", Shape{3 * m_dim});
    out.emplace_back("proj.weight", Shape{m_dim, m_dim});
    if (m_bias) out.emplace_back("proj.bias", Shape{m_dim});
    m_lora_qkv.append_shapes(out);
    m_lora_proj.append_shapes(out);
    return out;
  }
  int64_t product_weight_numel() const override { return mul_sizes(4 * m_dim, m_dim); }  // qkv and proj
  int64_t product_bias_numel() const override { return m_bias ? 4 * m_dim : 0; }
  // Kept from forward to backward: lse (one per head and token), and q, k, v and the output (4C per token) in f32, or
  // in 16 bits under half storage.
  int64_t workspace_numel(int64_t batch) const override { return workspace(batch, false).wide; }
  Workspace workspace(int64_t batch, bool half) const override {
    const int64_t lse = mul_sizes(mul_sizes(batch, m_len), m_heads),
                  saved = mul_sizes(mul_sizes(batch, m_len), 4 * m_dim);
    const int64_t lora = checked_add(m_lora_qkv.kept_numel(batch * m_len), m_lora_proj.kept_numel(batch * m_len))
                             .value_or(-1);  // the adapters' (f32 either way)
    return half ? Workspace{checked_add(lse, lora).value_or(-1), saved}
                : Workspace{checked_add(checked_add(lse, saved), lora).value_or(-1), 0};
  }
  // Within a call: q, k, v and the output in f32 (an evaluation's, or widened from 16 bits), their gradients (4C per
  // token) and delta (one per head and token).
  int64_t scratch_numel(int64_t batch) const override {
    return mul_sizes(mul_sizes(batch, m_len), 8 * m_dim + m_heads);
  }

 private:
  double m_proj_init_std;  ///< llm.c scales the residual projections: 0.02 / √(2 · layers)
  static Tensor rows(const Tensor& t, int64_t cols) { return t.view(Shape{t.numel() / cols, cols}); }

  // Dropout in training only; the backward passes the forward's context, so it regenerates the forward's mask.
  ops::AttentionDropout dropout_of(const LayerContext& ctx) const {
    if (!ctx.training || m_dropout == 0) return {};
    return {m_dropout, m_key, ctx.step};
  }

  // Positions [position, position + t) of one sequence: their q, k and v rows go into the cache (rows of [T, 3C],
  // the packed layout of the forward, so decoding runs the forward's kernel on the new query rows), then attend over
  // the cached positions ≤ each. The cache is the layer's own: training never touches it.
  void decode(const Tensor& x, const Tensor* residual, Tensor& y, int64_t position) {
    const int64_t t = x.numel() / m_dim;
    GT_CHECK(position >= 0 && position <= m_cached && t >= 1 && position + t <= m_len,
             "causal_self_attention: decoding positions [{}, {}) with {} cached, of at most {}", position, position + t,
             m_cached, m_len);
    if (!m_cache.defined()) {
      m_cache = Tensor::empty(Shape{1, m_len, 3 * m_dim}, m_dtype, m_device);
      m_cache_att = Tensor::empty(Shape{m_len, m_dim}, m_dtype, m_device);
    }
    Tensor qkv = m_cache.view(Shape{m_len, 3 * m_dim}).slice0(position, t);
    ops::linear_forward(rows(x, m_dim), m_qkv_w.value, m_bias ? m_qkv_b.value : Tensor(), qkv);
    LayerContext eval;
    eval.training = false;
    if (m_lora_qkv.on()) m_lora_qkv.forward(rows(x, m_dim), qkv, eval);
    m_cached = position + t;
    Tensor att = m_cache_att.narrow0(t).view(Shape{1, t, m_dim}), att2 = m_cache_att.narrow0(t), y2 = rows(y, m_dim);
    ops::attention_decode(m_cache, m_heads, position, att);
    project(att2, residual, y2, eval);
  }

  // y = att · W_projᵀ + b_proj (+ the adapter's path), plus the residual when it is the layer's epilogue.
  void project(const Tensor& att2, const Tensor* residual, Tensor& y2, const LayerContext& ctx) {
    const Tensor bias = m_bias ? m_proj_b.value : Tensor();
    if (residual)
      ops::linear_forward_add(att2, m_proj_w.value, bias, rows(*residual, m_dim), y2);
    else
      ops::linear_forward(att2, m_proj_w.value, bias, y2);
    if (m_lora_proj.on()) m_lora_proj.forward(att2, y2, ctx);
  }

  // What forward keeps for backward, grown once to the largest batch (and kept in the form the first training pass
  // asks for: a model's storage does not change once it is allocated).
  void grow(int64_t b, const LayerContext& ctx) {
    if (!m_lse.defined() || m_lse.dim(0) < b) {
      m_lse = Tensor::empty(Shape{b, m_heads, m_len}, m_dtype, m_device);
      m_qkv = m_att = Tensor();
      m_qkv16 = m_att16 = nullptr;
    }
    if (!ctx.training) return;
    const int64_t rows = m_lse.dim(0) * m_len;
    if (ctx.half_storage && !m_qkv16) {
      m_half_format = *ctx.half_storage;
      m_qkv16 = allocate_storage(static_cast<size_t>(mul_sizes(rows, 3 * m_dim)) * sizeof(uint16_t), m_device);
      m_att16 = allocate_storage(static_cast<size_t>(mul_sizes(rows, m_dim)) * sizeof(uint16_t), m_device);
    } else if (!ctx.half_storage && !m_qkv.defined()) {
      m_qkv = Tensor::empty(Shape{m_lse.dim(0), m_len, 3 * m_dim}, m_dtype, m_device);
      m_att = Tensor::empty(Shape{m_lse.dim(0), m_len, m_dim}, m_dtype, m_device);
    }
  }

  // q, k, v and the output kept in 16 bits (the storage grow made for half storage) as 16-bit tensors of b samples.
  DType kept_dtype() const { return half_dtype(m_half_format); }
  Tensor kept_qkv(int64_t b) const {
    return Tensor::over_storage(m_qkv16, 0, Shape{b, m_len, 3 * m_dim}, kept_dtype());
  }
  Tensor kept_att(int64_t b) const { return Tensor::over_storage(m_att16, 0, Shape{b, m_len, m_dim}, kept_dtype()); }

  // The call's scratch: the model's, or (a layer run alone) one of its own, grown to the largest batch.
  Tensor& scratch(const LayerContext& ctx) {
    if (ctx.scratch) return *ctx.scratch;
    const int64_t b = m_lse.dim(0);
    if (!m_own_scratch.defined() || m_own_scratch.numel() < scratch_numel(b))
      m_own_scratch = Tensor::empty(Shape{scratch_numel(b)}, m_dtype, m_device);
    return m_own_scratch;
  }
  // A part of the scratch's 8C + heads elements per position, as a contiguous [b, T, width] block at n · first
  // (n = b·T positions): q, k, v at 0 (3C wide), the output at 3C (C), their gradients at 4C and 7C, and delta after
  // 8C · n. The parts of one call do not overlap.
  Tensor part(const LayerContext& ctx, int64_t b, int64_t first, int64_t width) {
    const int64_t n = b * m_len;
    return scratch(ctx).slice0(n * first, n * width).view(Shape{b, m_len, width});
  }

  int64_t m_heads = 1, m_len = 0, m_dim = 0;
  bool m_bias = true;
  bool m_epilogue_add = false;  ///< set_epilogue: the residual add runs on the output projection
  double m_dropout = 0;         ///< probability of dropping an attention probability in training
  uint64_t m_key = 0;           ///< the dropout mask's Philox key
  DType m_dtype = DType::f32;
  Device m_device;
  Param m_qkv_w, m_qkv_b, m_proj_w, m_proj_b;
  LoraConfig m_lora_arg;                        // the layer's own `lora:` (train.lora's come through add_lora)
  LoraAdapter m_lora_qkv, m_lora_proj;          // on x·W_qkvᵀ and att·W_projᵀ
  Tensor m_qkv, m_att, m_lse;                   // kept: q, k, v and the output in f32 (without 16-bit storage)
  std::shared_ptr<Storage> m_qkv16, m_att16;    // kept: the same in 16 bits (LayerContext::half_storage)
  HalfFormat m_half_format = HalfFormat::bf16;  // theirs
  Tensor m_own_scratch;                         // LayerContext::scratch when there is no model
  Tensor m_cache, m_cache_att;  // decoding: q, k, v of positions [0, m_cached) of one sequence; the new rows' output
  int64_t m_cached = 0;
};

}  // namespace

std::unique_ptr<Layer> make_causal_self_attention(const ConfigNode& cfg) {
  return std::make_unique<CausalSelfAttention>(cfg);
}

}  // namespace gt
