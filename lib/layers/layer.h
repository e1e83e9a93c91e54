// The layer contract: shape inference at build time, PyTorch-style initialisation, explicit forward and backward.
#pragma once

#include "config/config.h"
#include "core/half.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/batchnorm.h"
#include "ops/epilogue.h"
#include "ops/half_storage.h"

#include <yaml-cpp/yaml.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gt {

/// A trainable tensor and its gradient (same shape, dtype and device).
struct Param {
  std::string name;  ///< "weight", "bias"; the model prefixes the layer path ("layers.1.weight")
  Tensor value;
  Tensor grad;  ///< undefined while `frozen`
  /// train.freeze (Model::set_frozen): the parameter keeps its values. It has no gradient buffer, and a layer's
  /// backward computes no gradient for it (the input's gradient it still computes when asked).
  bool frozen = false;
  /// Whether backward computes this parameter's gradient.
  bool trains() const { return !frozen; }
};

/// A LoRA adapter's settings (layers/lora.h): a layer's `lora: {rank, alpha, dropout}` or train.lora's.
struct LoraConfig {
  int64_t rank = 0;  ///< 0: no adapter
  double alpha = 0;  ///< the path is scaled by alpha / rank
  double dropout = 0;
  bool on() const { return rank > 0; }
  double scale() const { return alpha / static_cast<double>(rank); }
};

/// What a forward or backward call may need to know besides its tensors.
struct LayerContext {
  bool training = true;           ///< dropout and batch norm behave differently in evaluation
  bool accumulate_grads = false;  ///< add parameter gradients to what is there instead of overwriting it
  uint64_t step = 0;              ///< the micro-batch being computed (step × accumulate + k): keys dropout masks
  /// dist.sync_batchnorm: sums batch norm's per-channel statistics over the ranks whose batches it normalises
  /// together in training (a host collective); nullptr: each process's own batch. Model sets it from set_sync.
  const ops::SumOverRanks* sum_over_ranks = nullptr;
  /// Incremental decoding (Model::forward_decode, `gputrain generate`): the input is not whole samples but positions
  /// [position, position + t) of one sequence, [1, t, …] where a sample is [T, …], whose earlier positions went
  /// through the calls before (since the last one at position 0). Only layers whose decodes() is true get such calls.
  bool decode = false;
  int64_t position = 0;
  /// train.recompute: this forward call runs again, in the backward pass, to rebuild an output that was dropped after
  /// the first forward (same inputs, same `step`). It must compute the same output and leave the model's state as
  /// the first call left it: batch norm does not update its running statistics a second time.
  bool recompute = false;
  /// Model::set_activation_storage, in backward: for each input k that the layer takes in 16 bits
  /// (Layer::backward_takes_half_input) and the model kept in 16 bits, (*half_inputs)[k].data is that copy, in its
  /// format, and x[k] holds other numbers, which the layer must not read (it gives the copy's rows and columns, as it
  /// views x[k]). Null, or a null data, where x[k] holds the input.
  const std::vector<ops::HalfMatrix>* half_inputs = nullptr;
  /// The model's scratch, shared by its layers for what they need only within one call (Layer::scratch_numel): at
  /// least that many elements of the model's dtype on its device, its contents undefined at the start of each call.
  /// Null outside a model (a layer run alone then allocates its own).
  Tensor* scratch = nullptr;
  /// Model::set_activation_storage, in training's forward and backward passes: the 16-bit format the layer may keep
  /// what it saves for backward in (Layer::workspace); nullopt: keep it in the model's dtype.
  std::optional<HalfFormat> half_storage = std::nullopt;
  /// (*half_inputs)[k] when it is given, else null.
  const ops::HalfMatrix* half_input(size_t k) const {
    if (!half_inputs || k >= half_inputs->size() || !(*half_inputs)[k].data) return nullptr;
    return &(*half_inputs)[k];
  }
};

class Layer {
 public:
  virtual ~Layer() = default;

  /// Checks the per-sample input shapes and returns the per-sample output shape. Fails through `cfg`
  /// (a ConfigError naming the layer's key path and YAML line) when the inputs do not fit.
  virtual Shape infer_shape(const std::vector<Shape>& inputs, const ConfigNode& cfg) = 0;
  /// Creates and initialises the parameters (after infer_shape), as PyTorch initialises the same layer.
  virtual void init_params(Rng& /*rng*/, DType /*dtype*/, Device /*device*/) {}
  virtual std::vector<Param*> params() { return {}; }
  /// State that is not trained but belongs to the model (batch-norm running statistics): saved with it.
  virtual std::vector<std::pair<std::string, Tensor*>> buffers() { return {}; }

