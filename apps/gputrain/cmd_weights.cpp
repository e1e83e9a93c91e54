// gputrain eval, generate, export, export llmc and import llmc: what is done with trained weights.
#include "cli.h"

#include "core/json.h"
#include "core/ownership.h"
#include "data/tokens.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/evaluation.h"
#include "train/generate.h"
#include "train/llmc.h"
#include "train/setup.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

namespace gt::cli {
namespace {

struct EvalArgs {
  ConfigArgs config;
  std::string checkpoint;
  bool json = false;
  int threads = 0;
};

int eval(EvalArgs& a) {
  a.config.resolve();
  const std::string checkpoint = a.config.weights_or_run(a.checkpoint);
  if (a.json) quiet_log_for_machine_output();
  const ConfigNode root = load_config(a.config.file, a.config.sets);
  // Evaluation reads the test set: a token config whose training shards are gone (a run directory copied without
  // them) is evaluated on its test shards alone; other formats are checked as training checks them.
  Experiment exp = parse_experiment_without_data_files(root);
  if (exp.data.format == DataFormat::tokens && !exp.data.test_tokens.empty() &&
      glob_files(exp.data.train_tokens).empty()) {
    spdlog::warn("eval: no shard matches {}: the test shards alone give the shapes and the vocabulary",
                 exp.data.train_tokens);
    exp.data.train_tokens.clear();
  } else {
    exp = parse_experiment(root);
  }
  const EvalSummary r = evaluate_weights(exp, checkpoint, a.threads);
  if (a.json) {
    fmt::print("{}\n", JsonObject()
                           .add("checkpoint", checkpoint)
                           .add("samples", r.samples)
                           .add("test_loss", r.loss)
                           .add("test_accuracy", r.accuracy)
                           .add("test_bpb", r.bpb)
                           .add("tokens", r.tokens)
                           .str());
  } else {
    fmt::print("{}: test_loss {:.4f} | test_accuracy {}{} ({} samples{})\n", checkpoint, r.loss,
               r.accuracy ? fmt::format("{:.4f}", *r.accuracy) : "n/a",
               r.bpb ? fmt::format(" | test_bpb {:.4f}", *r.bpb) : "", r.samples,
               r.tokens ? fmt::format(", {} tokens", r.tokens) : "");
  }
  return 0;
}

struct GenerateArgs {
  ConfigArgs config;
  GenerateOptions gen;
  std::string device, seed;
};

int generate(GenerateArgs& a) {
  a.config.resolve();
  GenerateOptions opts = a.gen;
  opts.checkpoint = a.config.weights_or_run(opts.checkpoint);
  if (!a.device.empty()) a.config.sets.push_back("device=" + a.device);
  ConfigNode root = load_config(a.config.file, a.config.sets);
  if (!a.seed.empty()) root = apply_override(root, "seed=" + a.seed);  // checked as the config's seed is
  // Generation reads no data file (a token model's shapes are in the config): their paths are not checked.
  const Experiment exp = parse_experiment_without_data_files(root);
  opts.sampling.seed = exp.seed;
  const GenerateSummary r = generate_text(exp, opts, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  if (r.text && isatty(fileno(stdout))) std::fputc('\n', stdout);  // a terminal's prompt on a line of its own
  std::fflush(stdout);
  fmt::print(
      stderr, "generated {} tokens after a prompt of {} in {:.2f} s ({:.1f} tokens/s); window {} positions{}{}{}\n",
      r.new_tokens, r.prompt_tokens, r.seconds, r.seconds > 0 ? static_cast<double>(r.new_tokens) / r.seconds : 0.0,
      r.window, r.slides ? fmt::format(", slid {} times", r.slides) : std::string(),
      r.tokenizer.empty() ? std::string() : fmt::format("; tokenizer {}", r.tokenizer),
      r.stopped.empty() ? std::string() : fmt::format("; stopped at {}", r.stopped));
  return 0;
}

struct ExportArgs {
  std::string from, to;
  bool merge_lora = false;
};

int export_weights(const ExportArgs& a) {
  namespace fs = std::filesystem;
  if (a.from.empty() || a.to.empty())
    throw ConfigError(
        "export needs CHECKPOINT and --to FILE (or: export llmc CONFIG --checkpoint PATH --out MODEL.bin)");
  refuse_output_file("--to", a.to, {a.from});
  std::string dir = a.from;
  if (!fs::exists(fs::path(a.from) / "state.json")) {  // a run directory: its newest checkpoint that verifies
    const auto found = CheckpointStore(a.from, {}).newest_good();
    if (!found)
      throw DataError(fmt::format("{}: no checkpoint that verifies (state.json) in it or its checkpoints/", a.from));
    dir = found->dir;
  }
  refuse_output_file("--to", a.to, {(fs::path(dir) / "model.safetensors").string()});
  const CheckpointInfo ckpt = read_checkpoint(dir);  // sizes and checksums
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  // --merge-lora: the model the checkpoint's own config builds, its adapters folded into the weights.
  const auto tensors = a.merge_lora ? merged_lora_weights(ckpt.config, weights) : read_safetensors(weights);
  std::vector<std::pair<std::string, const Tensor*>> list;
  for (const auto& [name, t] : tensors) list.emplace_back(name, &t);
  write_safetensors(a.to, list,
                    {{"format", "pt"},
                     {"gputrain_version", GPUTRAIN_VERSION},
                     {"step", std::to_string(ckpt.progress.step)},
                     {"gputrain_config", ckpt.config}});
  fmt::print("{}: {} tensors of step {}{} → {}\n", dir, list.size(), ckpt.progress.step,
             a.merge_lora ? ", LoRA adapters merged" : "", a.to);
  return 0;
}

struct ExportLlmcArgs {
  ConfigArgs config;
  std::string weights, out;
  bool bf16 = false;
  bool merge_lora = false;
};

struct ImportLlmcArgs {
  std::string bin, out, tokenizer;
  bool force = false;
};

int import_model(const ImportLlmcArgs& a) {
  const LlmcImport r = import_llmc(a.bin, a.out, a.force, a.tokenizer);
  if (!r.replaced.empty()) fmt::print("{}: replaced the earlier import ({} files removed)\n", a.out, r.replaced.size());
  fmt::print("{}\n", r.summary);
  return 0;
}

constexpr const char* kWeightsHelp =
    "weights: a .safetensors file, a checkpoint folder, or a run directory (its final weights, else its newest good "
    "checkpoint); default: the run directory given as CONFIG";

void add_eval_generate(CLI::App& app, Commands& commands) {
  auto [eval_cmd, e] = commands.add_with<EvalArgs>(
      app, "eval", "test-set loss and accuracy of saved weights (a run's model.safetensors)", eval);
  add_config_args(eval_cmd, e->config);
  eval_cmd->add_option("--checkpoint", e->checkpoint, kWeightsHelp)
      ->check(non_empty("weights: a .safetensors file, a checkpoint folder or a run directory"));
  eval_cmd->add_flag("--json", e->json, "print one JSON object instead of a line");
  eval_cmd->add_option("--threads", e->threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 4096));

  auto [gen, g] = commands.add_with<GenerateArgs>(
      app, "generate",
      "sample tokens from a token model's saved weights (text for a byte vocabulary), with a key/value cache",
      generate);
  add_config_args(gen, g->config);
  gen->add_option("--checkpoint", g->gen.checkpoint, kWeightsHelp)
      ->check(non_empty("weights: a .safetensors file, a checkpoint folder or a run directory"));
  gen->add_option_function<std::string>(
         "--prompt",
         [args = g](const std::string& p) {
           args->gen.prompt = p;
           args->gen.has_prompt = true;
         },
         "the start: text, encoded with the tokenizer (after its end-of-text id) or as bytes for a byte model; "
         "without a tokenizer token ids separated by commas or spaces (default: the end-of-text id alone; a "
         "newline for bytes; <|endoftext|> 50256 for GPT-2 vocabularies, else token 0)")
      ->type_name("TEXT");
  gen->add_option("--tokens", g->gen.tokens, "new tokens to sample (default 256)")->check(CLI::Range(0, 1000000000));
  gen->add_option("--temperature", g->gen.sampling.temperature, "softmax temperature; 0 = greedy argmax (default 1)")
      ->check(CLI::Range(0.0, 1000.0));
  gen->add_option("--top-k", g->gen.sampling.top_k, "sample among the K most likely tokens only (default 0: all)")
      ->check(CLI::Range(0, 1000000000));
  gen->add_option("--top-p", g->gen.sampling.top_p,
                  "sample among the most likely tokens whose probabilities reach P in sum (default 1: all)")
      ->check(CLI::Range(0.0, 1.0));
  gen->add_option("--stop", g->gen.stop, "stop where the new text contains STRING (not printed)")->type_name("STRING");
  gen->add_flag("!--ignore-eot", g->gen.stop_at_end,
                "go on past the end-of-text id (printed as its text) up to --tokens; by default it stops there");
  gen->add_option("--tokenizer", g->gen.tokenizer,
                  "the tokenizer file (default: data.tokenizer, else the run's copy, else the one beside the shards)");
  gen->add_option("--seed", g->seed, "the draws' seed (default: the config's seed)")->type_name("N");
  gen->add_option("--device", g->device, "auto | cpu | cuda | cuda:N (overrides device:)");
  gen->add_option("--threads", g->gen.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 4096));
  gen->footer(
      "Prints the prompt, then each token as it is drawn: text with a tokenizer (a UTF-8 character split over "
      "tokens waits for its last byte) or for a byte model, ids otherwise. The context is "
      "the model's T positions (its input [T]): past T the window slides, keeping the newest T/2 tokens. A line with "
      "the rate goes to stderr. " +
      std::string(kExitCodes));
}

void add_export_import(CLI::App& app, Commands& commands) {
  auto [exporter, x] =
      commands.add_with<ExportArgs>(app, "export",
                                    "write a checkpoint's weights alone, as one safetensors file (or, with `export "
                                    "llmc`, a GPT's as an llm.c checkpoint)",
                                    export_weights);
  // Not marked required: `export llmc …` has neither; without a subcommand both are checked when it runs (exit 2).
  exporter->add_option("checkpoint", x->from, "a checkpoint folder (checkpoints/step-N) or a run directory")
      ->check(non_empty("a checkpoint folder or a run directory"));
  exporter->add_option("--to", x->to, "the safetensors file to write")->check(non_empty("a safetensors file to write"));
  exporter->add_flag("--merge-lora", x->merge_lora,
                     "fold each LoRA adapter into its weight (W + α/r · B·A) and write the plain model's tensors");
  exporter->require_subcommand(0, 1);
  auto [llmc, l] = commands.add_with<ExportLlmcArgs>(
      *exporter, "llmc",
      "write a GPT's weights as an llm.c checkpoint (train_gpt2.c's model file) that llm.c continues from",
      [](ExportLlmcArgs& a) {
        a.config.resolve();
        fmt::print("{}\n", export_llmc(a.config.file, a.config.sets, a.config.weights_or_run(a.weights), a.out, a.bf16,
                                       a.merge_lora));
        return 0;
      });
  add_config_args(llmc, l->config);
  llmc->add_option("--checkpoint", l->weights, kWeightsHelp)
      ->check(non_empty("weights: a .safetensors file, a checkpoint folder or a run directory"));
  llmc->add_option("--out", l->out, "the llm.c checkpoint file to write (MODEL.bin)")
      ->required()
      ->check(non_empty("the llm.c checkpoint file to write"));
  llmc->add_flag("--bf16", l->bf16,
                 "bf16 parameters (llm.c version 5, rounded to nearest even); default f32 (version 3)");
  llmc->add_flag("--merge-lora", l->merge_lora,
                 "fold the config's LoRA adapters into the weights (llm.c's format holds none; a model with adapters "
                 "needs it)");

  CLI::App* importer = commands.group(app, "import", "convert a model from another tool into an experiment folder");
  auto [imp, i] = commands.add_with<ImportLlmcArgs>(
      *importer, "llmc",
      "read an llm.c GPT-2 checkpoint (version 3 f32 or 5 bf16) into DIR/config.yaml and DIR/model.safetensors",
      import_model);
  imp->add_option("model", i->bin, "llm.c's model file (gpt2_124M.bin, a model_*.bin checkpoint)")
      ->required()
      ->check(non_empty("llm.c's model file"));
  imp->add_option("--out", i->out, "the folder to write config.yaml and model.safetensors into")
      ->required()
      ->check(non_empty("the folder to write the model into"));
  imp->add_flag("--force", i->force, "replace an earlier import in DIR (without --force such a folder is refused)");
  imp->add_option("--tokenizer", i->tokenizer,
                  "the model's tokenizer (llm.c's gpt2_tokenizer.bin, a tokenizer.json or a SentencePiece .model): "
                  "kept in DIR and named by data.tokenizer, so that generate prints text");
}

}  // namespace

void add_weights_commands(CLI::App& app, Commands& commands) {
  add_eval_generate(app, commands);
  add_export_import(app, commands);
}

}  // namespace gt::cli
