// llm.c checkpoints: the header and parameter layout of train_gpt2.c (fill_in_parameter_sizes), f32 or bf16, and
// the GPT layers they map to.
#include "io/llmc.h"

#include "core/atomic_file.h"
#include "core/checked.h"
#include "core/limits.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

namespace gt {
namespace {

// Where each of llm.c's tensors lives in gputrain's GPT: a parameter of every block (h.<l>.<suffix>) or of one layer.
struct TensorPlace {
  const char* llmc;
  const char* name;
  bool per_block;
};
constexpr TensorPlace kPlaces[16] = {
    {"wte", "wte.weight", false},
    {"wpe", "wpe.weight", false},
    {"ln1w", "ln_1.weight", true},
    {"ln1b", "ln_1.bias", true},
    {"qkvw", "attn.qkv.weight", true},
    {"qkvb", "attn.qkv.bias", true},
    {"attprojw", "attn.proj.weight", true},
    {"attprojb", "attn.proj.bias", true},
    {"ln2w", "ln_2.weight", true},
    {"ln2b", "ln_2.bias", true},
    {"fcw", "fc.weight", true},
    {"fcb", "fc.bias", true},
    {"fcprojw", "proj.weight", true},
    {"fcprojb", "proj.bias", true},
    {"lnfw", "ln_f.weight", false},
    {"lnfb", "ln_f.bias", false},
};

int32_t read_i32(const uint8_t* p) {  // little-endian, as llm.c writes it on every machine it runs on
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}
void put_i32(uint8_t* p, int64_t v) {
  const auto u = static_cast<uint32_t>(static_cast<int32_t>(v));
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(u >> (8 * i));
}

}  // namespace

float bf16_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN: keep it quiet
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even (an overflow rounds to infinity, as it should)
  return static_cast<uint16_t>(u >> 16);
}

std::vector<std::pair<std::string, Shape>> llmc_tensor_shapes(const LlmcHeader& h) {
  const int64_t L = h.num_layers, C = h.channels;
  return {
      {"wte", Shape{h.padded_vocab_size, C}},
      {"wpe", Shape{h.max_seq_len, C}},
      {"ln1w", Shape{L, C}},
      {"ln1b", Shape{L, C}},
      {"qkvw", Shape{L, 3 * C, C}},
      {"qkvb", Shape{L, 3 * C}},
      {"attprojw", Shape{L, C, C}},
      {"attprojb", Shape{L, C}},
      {"ln2w", Shape{L, C}},
      {"ln2b", Shape{L, C}},
      {"fcw", Shape{L, 4 * C, C}},
      {"fcb", Shape{L, 4 * C}},
      {"fcprojw", Shape{L, C, 4 * C}},
      {"fcprojb", Shape{L, C}},
      {"lnfw", Shape{C}},
      {"lnfb", Shape{C}},
  };
}

LlmcHeader parse_llmc_header(const uint8_t* header, uint64_t file_bytes, const std::string& name) {
  if (file_bytes < kLlmcHeaderBytes)
    throw DataError(fmt::format("{}: {} bytes, shorter than an llm.c checkpoint's {}-byte header", name, file_bytes,
                                kLlmcHeaderBytes));
  const int32_t magic = read_i32(header);
  if (magic != kLlmcMagic)
    throw DataError(fmt::format("{}: not an llm.c model checkpoint (magic {}, expected {})", name, magic, kLlmcMagic));
  LlmcHeader h;
  h.version = read_i32(header + 4);
  if (h.version != 3 && h.version != 5)
    throw DataError(
        fmt::format("{}: llm.c checkpoint version {} (expected 3, f32 parameters, or 5, bf16)", name, h.version));
  struct Field {
    const char* what;
    int64_t* to;
    int64_t max;
  };
  const Field fields[6] = {{"max_seq_len", &h.max_seq_len, limits::kExtent.max},
                           {"vocab_size", &h.vocab_size, limits::kExtent.max},
                           {"num_layers", &h.num_layers, kLlmcMaxLayers},
                           {"num_heads", &h.num_heads, limits::kExtent.max},
                           {"channels", &h.channels, limits::kExtent.max},
                           {"padded_vocab_size", &h.padded_vocab_size, limits::kExtent.max}};
  for (int i = 0; i < 6; ++i) {
    const int64_t v = read_i32(header + 8 + 4 * i);
    if (v < 1 || v > fields[i].max)
      throw DataError(fmt::format("{}: header {} is {}, expected 1 to {}", name, fields[i].what, v, fields[i].max));
    *fields[i].to = v;
  }
  if (h.channels % h.num_heads != 0)
    throw DataError(
        fmt::format("{}: header channels {} is not a multiple of num_heads {}", name, h.channels, h.num_heads));
  if (h.vocab_size > h.padded_vocab_size)
    throw DataError(fmt::format("{}: header vocab_size {} is more than padded_vocab_size {}", name, h.vocab_size,
                                h.padded_vocab_size));
  std::optional<int64_t> params = 0;
  for (const auto& [what, shape] : llmc_tensor_shapes(h)) {
    const std::optional<int64_t> n = shape.checked_numel();
    if (!n || *n > limits::kElements.max)
      throw DataError(fmt::format("{}: tensor {} of {} is more than {} elements ({})", name, what, shape.str(),
                                  limits::kElements.max, limits::kElements.what));
    params = checked_add(params, *n);
  }
  const std::optional<int64_t> bytes = checked_add(checked_mul(params, h.param_bytes()), kLlmcHeaderBytes);
  if (!bytes || static_cast<uint64_t>(*bytes) != file_bytes)
    throw DataError(fmt::format(
        "{}: {} bytes, but its header (L={}, C={}, Vp={}, T={}, version {}) needs {} bytes: {} parameters of {} "
        "bytes after the {}-byte header",
        name, file_bytes, h.num_layers, h.channels, h.padded_vocab_size, h.max_seq_len, h.version,
        bytes ? std::to_string(*bytes) : "more than 2^63", params ? std::to_string(*params) : "too many",
        h.param_bytes(), kLlmcHeaderBytes));
  return h;
}