  /// y = f(x). Batched tensors: x[i] is (B, input shape i), y is (B, output shape).
  virtual void forward(const std::vector<const Tensor*>& x, Tensor& y, const LayerContext& ctx) = 0;
  /// Writes dx[i] = ∂L/∂x[i] for every dx[i] that is not null, and the parameter gradients.
  virtual void backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                        const std::vector<Tensor*>& dx, const LayerContext& ctx) = 0;

  /// True when forward takes LayerContext::decode calls (after infer_shape, for per-sample inputs of [T, …]): output
  /// position i depends on input positions ≤ i only, and a call computes the positions it is given from them and from
  /// what the layer kept of the earlier ones (attention's keys and values). Per-position layers, attention and the
  /// position table say so; a layer that mixes positions otherwise (a linear over a whole [T] sample) does not.
  virtual bool decodes() const { return false; }
  /// True when the output is the input under another shape (flatten): no buffer, no copy, no backward.
  virtual bool is_view() const { return false; }
  /// True when the gradient of every input is the gradient of the output (add): where this layer is the only one that
  /// writes an input's gradient, the model lets that input read the output's gradient buffer instead of a copy (its
  /// backward then gets a null dx for it).
  virtual bool passes_gradient() const { return false; }
  /// True when backward needs its inputs exactly as the forward read them (embedding: token ids, which 16 bits would
  /// not hold): under Model::set_activation_storage the outputs it reads stay f32.
  virtual bool reads_exact_inputs() const { return false; }
  /// True when the layer takes its inputs, and writes its output and input gradients, as 16-bit tensors
  /// (Model::set_activation_dtype): every op it calls on them takes bf16/f16 activations (ops/wide.h), and what it
  /// allocates for them itself follows their dtype. A transformer's layers do.
  virtual bool takes_half_activations() const { return false; }
  /// What backward reads besides dy, so that under Model::set_activation_storage only that is widened from 16 bits:
  /// input k's values, and the output's. A layer that says false must not read them (they hold other numbers then).
  virtual bool backward_reads_input(size_t /*k*/) const { return true; }
  virtual bool backward_reads_output() const { return true; }
  /// True when backward reads input k from LayerContext::half_input(k) whenever that is given, in 16 bits (a weight
  /// gradient's product through ops::matmul_half_b, an activation's derivative through
  /// ops::activation_backward_half_x), so that the model need not widen it first.
  virtual bool backward_takes_half_input(size_t /*k*/) const { return false; }
  /// Whether backward_takes_half_input holds on a CUDA device too (a dense layer: its weight gradient's product reads
  /// the 16-bit copy as its operand); elsewhere a GPU model widens the input first.
  virtual bool takes_half_input_on_cuda() const { return false; }
  /// The layer's arguments after defaults, for config.resolved.yaml.
  virtual YAML::Node resolved_args() const { return YAML::Node(YAML::NodeType::Map); }
  /// Multiply-adds ×2 per sample in the forward pass, for throughput reports.
  virtual int64_t forward_flops() const { return 0; }

  // What the layer allocates, known from the shapes alone (after infer_shape, before init_params), so that
  // `gputrain check` can size a model without building it. Model::build checks param_numel against init_params.
  /// The parameters init_params creates, by name and shape, in params()' order: known from the shapes alone, so that
  /// `gputrain check` can count (and train.freeze match) the parameters of a model it does not build.
  virtual std::vector<std::pair<std::string, Shape>> param_shapes() const { return {}; }
  /// Elements of the parameters init_params creates (each has a gradient as large unless frozen).
  int64_t param_numel() const;
  /// Weight tying (`tied_to:`, GPT-2's lm head reading the token embedding). A layer another may share its `weight`
  /// with returns that weight's shape here (after infer_shape); others return an empty Shape.
  virtual Shape shared_weight_shape() const { return Shape(); }
  /// A layer configured to use another's weight returns the shape it needs (after infer_shape); it then creates,
  /// lists and counts no weight of its own, and receives the owner's parameter through tie_weight after init_params.
  virtual Shape tied_weight_shape() const { return Shape(); }
  virtual void tie_weight(Param& /*shared*/) {}
  /// LoRA (layers/lora.h): the weights whose products this layer can give a low-rank adapter, by parameter name
  /// ("weight"; attention's "qkv.weight" and "proj.weight"), after infer_shape. None by default.
  virtual std::vector<std::string> lora_targets() const { return {}; }
  /// Gives the product of `target` (one of lora_targets) an adapter, after infer_shape and before init_params: its
  /// tensors then appear in param_shapes and params as "<target's prefix>lora_A" and "lora_B".
  virtual void add_lora(const std::string& /*target*/, const LoraConfig& /*cfg*/) {}
  /// Draws the adapters' initial values, after init_params, from a stream of their own (so that the base weights
  /// are those of the model without adapters).
  virtual void init_lora(Rng& /*rng*/, DType /*dtype*/, Device /*device*/) {}
  /// Folds each adapter into its weight (W += α/r · B·A) and drops it (`gputrain export --merge-lora`; a host f32
  /// model).
  virtual void merge_lora() {}
  /// Elements of the buffers saved with the model (batch-norm running statistics).
  virtual int64_t buffer_numel() const { return 0; }
  /// Elements of the weights the layer's matrix products read (its own or a tied one): under train.precision bf16 or
  /// fp16 the CPU keeps a rounded copy of each for the step (ops/precision.h's half_weight).
  virtual int64_t product_weight_numel() const { return 0; }
  /// Elements of the biases the layer's products add in cuBLASLt's epilogue: beside 16-bit outputs on a GPU
  /// (Model::set_activation_dtype) each gets a 16-bit copy for the step too (ops/cuda/matmul.cu).
  virtual int64_t product_bias_numel() const { return 0; }
  /// Elements of the tensors the layer holds for backward besides its output, for batches of up to `batch`
  /// (the normalisations' mean and inverse standard deviation).
  virtual int64_t workspace_numel(int64_t /*batch*/) const { return 0; }
  /// What the layer keeps between forward and backward besides its output, for batches of up to `batch`, when
  /// LayerContext::half_storage is set (`half`) or not: elements in the model's dtype and in 16 bits.
  struct Workspace {
    int64_t wide = 0, half = 0;
  };
  virtual Workspace workspace(int64_t batch, bool /*half*/) const { return {workspace_numel(batch), 0}; }
  /// Elements of the model's dtype the layer needs only within one forward or backward call, for batches of up to
  /// `batch` (attention's f32 q, k, v and their gradients): LayerContext::scratch, one buffer for every layer.
  virtual int64_t scratch_numel(int64_t /*batch*/) const { return 0; }
  /// Fused chains (Model::chains): a layer whose output only the next layer reads may run that layer, and the one
  /// after, as an epilogue of its own pass (ops/epilogue.h), so that its output never goes through memory.
  /// epilogue_step says which step of an epilogue this layer is (relu, a 2×2 max pool; none by default).
  virtual ops::Epilogue epilogue_step() const { return {}; }
  /// Whether this layer can run `ep` after itself on the CPU (batch norm: a 2×2 max pool, relu or both; a 2×2 max
  /// pool: relu).
  virtual bool takes_epilogue(const ops::Epilogue& /*ep*/) const { return false; }
  /// Whether the epilogues takes_epilogue accepts run on a CUDA device as well (a dense layer's, in cuBLASLt's
  /// epilogue); Model::chains forms no chain on a GPU with a head that says no.
  virtual bool takes_epilogue_on_cuda() const { return false; }
  /// The epilogue the calls from now on run (Model::allocate; none: the layer alone). With one, forward writes the
  /// epilogue's output into y, and backward gets that output as y and its gradient as dy, and writes the gradient of
  /// the layer's own input: on the CPU the same numbers bit for bit as the layers one after another, on CUDA the
  /// same within cuBLASLt's rounding.
  virtual void set_epilogue(const ops::Epilogue& /*ep*/) {}
  /// Whether training draws from LayerContext::step (dropout's masks): a value the host passes each step, which a
  /// captured CUDA graph would freeze at its capture's (train.cuda_graphs refuses such a layer).
  virtual bool keyed_by_step() const { return false; }
};

/// One argument of a layer type, for validation and the generated config reference.
struct LayerArg {
  std::string name;
  std::string type;      ///< "int", "bool", "float", …
  std::string fallback;  ///< default shown in the reference; "" when required
  std::string doc;
  bool required = false;
};

/// One registry entry: a layer type the config may name.
struct LayerSpec {
  std::string type;
  std::string summary;
  std::vector<LayerArg> args;
  /// Builds the layer from its config node (a map holding `type` and the args; already key-checked).
  std::unique_ptr<Layer> (*make)(const ConfigNode& cfg);
  int min_inputs = 1, max_inputs = 1;  ///< how many `inputs:` the layer takes (max 0: any number)
};

/// Every layer type, sorted by name. Tests walk this table: a layer without a gradient check fails the suite.
const std::vector<LayerSpec>& layer_registry();
/// The entry for `type`, or nullptr.
const LayerSpec* find_layer(std::string_view type);
/// The config reference in Markdown, generated from the registry (docs/configuration.md, "Layers").
std::string layer_reference_markdown();

}  // namespace gt
