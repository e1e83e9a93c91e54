// The model: layers built from config, shapes inferred at build time, buffers allocated once, forward/backward.
#pragma once

#include "config/config.h"
#include "core/half.h"
#include "core/span_timer.h"
#include "graph/model_spec.h"
#include "layers/layer.h"
#include "ops/epilogue.h"
#include "ops/half_storage.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gt {

struct GraphNode {
  std::string name;  ///< "layers.3" unless the config names it
  size_t index = 0;  ///< position in model.layers (nodes are stored in execution order)
  std::string type;
  std::unique_ptr<Layer> layer;
  std::vector<int> inputs;  ///< node positions in execution order; -1 is the model input
  /// The inputs as the config wires them (node positions), for resolved_layers: they differ from `inputs` only where
  /// the builder moved a relu after the max pool that reads it (the same outputs and gradients, on fewer values).
  std::vector<int> listed_inputs;
  int grad_owner = -1;      ///< the node whose gradient buffer holds ∂L/∂output (itself, or a view's source)
  Shape out_shape;          ///< per sample
  bool needs_grad = false;  ///< some parameter at or before this node learns, so ∂L/∂output is needed
  int64_t param_count = 0;
  /// Elements of its parameters that learn: param_count less what train.freeze froze (Model::set_frozen).
  int64_t trainable = 0;
  /// Per parameter (Layer::param_shapes' order): frozen by train.freeze. Empty until set_frozen.
  std::vector<bool> frozen;
  int tied_to = -1;               ///< `tied_to:`: the node position of the layer whose weight this one uses
  bool adds_param_grads = false;  ///< its weight is shared with a later layer, whose backward writes first
  int block = -1;                 ///< the pass of a top-level `repeat:` block it belongs to (an id); -1: none
};

/// train.recompute: which activations are dropped after the forward pass and computed again in the backward.
enum class Recompute {
  none,    ///< every output stays until the backward pass
  blocks,  ///< outputs used only inside their pass of a top-level `repeat:` block share one set of buffers
  all,     ///< as blocks, with every other layer in segments of about √n: any model (Model::set_recompute)
};

class Model {
 public:
  /// Builds the layers of `spec` (parse_model_spec's) for per-sample inputs of `input_shape`. Every problem the
  /// parse could not see (a bad argument, shapes that do not fit) is a ConfigError naming the layer's path.
  /// With `init_params` false no parameter is created (shapes, counts and FLOPs only): `gputrain check` sizes
  /// models that would not fit in memory this way; such a model cannot be allocated or run.
  static Model build(const ModelSpec& spec, const Shape& input_shape, DType dtype, Device device, uint64_t seed,
                     bool init_params = true);