LlmcCheckpoint read_llmc(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw DataError(fmt::format("{}: a folder, not a checkpoint file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0) throw DataError(fmt::format("{}: cannot tell its size", path));
  in.seekg(0);
  uint8_t header[kLlmcHeaderBytes] = {};
  in.read(reinterpret_cast<char*>(header),
          static_cast<std::streamsize>(std::min<uint64_t>(kLlmcHeaderBytes, static_cast<uint64_t>(end))));
  LlmcCheckpoint c;
  c.header = parse_llmc_header(header, static_cast<uint64_t>(end), path);
  std::vector<uint16_t> half;
  for (const auto& [what, shape] : llmc_tensor_shapes(c.header)) {
    Tensor t = Tensor::empty(shape, DType::f32);
    float* f = t.data<float>();
    const int64_t n = t.numel();
    if (c.header.version == 3) {
      in.read(reinterpret_cast<char*>(f), static_cast<std::streamsize>(n * 4));
    } else {
      half.resize(static_cast<size_t>(n));
      in.read(reinterpret_cast<char*>(half.data()), static_cast<std::streamsize>(n * 2));
      for (int64_t i = 0; i < n; ++i) f[i] = bf16_to_f32(half[static_cast<size_t>(i)]);
    }
    if (!in) throw DataError(fmt::format("{}: read failed in tensor {}: {}", path, what, std::strerror(errno)));
    c.tensors.emplace_back(what, std::move(t));
  }
  return c;
}

void write_llmc(const std::string& path, const LlmcCheckpoint& c) {
  const LlmcHeader& h = c.header;
  GT_CHECK(h.version == 3 || h.version == 5, "llm.c checkpoint version {}", h.version);
  const auto shapes = llmc_tensor_shapes(h);
  GT_CHECK(c.tensors.size() == shapes.size(), "{} tensors for an llm.c checkpoint", c.tensors.size());
  for (size_t i = 0; i < shapes.size(); ++i)
    GT_CHECK(c.tensors[i].second.shape() == shapes[i].second && c.tensors[i].second.dtype() == DType::f32,
             "llm.c tensor {}: {} given, {} f32 expected", shapes[i].first, c.tensors[i].second.shape().str(),
             shapes[i].second.str());
  uint8_t header[kLlmcHeaderBytes] = {};  // the unused slots are zero, as llm.c writes them
  const int64_t fields[8] = {kLlmcMagic,   h.version,   h.max_seq_len, h.vocab_size,
                             h.num_layers, h.num_heads, h.channels,    h.padded_vocab_size};
  for (int i = 0; i < 8; ++i) put_i32(header + 4 * i, fields[i]);

  AtomicFile file(path);
  file.write(header, sizeof header);
  std::vector<uint16_t> half;
  for (const auto& [what, t] : c.tensors) {
    Tensor host = t;
    if (!t.device().is_cpu()) {
      host = Tensor::empty(t.shape(), t.dtype());
      host.copy_from(t);
    }
    const float* f = host.data<float>();
    const auto n = static_cast<size_t>(host.numel());
    if (h.version == 3) {
      file.write(f, n * 4);
      continue;
    }
    half.resize(n);
    for (size_t i = 0; i < n; ++i) half[i] = f32_to_bf16(f[i]);
    file.write(half.data(), n * 2);
  }
  file.commit();
}

std::string llmc_model_yaml(const LlmcHeader& h) {
  return fmt::format(R"(layers:
  - {{type: embedding, name: wte, num_embeddings: {Vp}, embedding_dim: {C}}}
  - {{type: positional_embedding, name: wpe, max_len: {T}}}
  - repeat: {L}
    name: h
    layers:
      - {{type: layernorm, name: ln_1}}
      - {{type: causal_self_attention, name: attn, heads: {NH}}}
      - {{type: add, name: res_1, inputs: [input, attn]}}
      - {{type: layernorm, name: ln_2}}
      - {{type: linear, name: fc, out_features: {C4}}}
      - {{type: gelu, approximate: tanh}}
      - {{type: linear, name: proj, out_features: {C}}}
      - {{type: add, inputs: [res_1, proj]}}
  - {{type: layernorm, name: ln_f}}
  - {{type: linear, name: lm_head, tied_to: wte, bias: false, out_features: {V}}}
)",
                     fmt::arg("Vp", h.padded_vocab_size), fmt::arg("C", h.channels), fmt::arg("T", h.max_seq_len),
                     fmt::arg("L", h.num_layers), fmt::arg("NH", h.num_heads), fmt::arg("C4", 4 * h.channels),
                     fmt::arg("V", h.vocab_size));
}

std::string llmc_config_yaml(const LlmcHeader& h, const std::string& name, const std::string& source) {
  const std::string model = llmc_model_yaml(h);  // indented under `model:`
  std::string indented;
  size_t start = 0;
  while (start < model.size()) {
    const size_t end = model.find('\n', start);
    indented += "  " + model.substr(start, end - start) + "\n";
    start = end == std::string::npos ? model.size() : end + 1;
  }
  return fmt::format(
      R"(# Imported from llm.c's checkpoint {source} (version {version}, {dtype} parameters): GPT-2 with {L} layers,
# {NH} heads, {C} channels, a vocabulary of {V} padded to {Vp} rows (the padded rows are kept and never predicted)
# and sequences of up to {T} tokens. To evaluate it on a shard (llm.c's or `gputrain tokenize`'s):
#   gputrain eval config.yaml --checkpoint model.safetensors --set data.test.path=VAL.bin --set data.block_size=64
# To train, add `train: {{path: GLOB}}` under data (llm.c token shards).
name: {name}
seed: 0
data:
  format: tokens
  test: {{path: val.bin}}  # a placeholder: set it to the shard to evaluate
  block_size: {T}
  vocab_size: {V}
  batch_size: 4
model:
{model}loss: cross_entropy
# train_gpt2.c's update: AdamW, learning rate 1e-4, betas (0.9, 0.999), eps 1e-8, no weight decay.
optimizer: {{type: adamw, lr: 1.0e-4, betas: [0.9, 0.999], eps: 1.0e-8, weight_decay: 0.0}}
)",
      fmt::arg("source", source), fmt::arg("version", h.version), fmt::arg("dtype", h.version == 5 ? "bf16" : "f32"),
      fmt::arg("L", h.num_layers), fmt::arg("NH", h.num_heads), fmt::arg("C", h.channels), fmt::arg("V", h.vocab_size),
      fmt::arg("Vp", h.padded_vocab_size), fmt::arg("T", h.max_seq_len), fmt::arg("name", name),
      fmt::arg("model", indented));
}

