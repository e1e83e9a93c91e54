// gputrain data inspect and gputrain tokenize: the data a config names, and text made into token shards.
#include "cli.h"

#include "core/json.h"
#include "data/inspect.h"
#include "data/tokens.h"
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
};

int tokenize(const TokenizeArgs& a) {
  const TokenizeResult r = tokenize_bytes(a.inputs, a.out, a.val_fraction, a.shard_tokens, a.force);
  if (!r.replaced.empty())
    fmt::print("{}: replaced the earlier tokenization ({} files removed)\n", a.out, r.replaced.size());
  fmt::print("{}: {} training and {} validation tokens (bytes) in {} shard(s), and tokenizer.json\n", a.out,
             r.train_tokens, r.val_tokens, r.files.size());
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
      "byte-level tokens (vocabulary 256) of text files as llm.c token shards: "
      "OUT/train_000000.bin …, OUT/val_000000.bin … and OUT/tokenizer.json, for data.format: "
      "tokens",
      tokenize);
  tok->add_option("files", t->inputs, "text files, concatenated in this order")->required();
  tok->add_option("--out", t->out, "the directory to write the shards into")->required();
  tok->add_option("--val-fraction", t->val_fraction, "the last fraction of the bytes, for validation (default 0.1)");
  tok->add_option("--shard-tokens", t->shard_tokens, "tokens per shard at most (default 100000000, as llm.c)");
  tok->add_flag("--force", t->force,
                "replace an earlier tokenization in OUT: its shards and tokenizer.json are removed first, so no "
                "stale shard outlives it (without --force such a folder is refused)");
}

}  // namespace gt::cli