  /// The elements allocate(max_batch) gives node i: its output, the gradient of its output (when something
  /// before it learns and it is not the last node) and a scratch gradient (when several consumers write its
  /// gradient). All zero for a view layer, which borrows its input's buffers.
  /// Under train.recompute, the outputs that are recomputed share one buffer per position in a segment (as large as
  /// the largest of them): the first node at each position (in execution order) is given it, the others 0.
  /// Under set_activation_storage the outputs kept in 16 bits have `half` elements of 2 bytes each, and the forward
  /// pass writes them into a few shared f32 working buffers, given (as `output`) to the first node that uses each.
  /// `dtype` is the element type of output, gradient and scratch (activation_dtype()).
  struct NodeBuffers {
    int64_t output = 0, gradient = 0, scratch = 0, half = 0;
    DType dtype = DType::f32;
  };
  std::vector<NodeBuffers> buffer_plan(int64_t max_batch) const;
  /// Fails at `where` (data.batch_size) when a batch of `batch` samples makes a tensor past limits::kElements
  /// or a FLOP count past 64 bits in some layer: run before the buffers are sized, so nothing wraps around.
  void check_batch(int64_t batch, const ConfigNode& where) const;
  /// Allocates activation and gradient buffers for batches of up to `max_batch` samples (buffer_plan's).
  void allocate(int64_t max_batch);
  /// train.recompute (before buffer_plan and allocate). The nodes are cut into segments of consecutive nodes; a node
  /// whose output is read only inside its segment keeps no output of its own after the forward pass (it shares one
  /// buffer per position with the other segments): the backward pass runs the segment's forward again
  /// (LayerContext::recompute) from the outputs kept (those read outside their segment, and the model input), right
  /// before it back-propagates through the segment, and gets the same numbers. The last segment is not run again.
  /// Under `blocks` the segments are the passes of top-level `repeat:` blocks whose layers run one after another;
  /// other nodes keep their outputs. Under `all` those passes are segments too, and every run of other nodes is cut
  /// into segments of at most ⌈√n⌉ nodes (n in the model), of about equal length: checkpoint_sequential's rule
  /// (Chen et al. 2016), about √n outputs kept at the boundaries plus about √n shared buffers, for one more forward
  /// pass, on any model. A last run of at most ⌈√n⌉ nodes right after a pass (a transformer's head) joins that
  /// pass, so that the last pass is not run again (as under `blocks`) for the sake of the head's few outputs. Returns
  /// why the mode cannot be honoured ("" when it can): under `blocks`, no block, or no block whose layers run one after
  /// another with an output used only inside; under `all`, fewer than two segments with an output used only inside
  /// (nothing would be recomputed: a model of at most three layers).
  std::string set_recompute(Recompute mode);
  Recompute recompute() const { return m_recompute; }
  /// train.precision bf16/fp16 on the CPU (before buffer_plan and allocate): the outputs the backward pass reads are
  /// kept in `format` once no later forward reads them, and widened to f32 right before a backward that reads them.
  /// The forward pass computes and reads every output in f32 (in a few working buffers shared by outputs whose
  /// forward lives do not overlap), so only the backward sees rounded values. Stay f32: the last output (the loss
  /// reads it), the outputs a recomputed node reads (train.recompute runs the segment again from them and must get
  /// the same numbers), those a layer needs exactly (Layer::reads_exact_inputs), the statistics layers keep
  /// themselves (normalisation's mean and 1/σ, attention's log-sum-exp: attention keeps its q, k, v and output in 16
  /// bits itself, told by LayerContext::half_storage), and the largest outputs where the working buffers would cost
  /// more than their 16-bit copies save (a shallow net: see half_plan). Only what a backward reads is widened
  /// (Layer::backward_reads_input/output), and a layer that takes an input in 16 bits gets it as it is
  /// (Layer::backward_takes_half_input; on a GPU only a dense layer). nullopt (the default): every output in f32.
  void set_activation_storage(std::optional<HalfFormat> format);
  /// The format some outputs are kept in for backward; nullopt when all stay f32 (none set, or none pays).
  std::optional<HalfFormat> activation_storage() const;
  /// train.precision bf16/fp16 on a GPU (f32 models, before buffer_plan and allocate): the layers' outputs and their
  /// gradients are held in `dtype` (bf16 or f16) between layers, the residual stream included, as llm.c holds them,
  /// and the ops compute on them in f32, rounding each result once (ops/wide.h; on CUDA, kernels that read and write
  /// 16 bits). The model's output is 16-bit too: a GPT's logits, which the loss reads and, in place
  /// (loss_writes_over_output), overwrites with their gradient in 16 bits (ops/loss.h). What stays f32: the
  /// parameters and their gradients, a gradient of the output the caller passes in f32, and what layers keep for
  /// backward besides their outputs (attention keeps its q, k, v and output in 16 bits itself, told by
  /// LayerContext::half_storage). Needs every layer to take 16-bit activations
  /// (half_activations_unsupported() empty); replaces set_activation_storage, whose 16-bit copies these buffers are.
  /// The model's own dtype (the default): every output in it.
  void set_activation_dtype(DType dtype);
  /// The dtype of every output and gradient buffer: the model's own unless set_activation_dtype chose 16 bits.
  DType activation_dtype() const { return m_act; }
  /// Why set_activation_dtype cannot hold the outputs in 16 bits, naming the layer that does not take them
  /// (Layer::takes_half_activations); "" when it can.
  std::string half_activations_unsupported() const;
  /// A model built without parameters (`gputrain check`) plans its chains and is sized as on `device`, whose memory
  /// it never touches: what differs between devices is which chains run (a GPU's are a dense layer's) and how the
  /// weights' 16-bit copies are held.
  void plan_for(Device device) {
    GT_CHECK(!m_initialised && m_max_batch == 0, "plan_for on a model with parameters or buffers");
    m_device = device;
    apply_epilogues();
  }
  /// Fused chains (before buffer_plan and allocate): where a layer's output is read by the next layer alone, and
  /// that layer is a step the first can run as an epilogue of its own pass (Layer::takes_epilogue: batch norm
  /// followed by a 2×2 max pool, relu or both; a 2×2 max pool followed by relu; a dense layer followed by relu, GPT-2's
  /// GELU or a residual add), the first runs the chain's forward and backward by itself: the outputs inside the chain
  /// and their gradients are never stored (no buffers; a dense layer keeps GELU's input as its own workspace). On the
  /// CPU the numbers are the same bit for bit; on a CUDA device only a dense layer's chains form
  /// (Layer::takes_epilogue_on_cuda), run in cuBLASLt's epilogue, whose sums and GELU round as cuBLASLt does. On by
  /// default (GPUTRAIN_CPU_FUSE=off turns it off, on a GPU too); not with train.recompute, half activation storage
  /// or synchronised batch norm, which keep every layer apart. The layers know their epilogues from the setting that
  /// decides them on (so that their workspace and scratch sizes, and the footprint read from them, follow).
  void set_fusion(bool on) {
    m_fusion = on;
    apply_epilogues();
  }
  /// The chains in force: per node, the position of the last node of the chain it heads (-1: it heads none), the
  /// head of the chain it belongs to otherwise (-1: none), and a head's epilogue. Empty when none is in force.
  struct Chains {
    std::vector<int> tail, head;
    std::vector<ops::Epilogue> epilogue;
    /// A head whose epilogue is the residual add: the add's other input (-1: the model's input), which the head's
    /// forward gets as a second input.
    std::vector<int> residual;
    std::vector<int64_t> flops;  ///< a head's forward FLOPs per sample with its members' (profiler spans)
    bool any() const { return !tail.empty(); }
    /// Node i's output is never stored: a head's, or a member's before its tail.
    bool unstored(size_t i) const {
      return any() && (tail[i] >= 0 || (head[i] >= 0 && tail[static_cast<size_t>(head[i])] != static_cast<int>(i)));
    }
    /// Where node i's forward writes: its tail's output when it heads a chain, else its own.
    size_t writes(size_t i) const { return any() && tail[i] >= 0 ? static_cast<size_t>(tail[i]) : i; }
    /// Whether node i's forward runs at all (not when its head runs it).
    bool runs(size_t i) const { return !any() || head[i] < 0; }
    /// Whether node i's backward runs: a residual add that ends a chain passes its gradient to its other input (its
    /// head back-propagates from the same gradient).
    bool runs_backward(size_t i) const { return runs(i) || epilogue[static_cast<size_t>(head[i])].add; }
  };
  Chains chains() const;
  /// Hands each layer the epilogue chains() gives it (none when no chain is in force).
  void apply_epilogues();
  /// Tests: widen every kept output a backward could read (its inputs' sources and its own), and never hand a layer
  /// an input in 16 bits, ignoring what layers say they read (Layer::backward_reads_input and the rest); the
  /// gradients must come out the same bit for bit either way.
  void set_widen_everything(bool on) { m_widen_everything = on; }
  /// Elements of the scratch the layers share (LayerContext::scratch) for batches of up to `batch`: the largest
  /// Layer::scratch_numel.
  int64_t layer_scratch_numel(int64_t batch) const;
  /// Elements widened from 16 bits for backward passes since allocate (tests, benchmarks).
  int64_t widened_elements() const { return m_widened; }
  /// Runs the forward pass over x (B, input shape) with B ≤ max_batch; returns the output (B, output shape).
  const Tensor& forward(const Tensor& x, const LayerContext& ctx);
  /// Why forward_decode cannot run this model, naming the layer ("" when it can): every layer must take decoding
  /// calls (Layer::decodes) and keep the leading dimension T of the per-sample input [T, …] in its output.
  std::string decode_unsupported() const;
  /// Incremental forward of one sequence in evaluation mode, for sampling with a key/value cache: x [1, t, …] holds
  /// positions [position, position + t) of a sample of [T, …] (position + t ≤ T); the positions before it went
  /// through the calls since the last one at position 0, whose keys and values the attention layers kept. Returns
  /// the output at those positions, [1, t, …], in the buffers allocate() made. Needs decode_unsupported() == "".
  const Tensor& forward_decode(const Tensor& x, int64_t position);
  /// Back-propagates dout (B, output shape) from the last forward pass into the parameter gradients.
  void backward(const Tensor& dout, const LayerContext& ctx);
  /// Whether the loss may write ∂L/∂output over the output itself, the fused classifier's in-place gradient (a
  /// GPT's [B·T, V] logits are the largest tensor of its step): the model is f32, its last layer is not a view, no
  /// fused chain ends there, and that layer's backward never reads its output (Layer::backward_reads_output: a
  /// dense head's reads x and W). Its buffer is then its own (the loss reads it, so recompute and half storage
  /// never share it). Known from the layers alone, before allocate (`gputrain check` counts it).
  bool loss_writes_over_output() const;
  /// After allocate, when loss_writes_over_output(): the output's buffer, max_batch rows, which every forward
  /// pass writes again; else undefined.
  Tensor output_buffer() const;