std::vector<std::pair<std::string, Tensor>> llmc_to_named(const LlmcCheckpoint& c) {
  std::map<std::string, const Tensor*> by_llmc;
  for (const auto& [what, t] : c.tensors) by_llmc[what] = &t;
  std::vector<std::pair<std::string, Tensor>> out;
  auto add = [&](const TensorPlace& p, int64_t block) {
    const Tensor& src = *by_llmc.at(p.llmc);
    if (!p.per_block) {
      out.emplace_back(p.name, src.clone());
      return;
    }
    Tensor slice = src.slice0(block, 1);
    out.emplace_back(fmt::format("h.{}.{}", block, p.name), slice.view(src.shape().sample()).clone());
  };
  add(kPlaces[0], 0);
  add(kPlaces[1], 0);
  for (int64_t l = 0; l < c.header.num_layers; ++l)
    for (int i = 2; i < 14; ++i) add(kPlaces[i], l);
  add(kPlaces[14], 0);
  add(kPlaces[15], 0);
  return out;
}

LlmcHeader llmc_gpt_header(const Model& model, int32_t version) {
  GT_CHECK(version == 3 || version == 5, "llm.c checkpoint version {}", version);
  // The sizes as the model's layers give them; the whole layer list is then compared with llm.c's GPT of those sizes.
  const YAML::Node have = model.resolved_layers();
  auto arg = [&](size_t i, const char* key) -> int64_t {
    if (i >= have.size() || !have[i].IsMap() || !have[i][key]) return 1;
    return have[i][key].as<int64_t>();
  };
  LlmcHeader h;
  h.version = version;
  h.padded_vocab_size = arg(0, "num_embeddings");
  h.channels = arg(0, "embedding_dim");
  h.max_seq_len = arg(1, "max_len");
  h.vocab_size = have.size() ? arg(have.size() - 1, "out_features") : 1;
  h.num_layers = 0;
  for (const GraphNode& n : model.nodes())
    if (n.type == "causal_self_attention") ++h.num_layers;
  h.num_heads = arg(3, "heads");
  std::string why_not;
  YAML::Node want;
  if (h.num_layers < 1 || h.num_layers > kLlmcMaxLayers) {
    why_not =
        fmt::format("it has {} causal_self_attention layers, llm.c's GPT-2 1 to {}", h.num_layers, kLlmcMaxLayers);
  } else {
    try {
      want = Model::build(parse_model_spec(ConfigNode::load_string(llmc_model_yaml(h), "llm.c's GPT-2")), Shape{1},
                          DType::f32, Device::cpu(), 0, /*init_params=*/false)
                 .resolved_layers();
    } catch (const ConfigError& e) {
      why_not = fmt::format("its sizes make no llm.c GPT-2 ({})", e.what());
    }
  }
  if (why_not.empty()) {
    std::vector<const GraphNode*> listed(model.nodes().size());
    for (const GraphNode& n : model.nodes()) listed[n.index] = &n;
    for (size_t i = 0; i < have.size() && i < want.size() && why_not.empty(); ++i) {
      // What only shapes a fresh model or training (initialisation, dropout) is not part of the layout: a model
      // trained from another initialisation holds the same tensors.
      auto layout = [](const YAML::Node& layer) {
        YAML::Node n = YAML::Clone(layer);
        if (n.IsMap())
          for (const char* k : {"init_std", "proj_init_std", "dropout"}) n.remove(k);
        return YAML::Dump(n);
      };
      const std::string a = layout(have[i]), b = layout(want[i]);
      if (a != b) why_not = fmt::format("its layer {} is {}, where llm.c's GPT-2 has {}", listed[i]->name, a, b);
    }
    if (why_not.empty() && have.size() != want.size())
      why_not =
          fmt::format("it has {} layers, llm.c's GPT-2 with {} blocks {}", have.size(), h.num_layers, want.size());
  }
  if (!why_not.empty())
    throw ConfigError(
        fmt::format("model.layers: not llm.c's GPT-2 layout, so it cannot be written as an llm.c "
                    "checkpoint: {}",
                    why_not));

  return h;
}

