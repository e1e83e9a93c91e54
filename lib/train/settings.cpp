// Reading and writing back the train and checkpoint sections; each unknown key or bad value names its path.
#include "train/settings.h"

#include "config/choice.h"
#include "config/schema.h"
#include "data/tokens.h"

namespace gt {
namespace {

const Choice<NonFinitePolicy> kNonfinitePolicies[] = {
    {NonFinitePolicy::abort, "abort"},
    {NonFinitePolicy::skip, "skip"},
    {NonFinitePolicy::rollback, "rollback"},
};

const Choice<Precision> kPrecisions[] = {
    {Precision::fp32, "fp32"},
    {Precision::tf32, "tf32"},
    {Precision::bf16, "bf16"},
    {Precision::fp16, "fp16"},
};

const Choice<Recompute> kRecomputeModes[] = {
    {Recompute::none, "none"},
    {Recompute::blocks, "blocks"},
    {Recompute::all, "all"},
};

const Choice<KeepBest> kKeepBestMetrics[] = {
    {KeepBest::none, "none"},
    {KeepBest::test_accuracy, "test_accuracy"},
    {KeepBest::test_loss, "test_loss"},
};

const SectionSpec& profile_section() {
  static const SectionSpec s = plain_section(
      {
          {.name = "start_step",
           .kind = KeyKind::size,
           .min = 1,
           .limit = &limits::kSteps,
           .fallback = "5",
           .doc = "the first optimizer step profiled (1-based)"},
          {.name = "steps",
           .kind = KeyKind::size,
           .min = 1,
           .limit = &limits::kSteps,
           .fallback = "20",
           .doc = "optimizer steps profiled"},
      },
      "profile these optimizer steps: trace.json and a per-layer time table (--profile sets the defaults)");
  return s;
}

const SectionSpec& grad_clip_section() {
  static const SectionSpec s =
      plain_section({{.name = "max_norm",
                      .kind = KeyKind::number,
                      .required = true,
                      .min = 0,
                      .min_exclusive = true,
                      .doc = "scale all gradients so that their global L2 norm is at most this (clip_grad_norm_)"}},
                    "gradient clipping by the global L2 norm");
  return s;
}

const SectionSpec& loss_scale_section() {
  static const SectionSpec s = plain_section(
      {
          {.name = "init",
           .kind = KeyKind::number,
           .min = 0,
           .max = 1e30,
           .min_exclusive = true,
           .fallback = "65536",
           .doc = "the first scale (GradScaler's init_scale, 2^16)"},
          {.name = "growth_factor",
           .kind = KeyKind::number,
           .min = 1,
           .max = 1e6,
           .fallback = "2",
           .doc = "the scale is multiplied by this after growth_interval finite steps in a row"},
          {.name = "backoff_factor",
           .kind = KeyKind::number,
           .min = 0,
           .max = 1,
           .min_exclusive = true,
           .fallback = "0.5",
           .doc = "and by this on a step with an Inf or NaN gradient, which is skipped"},
          {.name = "growth_interval",
           .kind = KeyKind::size,
           .min = 1,
           .limit = &limits::kSteps,
           .fallback = "2000",
           .doc = "finite steps in a row before the scale grows"},
      },
      "a dynamic loss scale (PyTorch's GradScaler)");
  return s;
}

// train.init_from and the keys that shape it.
void parse_init_keys(const ConfigNode& n, TrainConfig& out) {
  if (n.has("init_from") && !n["init_from"].yaml().IsNull()) {
    out.init_from = n["init_from"].as_string();
    if (out.init_from.empty()) n["init_from"].fail("expected a path to weights, got an empty string");
  }
  out.init_strict = get_bool(n, key_spec(section_keys(train_section()), "init_strict"));
  if (n.has("init_map")) {
    const ConfigNode m = n["init_map"];
    if (!m.is_map()) m.fail("expected a map {old_prefix: new_prefix}");
    for (const std::string& from : m.keys()) out.init_map.emplace_back(from, m[from].as_string());
  }
  if (n.has("init_skip")) {
    const ConfigNode s = n["init_skip"];
    if (!s.is_sequence()) s.fail("expected a list of name patterns");
    for (size_t i = 0; i < s.size(); ++i) out.init_skip.push_back(s.at(i).as_string());
  }
  if (n.has("freeze")) {
    const ConfigNode s = n["freeze"];
    if (!s.is_sequence()) s.fail("expected a list of parameter name patterns");
    for (size_t i = 0; i < s.size(); ++i) {
      out.freeze.push_back(s.at(i).as_string());
      if (out.freeze.back().empty()) s.at(i).fail("expected a pattern, got an empty string");
    }
  }
}

}  // namespace

const SectionSpec& train_section() {
  static const SectionSpec s = plain_section(
      {
          {.name = "epochs", .kind = KeyKind::size, .min = 1, .limit = &limits::kEpochs, .fallback = "1"},
          {.name = "log_every",
           .kind = KeyKind::size,
           .min = 1,
           .limit = &limits::kInterval,
           .fallback = "100",
           .doc = "optimizer steps between console lines and metrics.jsonl rows"},
          {.name = "max_steps",
           .kind = KeyKind::size,
           .min = 0,
           .limit = &limits::kSteps,
           .fallback = "0",
           .doc = "stop after this many optimizer steps (0: no limit)"},
          {.name = "eval_every",
           .kind = KeyKind::any_of,
           .items = {{.name = "epoch", .kind = KeyKind::choice, .choices = {"epoch"}},
                     {.name = "steps", .kind = KeyKind::size, .min = 1, .limit = &limits::kInterval}},
           .fallback = "epoch",
           .doc = "evaluate on the test set after every epoch, or every N optimizer steps (and after the last)"},
          {.name = "accumulate",
           .kind = KeyKind::size,
           .min = 1,
           .limit = &limits::kAccumulate,
           .fallback = "1",
           .doc = "micro-batches per optimizer step"},
          {.name = "grad_clip", .kind = KeyKind::map, .section = &grad_clip_section()},
          {.name = "profile", .kind = KeyKind::map, .section = &profile_section()},
          {.name = "nonfinite",
           .kind = KeyKind::choice,
           .choices = choice_names(kNonfinitePolicies),
           .fallback = "abort",
           .doc = "what a NaN or Inf loss or gradient does"},
          {.name = "precision",
           .kind = KeyKind::choice,
           .choices = choice_names(kPrecisions),
           .fallback = "fp32",
           .doc = "matrix products: fp32; tf32 (GPUs' TF32 tensor cores, fp32 on the CPU); bf16 or fp16 operands with "
                  "fp32 accumulation (the CPU by conversion), the rest fp32"},
          {.name = "recompute",
           .kind = KeyKind::choice,
           .choices = choice_names(kRecomputeModes),
           .fallback = "none",
           .doc = "activation recomputation: none keeps every layer's output for the backward pass; blocks drops the "
                  "outputs used only inside a pass of a top-level repeat: block (they share one set of buffers) and "
                  "computes that pass again right before back-propagating through it: less activation memory for "
                  "one more forward of the blocks, the same numbers; all does the same over segments that cover "
                  "every layer, for any model: each repeat: pass, and the other layers in runs of at most "
                  "ceil(sqrt(n)) consecutive layers (n in the model; checkpoint_sequential's rule: about sqrt(n) "
                  "outputs kept), a short last run joining the pass before it (the last segment is not run again)"},
          {.name = "loss_scale",
           .kind = KeyKind::any_of,
           .nullable = true,
           .items = {{.name = "fixed",
                      .kind = KeyKind::number,
                      .min = 0,
                      .max = 1e30,
                      .min_exclusive = true,
                      .doc = "a fixed scale"},
                     {.name = "dynamic", .kind = KeyKind::map, .section = &loss_scale_section()}},
           .fallback = "null",
           .doc = "scale the loss before backward and unscale the gradients after it: a fixed number, or a dynamic "
                  "scale's settings; null: fp16 runs scale dynamically by the defaults, others do not scale. An "
                  "overflow skips the step without counting against nonfinite while the scale is above 1"},
          {.name = "max_skips",
           .kind = KeyKind::size,
           .min = 1,
           .limit = &limits::kSteps,
           .fallback = "5",
           .doc = "skip: steps skipped in a row; rollback: rollbacks to one checkpoint"},
          {.name = "peak_tflops",
           .kind = KeyKind::number,
           .min = 0,
           .max = 1e9,
           .fallback = "0",
           .doc = "one device's peak TFLOP/s for the MFU; 0: the known GPUs' table, its column chosen by "
                  "train.precision (fp32, tf32, or the 16-bit tensor-core rate for bf16 and fp16)"},
          {.name = "eval_tokens",
           .kind = KeyKind::size,
           .min = 0,
           .limit = &limits::kTokens,
           .fallback = "0",
           .doc = "token data: an evaluation stops after this many predicted tokens (0: all)"},
          {.name = "cuda_graphs",
           .kind = KeyKind::boolean,
           .fallback = "false",
           .doc =
               "GPU, one device: after 3 warm-up steps capture forward, loss, backward, the gradient norm and the "
               "update into one CUDA graph and replay it every step (the batch, learning rate and step count are "
               "written to device memory before each launch); an epoch's last partial batch is dropped (static "
               "shapes). Refused on the CPU, with several ranks or devices, train.accumulate above 1, "
               "train.profile and dropout (its masks are keyed by the step on the host). What of it has run on a GPU: "
               "docs/gpu.md"},
          {.name = "init_from",
           .kind = KeyKind::string,
           .nullable = true,
           .fallback = "null",
           .doc = "start a new run from these weights: a safetensors file, a run directory (its model.safetensors, "
                  "else its newest checkpoint that verifies), a checkpoint folder, an llm.c .bin or an `import llmc` "
                  "folder. Weights only: the optimizer, schedule and step count start afresh; --resume never reads "
                  "them again (docs/runs.md)"},
          {.name = "init_map",
           .kind = KeyKind::custom,
           .fallback = "{}",
           .doc = "rename the source's tensors by prefix before matching, {old_prefix: new_prefix}; the first "
                  "prefix that matches a name renames it",
           .extra_json = R"("type": "object", "additionalProperties": {"type": "string"})"},
          {.name = "init_skip",
           .kind = KeyKind::list,
           .items = {{.name = "pattern", .kind = KeyKind::string}},
           .fallback = "[]",
           .doc = "globs over the model's tensor names (layers.7.*) that keep their fresh initialisation"},
          {.name = "freeze",
           .kind = KeyKind::list,
           .items = {{.name = "pattern", .kind = KeyKind::string}},
           .fallback = "[]",
           .doc = "globs over the parameter names (layers.0.*, blocks.*.attn.*; `gputrain check` lists them) whose "
                  "parameters keep their values: no gradient, no optimizer state, no averaging across ranks, and "
                  "no backward pass through the layers before which nothing learns"},
          {.name = "lora",
           .kind = KeyKind::custom,
           .nullable = true,
           .fallback = "null",
           .doc = "LoRA: {targets: [weight globs], rank: 8, alpha: rank, dropout: 0, also_train: [globs]}: adapters on "
                  "the products of the dense and attention weights the targets name (*.attn.qkv.weight, *.fc.weight), "
                  "and every other parameter frozen but those also_train names (docs/runs.md)",
           .extra_json = R"("type": ["object", "null"])"},
          {.name = "init_strict",
           .kind = KeyKind::boolean,
           .fallback = "true",
           .doc = "refuse model tensors the source lacks and source tensors the model lacks (false: load the rest, "
                  "listing both once); other shapes are always refused"},
      },
      "the training loop");
  return s;
}

const SectionSpec& checkpoint_section() {
  static const SectionSpec s = plain_section(
      {
          {.name = "every_steps",
           .kind = KeyKind::size,
           .min = 0,
           .limit = &limits::kInterval,
           .fallback = "0",
           .doc = "also write a checkpoint every N optimizer steps (0: off)"},
          {.name = "every_epochs",
           .kind = KeyKind::size,
           .min = 0,
           .limit = &limits::kEpochs,
           .fallback = "1",
           .doc = "write one after every N epochs (0: off)"},
          {.name = "keep",
           .kind = KeyKind::size,
           .min = 1,
           .limit = &limits::kInterval,
           .fallback = "3",
           .doc = "newest checkpoints kept"},
          {.name = "keep_best",
           .kind = KeyKind::choice,
           .nullable = true,
           .choices = choice_names(kKeepBestMetrics),
           .fallback = "null",
           .doc = "also keep the checkpoint with the best value of this test metric"},
      },
      "when checkpoints are written and how many stay");
  return s;
}

const std::string& to_string(NonFinitePolicy policy) { return choice_name(kNonfinitePolicies, policy); }
const std::string& to_string(KeepBest metric) { return choice_name(kKeepBestMetrics, metric); }
const std::string& to_string(Recompute mode) { return choice_name(kRecomputeModes, mode); }

void parse_train(const ConfigNode& n, TrainConfig& out) {
  const std::vector<KeySpec>& keys = section_keys(train_section());
  auto key = [&](const char* name) -> const KeySpec& { return key_spec(keys, name); };
  expect_keys(n, keys);
  out.eval_tokens = get_size(n, key("eval_tokens"));
  out.cuda_graphs = get_bool(n, key("cuda_graphs"));
  parse_init_keys(n, out);
  if (n.has("nonfinite")) out.nonfinite = parse_choice(n["nonfinite"], kNonfinitePolicies);
  if (n.has("precision")) out.precision = parse_choice(n["precision"], kPrecisions);
  if (n.has("recompute")) out.recompute = parse_choice(n["recompute"], kRecomputeModes);
  if (n.has("loss_scale") && !n["loss_scale"].yaml().IsNull()) {
    const ConfigNode ls = n["loss_scale"];
    out.loss_scale.set = true;
    if (ls.is_scalar()) {
      out.loss_scale.init = read_double(ls, key("loss_scale").items[0]);
      out.loss_scale.hyper.dynamic = false;
    } else {
      const std::vector<KeySpec>& lk = section_keys(loss_scale_section());
      expect_keys(ls, lk);
      out.loss_scale.init = get_double(ls, key_spec(lk, "init"));
      out.loss_scale.hyper.growth_factor = get_double(ls, key_spec(lk, "growth_factor"));
      out.loss_scale.hyper.backoff_factor = get_double(ls, key_spec(lk, "backoff_factor"));
      out.loss_scale.hyper.growth_interval = get_size(ls, key_spec(lk, "growth_interval"));
    }
  }
  out.max_skips = get_size(n, key("max_skips"));
  out.peak_tflops = get_double(n, key("peak_tflops"));
  if (n.has("profile")) {
    const ConfigNode p = n["profile"];
    const std::vector<KeySpec>& pk = section_keys(profile_section());
    expect_keys(p, pk);
    out.profile_start = get_size(p, key_spec(pk, "start_step"));
    out.profile_steps = get_size(p, key_spec(pk, "steps"));
  }
  out.epochs = get_size(n, key("epochs"));
  out.log_every = get_size(n, key("log_every"));
  out.max_steps = get_size(n, key("max_steps"));
  out.accumulate = get_size(n, key("accumulate"));
  if (n.has("eval_every")) {
    const ConfigNode e = n["eval_every"];
    out.eval_every = e.is_scalar() && e.as_string() == "epoch" ? 0 : read_size(e, key("eval_every").items[1]);
  }
  if (n.has("grad_clip")) {
    const ConfigNode g = n["grad_clip"];
    const std::vector<KeySpec>& gk = section_keys(grad_clip_section());
    expect_keys(g, gk);
    g.require("max_norm");
    out.grad_clip = read_double(g["max_norm"], key_spec(gk, "max_norm"));
  }
}

void parse_checkpoint(const ConfigNode& n, CheckpointConfig& out) {
  const std::vector<KeySpec>& keys = section_keys(checkpoint_section());
  expect_keys(n, keys);
  out.every_steps = get_size(n, key_spec(keys, "every_steps"));
  out.every_epochs = get_size(n, key_spec(keys, "every_epochs"));
  out.keep = get_size(n, key_spec(keys, "keep"));
  if (n.has("keep_best"))  // null (or absent) keeps no best
    out.keep_best = parse_choice(n["keep_best"], kKeepBestMetrics);
}

YAML::Node to_yaml(const TrainConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  n["epochs"] = c.epochs;
  n["log_every"] = c.log_every;
  n["max_steps"] = c.max_steps;
  n["accumulate"] = c.accumulate;
  if (c.eval_every > 0)
    n["eval_every"] = c.eval_every;
  else
    n["eval_every"] = "epoch";
  if (c.grad_clip > 0) n["grad_clip"]["max_norm"] = c.grad_clip;
  if (c.profile_steps > 0) {
    n["profile"]["start_step"] = c.profile_start;
    n["profile"]["steps"] = c.profile_steps;
  }
  n["nonfinite"] = to_string(c.nonfinite);
  n["precision"] = to_string(c.precision);
  n["recompute"] = to_string(c.recompute);
  if (!c.loss_scale.set) {
    n["loss_scale"] = YAML::Node();
  } else if (!c.loss_scale.hyper.dynamic) {
    n["loss_scale"] = c.loss_scale.init;
  } else {
    n["loss_scale"]["init"] = c.loss_scale.init;
    n["loss_scale"]["growth_factor"] = c.loss_scale.hyper.growth_factor;
    n["loss_scale"]["backoff_factor"] = c.loss_scale.hyper.backoff_factor;
    n["loss_scale"]["growth_interval"] = c.loss_scale.hyper.growth_interval;
  }
  n["max_skips"] = c.max_skips;
  if (c.peak_tflops > 0) n["peak_tflops"] = c.peak_tflops;
  n["eval_tokens"] = c.eval_tokens;
  n["cuda_graphs"] = c.cuda_graphs;
  if (!c.freeze.empty()) {  // (the configs of runs that freeze nothing read as they did before the key)
    YAML::Node freeze(YAML::NodeType::Sequence);
    for (const std::string& p : c.freeze) freeze.push_back(p);
    n["freeze"] = freeze;
  }
  if (c.init_from.empty()) return n;  // (the configs of runs that start afresh read as they did before the keys)
  n["init_from"] = c.init_from;
  YAML::Node map(YAML::NodeType::Map), skip(YAML::NodeType::Sequence);
  for (const auto& [from, to] : c.init_map) map[from] = to;
  for (const std::string& p : c.init_skip) skip.push_back(p);
  n["init_map"] = map;
  n["init_skip"] = skip;
  n["init_strict"] = c.init_strict;
  return n;
}

YAML::Node to_yaml(const CheckpointConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  n["every_steps"] = c.every_steps;
  n["every_epochs"] = c.every_epochs;
  n["keep"] = c.keep;
  n["keep_best"] = c.keep_best == KeepBest::none ? YAML::Node() : YAML::Node(to_string(c.keep_best));
  return n;
}

}  // namespace gt