  /// train.freeze (after build, before buffer_plan and allocate): a parameter whose full name ("layers.1.weight",
  /// "blocks.0.attn.qkv.weight"; a tied layer's "<name>.weight" also names its owner's weight, the one tensor both
  /// use) matches one of the globs `patterns` (fnmatch) and none of `except` stops learning. It keeps its values,
  /// has no gradient buffer (Param::frozen; a built model frees its gradient), and is no longer among params():
  /// the optimizer, gradient clipping, data-parallel averaging and ZeRO never see it. Nodes before which nothing
  /// learns any more run no backward pass and get no gradient buffers (PyTorch's requires_grad_(False) does the
  /// same). Applies afresh on each call (an empty `patterns` unfreezes all). Returns how many parameters each
  /// pattern matched (a tied weight counts once).
  std::vector<int64_t> set_frozen(const std::vector<std::string>& patterns,
                                  const std::vector<std::string>& except = {});
  /// Folds every LoRA adapter into its weight and drops it (`gputrain export --merge-lora`; a host f32 model): the
  /// model then computes what it computed with them, as a plain model.
  void merge_lora();
  /// Whether some layer has a LoRA adapter (train.lora or a layer's `lora:`).
  bool has_lora() const;
  /// The parameters that learn by full name and element count, in params()' order, known from the shapes alone (a
  /// model built without parameters has them too: `gputrain check` matches optimizer.param_groups against them).
  std::vector<std::pair<std::string, int64_t>> trainable_sizes() const;
  /// Elements of the parameters that learn (all of them unless set_frozen froze some).
  int64_t trainable_count() const;
  /// The parameters that learn (all, unless set_frozen froze some), in execution order.
  std::vector<Param*> params();
  /// params() with their full names ("layers.1.weight").
  std::vector<std::pair<std::string, Param*>> named_params();
  /// Every parameter and buffer (batch-norm running statistics) by name, in config-list order: what a saved
  /// model holds ("layers.1.weight", "layers.2.running_mean").
  std::vector<std::pair<std::string, Tensor*>> state_tensors();
  const std::vector<GraphNode>& nodes() const { return m_nodes; }
  const Shape& input_shape() const { return m_input_shape; }
  const Shape& output_shape() const { return m_nodes.back().out_shape; }
  int64_t param_count() const;
  int64_t forward_flops() const;
  DType dtype() const { return m_dtype; }
  Device device() const { return m_device; }
  /// The layer list as config after defaults (for config.resolved.yaml).
  YAML::Node resolved_layers() const;
  /// Times every layer's forward and backward into `p` while it is enabled (nullptr: off).
  void set_profiler(SpanTimer* p) { m_profiler = p; }
  /// Called with a node's index right after its backward has run, when its parameter gradients are final
  /// (data-parallel training starts averaging them then). Empty: nothing is called.
  void set_grad_ready_hook(std::function<void(size_t)> hook) { m_grad_ready = std::move(hook); }
  /// Called with a node's index right before a backward writes its parameter gradients: before the node's own
  /// backward, and before that of a layer tied to its weight (dist.zero 2 allocates the gradients there).
  void set_grad_begin_hook(std::function<void(size_t)> hook) { m_grad_begin = std::move(hook); }
  /// Called with a node's index right before a forward, a recomputed forward or a backward reads its parameters (for a
  /// tied layer, with its owner's index too): dist.zero 3 gathers the node's unit of parameters there
  /// (ZeroOptimizer::use_node). Empty: nothing is called.
  void set_param_use_hook(std::function<void(size_t)> hook) { m_param_use = std::move(hook); }
  /// dist.sync_batchnorm: batch norm layers normalise training batches over the ranks that `sum_over_ranks` sums
  /// over (a host collective, called once per batch norm layer in each pass, so every rank must run the same passes).
  /// Empty: per process. Throws gt::Error for a model on a GPU, where it is not built.
  void set_sync(ops::SumOverRanks sum_over_ranks);
  /// Node i's parameters that learn (empty for layers without any).
  std::vector<std::vector<Param*>> params_by_node();
  /// Node i's parameters, frozen ones too (dist.zero 3 shards them all).
  std::vector<std::vector<Param*>> all_params_by_node();
  /// The edges of the graph, one line per node with inputs other than its predecessor ("" for a chain).
  std::string edges() const;
  /// The table `gputrain check` prints: layer, type, output shape, parameters, and totals.
  std::string summary_table(int64_t batch) const;

