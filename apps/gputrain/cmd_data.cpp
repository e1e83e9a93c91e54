// gputrain data inspect and gputrain tokenize: the data a config names, and text made into token shards.
#include "cli.h"

#include "core/json.h"
#include "data/inspect.h"
#include "data/tokens.h"
#include "text/byte_tokenizer.h"
#include "train/setup.h"

#include <fmt/format.h>

#include <memory>

namespace gt::cli {
namespace {

struct InspectArgs {
  ConfigArgs config;
  bool json = false;
};

int inspect(InspectArgs& a) {
  a.config.resolve();
  if (a.json) quiet_log_for_machine_output();
  const Experiment exp = parse_experiment(load_config(a.config.file, a.config.sets));
  const LoadedData data = load_data(exp);
  const bool test_only = exp.data.format == DataFormat::tokens && exp.data.train_tokens.empty();
  std::vector<DataStats> splits;
  if (!test_only) splits.push_back(inspect_dataset(data.train, "train", exp.data.train_tokens));
  if (data.test.size() > 0) splits.push_back(inspect_dataset(data.test, "test", exp.data.test_tokens));
  if (a.json) {
    std::string rows;
    for (const DataStats& s : splits) rows += (rows.empty() ? "" : ", ") + data_stats_json(s);
    fmt::print("{{\"config\": {}, \"splits\": [{}]}}\n", json_quote(a.config.file), rows);
  } else {
    for (const DataStats& s : splits) fmt::print("{}", data_stats_text(s));
  }
  return 0;
}

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string out;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  bool force = false;
  SubwordOptions subword;
};

int tokenize(const TokenizeArgs& a) {
  const bool subword = a.subword.vocab_size > 0 || !a.subword.tokenizer.empty();
  const TokenizeResult r = subword
                               ? tokenize_subword(a.inputs, a.out, a.val_fraction, a.shard_tokens, a.force, a.subword)
                               : tokenize_bytes(a.inputs, a.out, a.val_fraction, a.shard_tokens, a.force);
  if (!r.replaced.empty())
    fmt::print("{}: replaced the earlier tokenization ({} files removed)\n", a.out, r.replaced.size());
  fmt::print("{}: {} training and {} validation tokens ({}) in {} shard(s), and {}\n", a.out, r.train_tokens,
             r.val_tokens, r.tokenizer_kind, r.files.size(), r.tokenizer_file);
  return 0;
}

}  // namespace

void add_data_commands(CLI::App& app, Commands& commands) {
  CLI::App* data = commands.group(app, "data", "look at the data a config names");
  auto [inspect_cmd, i] = commands.add_with<InspectArgs>(
      *data, "inspect",
      "per split (train, test): samples, shapes, value range, mean and std per channel, samples per "
      "class; token data: token count, distinct tokens, id range. Reads the data as training does (exit "
      "2 on a config error)",
      inspect);
  add_config_args(inspect_cmd, i->config);
  inspect_cmd->add_flag("--json", i->json, "print one JSON object {\"config\", \"splits\": [...]}");

  auto [tok, t] = commands.add_with<TokenizeArgs>(
      app, "tokenize",
      "text files as llm.c token shards for data.format: tokens: OUT/train_000000.bin …, OUT/val_000000.bin …, "
      "byte-level (vocabulary 256, described by OUT/gputrain_tokenizer.json), or with --vocab-size N a SentencePiece "
      "vocabulary trained on the files (OUT/tokenizer.model), or one given with --tokenizer",
      tokenize);
  tok->add_option("files", t->inputs, "text files, concatenated in this order")->required();
  tok->add_option("--out", t->out, "the directory to write the shards into")->required();
  tok->add_option("--val-fraction", t->val_fraction, "the last fraction of the bytes, for validation (default 0.1)");
  tok->add_option("--shard-tokens", t->shard_tokens, "tokens per shard at most (default 100000000, as llm.c)");
  tok->add_flag("--force", t->force,
                "replace an earlier tokenization in OUT: its files are removed first, so no stale shard outlives it "
                "(without --force such a folder is refused)");
  SubwordOptions& s = t->subword;
  tok->add_option("--vocab-size", s.vocab_size,
                  "train a SentencePiece vocabulary of N pieces (≥ 260) on a sample of the files; each document is "
                  "encoded after the end-of-text id </s> (1); over 65536, shards of uint32 ids (magic 20240801)");
  tok->add_option("--tokenizer", s.tokenizer,
                  "encode with this SentencePiece .model or Hugging Face byte-level BPE tokenizer.json (no training)");
  tok->add_option("--model", s.model, "the SentencePiece model type: bpe (default) or unigram");
  tok->add_flag("--byte-fallback,!--no-byte-fallback", s.byte_fallback,
                "characters outside the vocabulary as their UTF-8 bytes, never <unk> (the default; "
                "--no-byte-fallback: <unk>)");
  tok->add_option("--character-coverage", s.character_coverage,
                  "the fraction of the sample's characters the vocabulary covers (default 1.0)");
  tok->add_option("--seed", s.seed, "the trainer's random seed (default 1)");
  tok->add_option("--sample-bytes", s.sample_bytes,
                  "the trainer's sample: this many bytes from the files' beginnings, in proportion (default 1e8)");
  tok->add_option("--doc-sep", s.doc_sep,
                  "a string that separates documents inside a file (dropped; default: a file is one document)");
}

}  // namespace gt::cli
