// The layer registry: one explicit sorted table (no static-init registrars, which vanish in static links).
#include "layers/layer.h"

#include <algorithm>

namespace gt {

// The factories, one per layer file (lib/layers/<type>.cpp); declared here, the only place that calls them.
std::unique_ptr<Layer> make_linear(const ConfigNode& cfg);
std::unique_ptr<Layer> make_flatten(const ConfigNode& cfg);
std::unique_ptr<Layer> make_relu(const ConfigNode& cfg);
std::unique_ptr<Layer> make_tanh(const ConfigNode& cfg);
std::unique_ptr<Layer> make_sigmoid(const ConfigNode& cfg);
std::unique_ptr<Layer> make_gelu(const ConfigNode& cfg);
std::unique_ptr<Layer> make_conv2d(const ConfigNode& cfg);
std::unique_ptr<Layer> make_maxpool2d(const ConfigNode& cfg);
std::unique_ptr<Layer> make_avgpool2d(const ConfigNode& cfg);
std::unique_ptr<Layer> make_global_avgpool(const ConfigNode& cfg);
std::unique_ptr<Layer> make_add(const ConfigNode& cfg);
std::unique_ptr<Layer> make_batchnorm1d(const ConfigNode& cfg);
std::unique_ptr<Layer> make_batchnorm2d(const ConfigNode& cfg);
std::unique_ptr<Layer> make_layernorm(const ConfigNode& cfg);
std::unique_ptr<Layer> make_dropout(const ConfigNode& cfg);
std::unique_ptr<Layer> make_softmax(const ConfigNode& cfg);
std::unique_ptr<Layer> make_embedding(const ConfigNode& cfg);
std::unique_ptr<Layer> make_concat(const ConfigNode& cfg);
std::unique_ptr<Layer> make_causal_self_attention(const ConfigNode& cfg);
std::unique_ptr<Layer> make_positional_embedding(const ConfigNode& cfg);

const std::vector<LayerSpec>& layer_registry() {
  // One implementation serves each pair of types (layers/pool2d.cpp, layers/batchnorm.cpp), so they take one set.
  static const std::vector<LayerArg> pool_args = {{"kernel_size", "int or [h, w]", "", "window size", true},
                                                  {"stride", "int or [h, w]", "kernel_size", "", false},
                                                  {"padding", "int or [h, w]", "0", "at most half the window", false}};
  static const std::vector<LayerArg> batchnorm_args = {
      {"momentum", "float", "0.1", "weight of the new batch in the running statistics", false},
      {"eps", "float", "1e-5", "", false}};
  static const std::vector<LayerSpec> table = {
      {"add", "Element-wise sum of two or more inputs of one shape (residual connections).", {}, make_add, 2, 0},
      {"avgpool2d", "Average pooling over [C, H, W]; padding counts in the divisor (PyTorch's count_include_pad=True).",
       pool_args, make_avgpool2d},
      {"batchnorm1d",
       "Batch normalisation of [C] or [C, L] samples over the batch (and L); running statistics in evaluation.",
       batchnorm_args, make_batchnorm1d},
      {"batchnorm2d",
       "Batch normalisation of [C, H, W] samples per channel; running statistics in evaluation. Statistics stay "
       "per process in distributed training unless `dist.sync_batchnorm` is set.",
       batchnorm_args, make_batchnorm2d},
      {"causal_self_attention",
       "GPT-2's attention over [T, C]: qkv = x·W_qkvᵀ + b, causal softmax(q·kᵀ/√d)·v per head, then an output "
       "projection; weights N(0, 0.02) and zero biases as GPT-2 and llm.c. Parameters qkv.weight [3C, C] (llm.c's "
       "c_attn), proj.weight [C, C] (c_proj) and their biases.",
       {{"heads", "int", "", "attention heads; C must be a multiple", true},
        {"bias", "bool", "true", "biases on both projections", false},
        {"proj_init_std", "float", "0.02",
         "std of the output projection's N(0, std) init; GPT-2 and llm.c use 0.02 / √(2 · layers) for the residual "
         "projections",
         false},
        {"dropout", "float", "0",
         "drop probability in [0, 1) for the attention probabilities in training (nanoGPT's attn_dropout, PyTorch's "
         "scaled_dot_product_attention dropout_p); masks from Philox keyed by the layer and the step",
         false},
        {"lora", "{rank, alpha, dropout}", "none",
         "LoRA adapters on both projections, qkv and proj, {rank: r, alpha: a, dropout: p} (train.lora can choose "
         "one: *.attn.qkv.weight)",
         false}},
       make_causal_self_attention},
      {"concat",
       "Concatenates two or more inputs along a per-sample dimension; the others must match.",
       {{"dim", "int", "0", "per-sample dimension (0 = channels of [C, H, W]; negative counts from the end)", false}},
       make_concat,
       2,
       0},
      {"conv2d",
       "2-D convolution over [C, H, W] → [out_channels, H', W'] (on the CPU: Winograd F(2x2,3x3) for 3x3 stride-1 "
       "windows of 16+ channels, im2col + GEMM otherwise); initialised like "
       "torch.nn.Conv2d.",
       {{"out_channels", "int", "", "", true},
        {"kernel_size", "int or [h, w]", "", "", true},
        {"stride", "int or [h, w]", "1", "", false},
        {"padding", "int or [h, w]", "0", "zero padding on each side", false},
        {"dilation", "int or [h, w]", "1", "", false},
        {"groups", "int", "1", "channels are split into this many independent groups", false},
        {"bias", "bool", "true", "", false}},
       make_conv2d},
      {"dropout",
       "Zeroes each element with probability p in training (scaling the rest by 1/(1−p)); the identity in evaluation. "
       "Masks come from Philox keyed by the layer and the step, so runs and resumed runs repeat exactly.",
       {{"p", "float", "", "drop probability in [0, 1)", true}},
       make_dropout},
      {"embedding",
       "Learned rows picked by integer-valued inputs: [...] → [..., embedding_dim]; N(0, 1) init like "
       "torch.nn.Embedding.",
       {{"num_embeddings", "int", "", "table size; inputs must be in [0, num_embeddings)", true},
        {"embedding_dim", "int", "", "", true},
        {"init_std", "float", "1", "the table's N(0, std) init (GPT-2: 0.02)", false}},
       make_embedding},
      {"flatten", "Flattens each sample to one dimension: [C, H, W] → [C·H·W]. No copy.", {}, make_flatten},
      {"gelu",
       "GELU: x·Φ(x) exactly (PyTorch's default), or its tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + "
       "0.044715·x³))) as GPT-2 and llm.c use it.",
       {{"approximate", "none or tanh", "none", "PyTorch's approximate argument", false}},
       make_gelu},
      {"global_avgpool", "Mean over each channel's plane: [C, H, W] → [C].", {}, make_global_avgpool},
      {"layernorm",
       "Layer normalisation over the last dimension, with learned scale and shift.",
       {{"eps", "float", "1e-5", "", false}},
       make_layernorm},
      {"linear",
       "Fully connected: y = x·Wᵀ + b over the last dimension. W is [out, in], initialised U(±1/√in) like "
       "torch.nn.Linear.",
       {{"out_features", "int", "", "output features", true},
        {"bias", "bool", "true", "add a learned bias", false},
        {"tied_to", "layer name", "none",
         "use that embedding's table as W (GPT-2's lm head): one parameter, the gradients of both uses summed; "
         "out_features may be below the table's rows, using the first ones (llm.c's padded vocabulary)",
         false},
        {"init_std", "float", "none",
         "N(0, std) weights and zero biases instead of torch.nn.Linear's uniform (GPT-2: 0.02, its residual "
         "projections 0.02 / √(2 · layers))",
         false},
        {"lora", "{rank, alpha, dropout}", "none",
         "a LoRA adapter on the product, {rank: r, alpha: a, dropout: p} (alpha defaults to r): lora_A [r, in] "
         "U(±1/√in), lora_B [out, r] zero, output + α/r · dropout(x)·Aᵀ·Bᵀ (train.lora adds them by name and "
         "freezes the rest; docs/runs.md)",
         false}},
       make_linear},
      {"maxpool2d", "Max pooling over [C, H, W]; the gradient goes to the first maximum of each window.", pool_args,
       make_maxpool2d},
      {"positional_embedding",
       "Adds a learned row per position to a sequence of [T, C]: y[t] = x[t] + P[t] (GPT-2's wpe); P is "
       "[max_len, C], N(0, 0.02) init as GPT-2 and llm.c.",
       {{"max_len", "int", "", "longest sequence (rows of P); T ≤ max_len", true}},
       make_positional_embedding},
      {"relu", "max(x, 0).", {}, make_relu},
      {"sigmoid", "1 / (1 + e^−x).", {}, make_sigmoid},
      {"softmax",
       "Softmax over the last dimension (cross_entropy takes raw logits: do not end a classifier with it).",
       {},
       make_softmax},
      {"tanh", "tanh(x).", {}, make_tanh},
  };
  return table;
}

const LayerSpec* find_layer(std::string_view type) {
  const auto& table = layer_registry();
  auto it = std::find_if(table.begin(), table.end(), [&](const LayerSpec& s) { return s.type == type; });
  return it == table.end() ? nullptr : &*it;
}

std::string layer_reference_markdown() {
  std::string out =
      "Every layer also takes `name:` (default `layers.<index>`) and `inputs:` (names of earlier or later layers, or "
      "`input` for the model input; default: the layer listed before it). The model's output is the last layer "
      "listed.\n\n"
      "A block written `{repeat: N, name: h, layers: [...]}` stands for its layers N times over, named `h.0.<name>`, "
      "`h.1.<name>`, … (unnamed ones `h.<k>.<index>`); inside it, `inputs:` names the block's own layers first, and "
      "`input` is the block's input (the layer before that repetition), so a residual block is "
      "`{type: add, inputs: [input, attn]}`. `gputrain check` prints the expanded model.\n\n"
      "| type | arguments | what it does |\n|---|---|---|\n";
  for (const LayerSpec& s : layer_registry()) {
    std::string args;
    for (const LayerArg& a : s.args) {
      if (!args.empty()) args += "<br>";
      args += fmt::format("`{}` ({}{})", a.name, a.type, a.required ? ", required" : ", default " + a.fallback);
      if (!a.doc.empty()) args += ": " + a.doc;
    }
    out += fmt::format("| `{}` | {} | {} |\n", s.type, args.empty() ? "—" : args, s.summary);
  }
  return out;
}

}  // namespace gt