 private:
  /// The forward pass over m_input, shared by forward and forward_decode: node i writes into output(i), a part of
  /// its buffer (a view layer's output is its input in the view's shape), timed into `profiler` (nullptr: not).
  const Tensor& run_nodes(const LayerContext& ctx, SpanTimer* profiler, const std::function<Tensor(size_t)>& output);
  /// Node i's forward FLOPs per sample, with those of the chain members it runs (profiler spans).
  int64_t chain_flops(size_t i) const {
    return m_chains.any() && m_chains.tail[i] >= 0 ? m_chains.flops[i] : m_nodes[i].layer->forward_flops();
  }
  /// The same for node i's backward pass: a residual add back-propagates on its own.
  int64_t chain_backward_flops(size_t i) const {
    return m_chains.any() && m_chains.tail[i] >= 0 && m_chains.epilogue[i].add ? m_nodes[i].layer->forward_flops()
                                                                               : chain_flops(i);
  }
  /// set_activation_storage's plan: per node, its working buffer (-1: the output is not kept in half); per working
  /// buffer, its elements per sample (the largest output that uses it); per node, the outputs whose last forward
  /// reader it is (packed to half right after its forward, their working buffers then free for later nodes).
  struct HalfPlan {
    std::vector<int> pool;
    std::vector<int64_t> pool_numel;
    std::vector<std::vector<int>> pack_after;
  };
  HalfPlan half_plan() const;
  /// Widens the half outputs node i's backward reads (its own, the sources of its inputs) into their working buffers,
  /// and sets m_half_inputs for the inputs its layer takes in 16 bits instead.
  void widen_for_backward(size_t i);
  /// What forward and backward add to the caller's context: the rank sum, the layers' scratch, their half storage.
  void set_layer_context(LayerContext& ctx);
  /// Which nodes need ∂L/∂output (GraphNode::needs_grad: something at or before them learns) and which node's buffer
  /// holds it (grad_owner), from the nodes' trainable counts.
  void update_grad_flow();
  /// train.lora, in build between the shapes and the parameters: an adapter on each product whose weight's full name
  /// a target matches; a target that matches none is a ConfigError at train.lora.
  void add_lora(const LoraPlan& plan);
  /// Whether set_frozen froze the parameter named "weight" of `n` (the one a tied layer shares).
  static bool weight_frozen(const GraphNode& n);
  /// How many (consumer, input) pairs write the gradient buffer of each node in the backward pass.
  std::vector<int> grad_writers() const;
  /// Calls the parameter-use hook for node i and the owner of the weight it is tied to (set_param_use_hook).
  void use_params(size_t i) {
    if (!m_param_use) return;
    m_param_use(i);
    if (m_nodes[i].tied_to >= 0) m_param_use(static_cast<size_t>(m_nodes[i].tied_to));
  }
  /// train.recompute: runs the forward pass of segment `s`'s recomputed nodes again, into their shared buffers.
  void recompute_segment(int s, const LayerContext& ctx);