LlmcCheckpoint llmc_from_model(Model& model, int32_t version) {
  const LlmcHeader h = llmc_gpt_header(model, version);
  std::map<std::string, Tensor*> by_name;
  for (const auto& [name, t] : model.state_tensors()) by_name[name] = t;
  LlmcCheckpoint c;
  c.header = h;
  const auto shapes = llmc_tensor_shapes(h);
  for (int i = 0; i < 16; ++i) {
    const TensorPlace& p = kPlaces[i];
    Tensor t = Tensor::empty(shapes[static_cast<size_t>(i)].second, DType::f32);
    const int64_t blocks = p.per_block ? h.num_layers : 1;
    for (int64_t l = 0; l < blocks; ++l) {
      const std::string name = p.per_block ? fmt::format("h.{}.{}", l, p.name) : std::string(p.name);
      const auto it = by_name.find(name);
      GT_CHECK(it != by_name.end(), "the GPT has no parameter {}", name);
      const Tensor& src = *it->second;
      Tensor dst = p.per_block ? t.slice0(l, 1).view(src.shape()) : t;
      GT_CHECK(src.dtype() == DType::f32 && dst.numel() == src.numel(), "{}: {} {} for llm.c's {} {}", name,
               dtype_name(src.dtype()), src.shape().str(), p.llmc, t.shape().str());
      dst.copy_from(src);
    }
    c.tensors.emplace_back(p.llmc, std::move(t));
  }
  return c;
}

}  // namespace gt