  std::vector<GraphNode> m_nodes;
  Shape m_input_shape;
  DType m_dtype = DType::f32;
  Device m_device;
  int64_t m_max_batch = 0;
  std::vector<Tensor> m_out_buf, m_grad_buf;  // per node, max_batch rows (undefined for view layers)
  std::vector<Tensor> m_out, m_grad;          // per node, this batch's rows
  std::vector<Tensor> m_scratch_buf;          // per owner written by several consumers: their second and later dx
  std::vector<int> m_grad_writers;            // grad_writers(), once the graph is built
  bool m_initialised = false;                 // build() created the parameters
  Tensor m_input;                             // the last forward's input
  std::function<void(size_t)> m_grad_ready, m_grad_begin, m_param_use;
  SpanTimer* m_profiler = nullptr;
  ops::SumOverRanks m_sync;
  bool m_decodes = false;  // forward_decode found decode_unsupported() empty once
  // train.recompute: per node, its position in the shared buffers (-1: an output of its own) and its segment (-1:
  // none); per segment id in use, the first and last node positions; the per-sample size of each shared buffer; and
  // the segment whose values the shared buffers hold now (-1: none for sure).
  Recompute m_recompute = Recompute::none;
  std::vector<int> m_slot;
  std::vector<int> m_segment;
  std::map<int, std::pair<size_t, size_t>> m_segment_range;
  std::vector<int64_t> m_slot_numel;
  std::vector<Tensor> m_slot_buf;
  int m_resident = -1;
  DType m_act = DType::f32;  // set_activation_dtype (the model dtype until then)
  // set_activation_storage: the format, half_plan(), the working buffers and each half output's 16-bit copy.
  std::optional<HalfFormat> m_half;
  HalfPlan m_half_plan;
  std::vector<Tensor> m_pool_buf;
  /// Per working buffer, the node whose widened output it holds in this backward pass (-1: none yet): a buffer
  /// widened for one node's backward is not widened again for the next reader of the same output.
  std::vector<int> m_pool_holds;
  std::vector<std::shared_ptr<Storage>> m_half_buf;
  /// The 16-bit inputs of the node whose backward runs (LayerContext::half_inputs), and set_widen_everything.
  std::vector<ops::HalfMatrix> m_half_inputs;
  bool m_widen_everything = false;
  /// set_fusion, and the chains allocate put in force (chains()).
  bool m_fusion = cpu::env_cpu_fusion();
  Chains m_chains;
  /// LayerContext::scratch (the largest Layer::scratch_numel at max_batch; undefined when no layer needs one) and
  /// LayerContext::half_storage for training passes (activation_storage(), fixed at allocate).
  Tensor m_layer_scratch;
  std::optional<HalfFormat> m_layer_storage;
  int64_t m_widened = 0;
};

}  // namespace gt
