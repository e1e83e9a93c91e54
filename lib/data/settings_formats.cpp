// The data formats that read tensors from files or make them (idx, csv, npy, synthetic, tokens): each one's keys,
// parser, YAML writer and loader, and its row of data_formats(); each bad value names its path.
#include "data/settings_rows.h"

#include "config/schema.h"
#include "data/batch_stager.h"
#include "data/images.h"
#include "text/load.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <utility>

namespace gt {
using namespace data_rows;

namespace {

// A data file that can be read; otherwise the message says what the path is instead (missing, a directory, a
// device, unreadable), since "file not found" for a directory sends the user looking in the wrong place.
std::string existing_file(const ConfigNode& n, bool check = true) {
  namespace fs = std::filesystem;
  const std::string path = n.as_string();
  if (!check) return path;  // a command that reads no data file (generate, check of token data)
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    n.fail(fmt::format("file not found: {}{}", path,
                       path.rfind("/usr/share/datasets/", 0) == 0 ? " (scripts/setup.sh installs the data sets)" : ""));
  }
  if (fs::is_directory(st)) n.fail(fmt::format("{} is a directory, not a data file", path));
  if (!fs::is_regular_file(st)) n.fail(fmt::format("{} is not a regular file (a device, FIFO or socket)", path));
  if (::access(path.c_str(), R_OK) != 0) n.fail(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  return path;
}

// The maps data.train and data.test: two files each (idx, npy) or one path (csv, tokens).
SectionSpec split_section(const std::string& first, const std::string& second, const std::string& doc) {
  return plain_section({{.name = first, .kind = KeyKind::string, .required = true, .doc = "a file"},
                        {.name = second, .kind = KeyKind::string, .required = true, .doc = "a file"}},
                       doc);
}
const SectionSpec& idx_split() {
  static const SectionSpec s = split_section("images", "labels", "MNIST-family idx files, gzip or plain");
  return s;
}
const SectionSpec& npy_split() {
  static const SectionSpec s = split_section("inputs", "targets", "NumPy .npy arrays");
  return s;
}
const SectionSpec& path_split() {
  static const SectionSpec s = plain_section({{.name = "path",
                                               .kind = KeyKind::string,
                                               .required = true,
                                               .doc = "the file (csv), or a glob of llm.c token shards (tokens)"}});
  return s;
}

// train (required unless said otherwise) and test of one of the split sections above.
std::vector<KeySpec> split_keys(const SectionSpec& split, bool train_required = true) {
  return {
      {.name = "train", .kind = KeyKind::map, .required = train_required, .section = &split, .doc = "the training set"},
      {.name = "test",
       .kind = KeyKind::map,
       .nullable = true,
       .section = &split,
       .doc = "the test set (optional; null: none, as --set data.test=null drops a config's)"}};
}

// data.normalize: one mean and one std per channel, applied after scale.
const SectionSpec& normalize_section() {
  static const SectionSpec s = plain_section(
      {{.name = "mean",
        .kind = KeyKind::list,
        .required = true,
        .min_items = 1,
        .items = {{.name = "value", .kind = KeyKind::number}},
        .doc = "subtracted from channel c (after scale)"},
       {.name = "std",
        .kind = KeyKind::list,
        .required = true,
        .min_items = 1,
        .items = {{.name = "value", .kind = KeyKind::number, .min = 0, .min_exclusive = true}},
        .doc = "channel c is then divided by it (> 0)"}},
      "x = (x·scale − mean[c]) / std[c], once at load time; one value per channel (`gputrain data inspect` prints "
      "them)");
  return s;
}

std::vector<double> read_numbers(const ConfigNode& n, bool positive) {
  if (!n.is_sequence() || n.size() == 0) n.fail("expected a list of numbers, one per channel");
  std::vector<double> out;
  const double big = std::numeric_limits<float>::max();
  for (size_t i = 0; i < n.size(); ++i) out.push_back(n.at(i).as_double(positive ? 0 : -big, big, !positive));
  return out;
}

}  // namespace

namespace data_rows {

const KeySpec kScaleKey{.name = "scale",
                        .kind = KeyKind::number,
                        .fallback = "1",
                        .doc = "inputs are multiplied by it (1/255 = 0.00392156862745098); a 32-bit float",
                        .extra_json = R"("minimum": -3.4028234663852886e38, "maximum": 3.4028234663852886e38)"};

void read_scale(const ConfigNode& d, DataConfig& out) {
  out.scale = get_double(d, kScaleKey);
  // The readers scale in float: a scale past float's range makes every nonzero input infinite.
  if (std::fabs(out.scale) > std::numeric_limits<float>::max())
    d["scale"].fail(fmt::format("expected a number a 32-bit float holds (at most {:g} in size), got {}",
                                std::numeric_limits<float>::max(), d["scale"].as_string()));
}

const KeySpec kNormalize{.name = "normalize", .kind = KeyKind::map, .section = &normalize_section()};

// Reads data.normalize when present; `channels` > 0: the count the values must have (known from the config).
void parse_normalize(const ConfigNode& d, DataConfig& out, int64_t channels) {
  if (!d.has("normalize")) return;
  const ConfigNode n = d["normalize"];
  expect_keys(n, section_keys(normalize_section()));
  n.require("mean");
  n.require("std");
  out.normalize.mean = read_numbers(n["mean"], false);
  out.normalize.std = read_numbers(n["std"], true);
  if (out.normalize.std.size() != out.normalize.mean.size())
    n["std"].fail(fmt::format("{} values but mean has {}: give one of each per channel", out.normalize.std.size(),
                              out.normalize.mean.size()));
  if (channels > 0 && static_cast<int64_t>(out.normalize.mean.size()) != channels)
    n["mean"].fail(fmt::format("{} values but the samples have {} channel{} (one value per channel)",
                               out.normalize.mean.size(), channels, channels == 1 ? "" : "s"));
  out.normalize.where = fmt::format("{} {}", n["mean"].path(), n["mean"].where());
}

void write_normalize(const DataConfig& c, YAML::Node& d) {
  if (!c.normalize.any()) return;
  d["normalize"]["mean"] = c.normalize.mean;
  d["normalize"]["mean"].SetStyle(YAML::EmitterStyle::Flow);
  d["normalize"]["std"] = c.normalize.std;
  d["normalize"]["std"].SetStyle(YAML::EmitterStyle::Flow);
}

}  // namespace data_rows

namespace {

// idx and npy: each split names two files, read into train_/test_images and train_/test_labels.
void parse_file_pairs(const ConfigNode& d, DataConfig& out, const SectionSpec& split) {
  const std::vector<KeySpec>& keys = section_keys(split);
  const std::string &first = keys.at(0).name, &second = keys.at(1).name;
  d.require("train");
  for (const char* split_name : {"train", "test"}) {
    const ConfigNode s = d[split_name];
    if (!s.defined()) continue;
    expect_keys(s, keys);
    s.require(first);
    s.require(second);
    const std::string a = existing_file(s[first], out.check_files), b = existing_file(s[second], out.check_files);
    (std::string(split_name) == "train" ? out.train_images : out.test_images) = a;
    (std::string(split_name) == "train" ? out.train_labels : out.test_labels) = b;
  }
  read_scale(d, out);
}

void write_file_pairs(const DataConfig& c, YAML::Node& d, const std::string& first, const std::string& second) {
  d["train"][first] = c.train_images;
  d["train"][second] = c.train_labels;
  if (!c.test_images.empty()) {
    d["test"][first] = c.test_images;
    d["test"][second] = c.test_labels;
  }
  d["scale"] = c.scale;
}

void parse_idx(const ConfigNode& d, DataConfig& out) {
  parse_file_pairs(d, out, idx_split());
  parse_normalize(d, out, 0);  // the channels are the file's: checked when it is read
}
void write_idx(const DataConfig& c, YAML::Node& d) {
  write_file_pairs(c, d, "images", "labels");
  write_normalize(c, d);
}
void load_idx(const DataConfig& c, uint64_t, Dataset& train, Dataset& test) {
  train = read_idx(c.train_images, c.train_labels, static_cast<float>(c.scale));
  if (!c.test_images.empty()) test = read_idx(c.test_images, c.test_labels, static_cast<float>(c.scale));
  normalize_inputs(train, c.normalize);
  normalize_inputs(test, c.normalize);
}

void parse_npy(const ConfigNode& d, DataConfig& out) { parse_file_pairs(d, out, npy_split()); }
void write_npy(const DataConfig& c, YAML::Node& d) { write_file_pairs(c, d, "inputs", "targets"); }
void load_npy(const DataConfig& c, uint64_t, Dataset& train, Dataset& test) {
  train = read_npy_pair(c.train_images, c.train_labels, static_cast<float>(c.scale));
  if (!c.test_images.empty()) test = read_npy_pair(c.test_images, c.test_labels, static_cast<float>(c.scale));
}

// Calls read(train, path) with the `path` of each split the section names (train: and test:, maps of that key alone).
void for_each_split_path(const ConfigNode& d, const std::function<void(bool train, const ConfigNode& path)>& read) {
  for (const char* split : {"train", "test"}) {
    const ConfigNode s = d[split];
    if (!s.defined()) continue;
    expect_keys(s, section_keys(path_split()));
    s.require("path");
    read(std::string(split) == "train", s["path"]);
  }
}

void parse_csv(const ConfigNode& d, DataConfig& out) {
  d.require("train");
  for_each_split_path(d, [&](bool train, const ConfigNode& path) {
    (train ? out.train_csv : out.test_csv) = existing_file(path, out.check_files);
  });
  if (d.has("label")) out.csv.label = d["label"].as_string();
  const std::vector<KeySpec>& keys = data_format(DataFormat::csv).keys;
  const KeySpec &header = key_spec(keys, "header"), &targets = key_spec(keys, "targets");
  out.csv.header = d.get_choice(header.name, header.fallback, header.choices);
  out.csv.classes = d.get_choice(targets.name, targets.fallback, targets.choices) == "classes";
}

void write_csv(const DataConfig& c, YAML::Node& d) {
  d["train"]["path"] = c.train_csv;
  if (!c.test_csv.empty()) d["test"]["path"] = c.test_csv;
  if (!c.csv.label.empty()) d["label"] = c.csv.label;
  d["header"] = c.csv.header;
  d["targets"] = c.csv.classes ? "classes" : "values";
}

void load_csv(const DataConfig& c, uint64_t, Dataset& train, Dataset& test) {
  train = read_csv(c.train_csv, c.csv);
  if (!c.test_csv.empty()) test = read_csv(c.test_csv, c.csv);
}

// A synthetic set is held in memory as [samples, shape...]: both the sample and the whole set must fit in one
// tensor (core/limits.h), so nothing multiplies past 64 bits when it is made.
void check_elements(const ConfigNode& shape_node, const std::vector<int64_t>& shape, const char* what,
                    const ConfigNode& samples_node, int64_t samples, const ConfigNode& test_node,
                    int64_t test_samples) {
  const std::optional<int64_t> numel = Shape(shape).checked_numel();
  if (!numel || *numel > limits::kElements.max)
    shape_node.fail(fmt::format("one sample's {} of shape {} has more than {} elements ({})", what, Shape(shape).str(),
                                limits::kElements.max, limits::kElements.what));
  for (const auto& [node, n] : {std::pair{samples_node, samples}, std::pair{test_node, test_samples}}) {
    const std::optional<int64_t> total = checked_mul(n, *numel);
    if (!total || *total > limits::kElements.max)
      node.fail(fmt::format("{} samples of {} {} elements each are more than {} elements in memory ({})", n, what,
                            *numel, limits::kElements.max, limits::kElements.what));
  }
}

// A shape: 1 to limits::kRank sizes of at least 1.
KeySpec shape_key(const char* name, bool required, const char* doc) {
  return {.name = name,
          .kind = KeyKind::list,
          .required = required,
          .min_items = 1,
          .max_items = limits::kRank.max,
          .items = {{.name = "extent", .kind = KeyKind::size, .min = 1, .limit = &limits::kExtent}},
          .doc = doc};
}

const SectionSpec& synthetic_targets() {
  static const SectionSpec s = plain_section(
      {shape_key("shape", false, "standard-normal regression targets of this per-sample shape"),
       {.name = "classes",
        .kind = KeyKind::size,
        .min = 2,
        .limit = &limits::kExtent,
        .doc = "labels: the argmax of a fixed random linear map of the input"}},
      "exactly one of classes: K or shape: [..]", R"("oneOf": [{"required": ["classes"]}, {"required": ["shape"]}])");
  return s;
}

std::vector<int64_t> read_shape(const ConfigNode& n, const KeySpec& key) {
  const KeySpec& item = key.items.at(0);
  return n.as_size_list(static_cast<int64_t>(item.min), *item.limit);
}

void parse_synthetic(const ConfigNode& d, DataConfig& out) {
  const std::vector<KeySpec>& keys = data_format(DataFormat::synthetic).keys;
  d.require("samples");
  d.require("input_shape");
  d.require("targets");
  out.synthetic.samples = read_size(d["samples"], key_spec(keys, "samples"));
  out.synthetic.test_samples = get_size(d, key_spec(keys, "test_samples"));
  out.synthetic.input_shape = read_shape(d["input_shape"], key_spec(keys, "input_shape"));
  if (out.synthetic.input_shape.empty()) d["input_shape"].fail("expected at least one dimension");
  check_elements(d["input_shape"], out.synthetic.input_shape, "input", d["samples"], out.synthetic.samples,
                 d["test_samples"], out.synthetic.test_samples);
  const ConfigNode t = d["targets"];
  const std::vector<KeySpec>& tk = section_keys(synthetic_targets());
  expect_keys(t, tk);
  if (t.has("classes") == t.has("shape")) t.fail("give exactly one of `classes: K` or `shape: [..]`");
  if (t.has("classes")) {
    out.synthetic.classes = read_size(t["classes"], key_spec(tk, "classes"));
  } else {
    out.synthetic.target_shape = read_shape(t["shape"], key_spec(tk, "shape"));
    if (out.synthetic.target_shape.empty()) t["shape"].fail("expected at least one dimension");
    check_elements(t["shape"], out.synthetic.target_shape, "target", d["samples"], out.synthetic.samples,
                   d["test_samples"], out.synthetic.test_samples);
  }
}

void write_synthetic(const DataConfig& c, YAML::Node& d) {
  d["samples"] = c.synthetic.samples;
  d["test_samples"] = c.synthetic.test_samples;
  d["input_shape"] = c.synthetic.input_shape;
  d["input_shape"].SetStyle(YAML::EmitterStyle::Flow);
  if (c.synthetic.classes > 0) {
    d["targets"]["classes"] = c.synthetic.classes;
  } else {
    d["targets"]["shape"] = c.synthetic.target_shape;
    d["targets"]["shape"].SetStyle(YAML::EmitterStyle::Flow);
  }
}

void load_synthetic(const DataConfig& c, uint64_t seed, Dataset& train, Dataset& test) {
  train = make_synthetic(c.synthetic, seed, 0);
  if (c.synthetic.test_samples > 0) test = make_synthetic(c.synthetic, seed, 1);
}

// tokens: llm.c shards named by globs; the pattern is kept (what the resolved config writes) and must match a file.
// data.tokenizer, or the tokenizer file beside the shards (the folder of the training shards, else the test
// shards'): read whole, so that a bad file is a config error naming the key (or the path it was found beside).
void parse_tokenizer(const ConfigNode& d, DataConfig& out) {
  const ConfigNode given = d["tokenizer"];
  ConfigNode where = given;
  if (given.defined()) {
    out.tokenizer = existing_file(given, out.check_files);
    out.tokenizer_given = true;
  } else {
    const std::string pattern = !out.train_tokens.empty() ? out.train_tokens : out.test_tokens;
    const std::vector<std::string> files = out.check_files ? glob_files(pattern) : std::vector<std::string>{};
    const std::string dir = std::filesystem::path(files.empty() ? pattern : files.front()).parent_path().string();
    out.tokenizer = tokenizer_file_in(dir.empty() ? "." : dir);
    where = d[!out.train_tokens.empty() ? "train" : "test"]["path"];
  }
  if (out.tokenizer.empty() || !out.check_files) return;
  // An explicit data.vocab_size below the tokenizer's is a promise that the ids stay below it: every token is
  // checked against it when the shards load.
  try {
    load_tokenizer(out.tokenizer);
  } catch (const ConfigError& e) {
    where.fail(given.defined() ? e.what() : fmt::format("the tokenizer beside the shards: {}", e.what()));
  }
}

void parse_tokens(const ConfigNode& d, DataConfig& out) {
  if (!d.has("test")) d.require("train");  // test shards alone serve eval (an imported model), not training
  d.require("block_size");
  for_each_split_path(d, [&](bool train, const ConfigNode& path) {
    const std::string pattern = path.as_string();
    const std::vector<std::string> files = out.check_files ? glob_files(pattern) : std::vector<std::string>{""};
    if (files.empty()) {
      if (pattern.find_first_of("*?[") == std::string::npos) existing_file(path);  // says what the path is
      path.fail(fmt::format("no file matches {}", pattern));
    }
    for (const std::string& f : files)
      if (out.check_files && !std::filesystem::is_regular_file(f))
        path.fail(fmt::format("{} (matched by {}) is not a regular file", f, pattern));
    (train ? out.train_tokens : out.test_tokens) = pattern;
  });
  const std::vector<KeySpec>& keys = data_format(DataFormat::tokens).keys;
  out.block_size = read_size(d["block_size"], key_spec(keys, "block_size"));
  const ConfigNode vocab = d["vocab_size"];  // null: from the tokenizer, else from the data
  out.vocab_size = vocab.defined() ? read_size(vocab, key_spec(keys, "vocab_size")) : 0;
  parse_tokenizer(d, out);
}

void write_tokens(const DataConfig& c, YAML::Node& d) {
  d["train"]["path"] = c.train_tokens;
  if (!c.test_tokens.empty()) d["test"]["path"] = c.test_tokens;
  d["block_size"] = c.block_size;
  if (c.vocab_size > 0)
    d["vocab_size"] = c.vocab_size;
  else
    d["vocab_size"] = YAML::Node();  // null: from the data (256 for bytes, else GPT-2's 50257)
  if (c.tokenizer_given) d["tokenizer"] = c.tokenizer;
}

Dataset token_dataset(const std::string& pattern, int64_t block_size, int64_t vocab_size,
                      const std::string& tokenizer) {
  const std::vector<std::string> files = glob_files(pattern);
  if (files.empty()) throw DataError(fmt::format("{}: no file matches", pattern));
  Dataset ds;
  if (!tokenizer.empty()) {
    ds.tokenizer = load_tokenizer(tokenizer);
    ds.tokenizer_path = tokenizer;
    if (vocab_size == 0) vocab_size = ds.tokenizer->vocab_size();  // the tokenizer's, not a guess from the ids
  }
  ds.tokens = std::make_shared<const TokenWindows>(files, block_size, vocab_size);
  ds.num_classes = ds.tokens->vocab_size();
  ds.source = ds.tokens->describe();
  return ds;
}

void load_tokens(const DataConfig& c, uint64_t, Dataset& train, Dataset& test) {
  if (c.train_tokens.empty()) {  // test shards only: they give the shapes too; training refuses such a config
    test = token_dataset(c.test_tokens, c.block_size, c.vocab_size, c.tokenizer);
    train = test;
    return;
  }
  train = token_dataset(c.train_tokens, c.block_size, c.vocab_size, c.tokenizer);
  // The test shards are held to the training data's vocabulary, so both agree with the model's output.
  if (!c.test_tokens.empty())
    test = token_dataset(c.test_tokens, c.block_size, train.tokens->vocab_size(), c.tokenizer);
}

}  // namespace

std::vector<DataFormatSpec> data_rows::tensor_format_rows() {
  return {
      {DataFormat::idx, "idx", concat_keys({split_keys(idx_split()), {kScaleKey, kNormalize}}), parse_idx, write_idx,
       load_idx},
      {DataFormat::csv, "csv",
       concat_keys({split_keys(path_split()),
                    {{.name = "label",
                      .kind = KeyKind::any_of,
                      .items = {{.name = "name", .kind = KeyKind::string}, {.name = "index", .kind = KeyKind::integer}},
                      .doc = "the label column by name or index (negative from the end; default the last column)"},
                     {.name = "header",
                      .kind = KeyKind::choice,
                      .choices = {"auto", "true", "false"},
                      .fallback = "auto",
                      .doc = "auto: a first row that is not all numbers is a header"},
                     {.name = "targets",
                      .kind = KeyKind::choice,
                      .choices = {"classes", "values"},
                      .fallback = "classes",
                      .doc = "classes: non-negative integer labels; values: regression targets"}}}),
       parse_csv, write_csv, load_csv},
      {DataFormat::npy, "npy", concat_keys({split_keys(npy_split()), {kScaleKey}}), parse_npy, write_npy, load_npy},
      {DataFormat::synthetic,
       "synthetic",
       {{.name = "samples",
         .kind = KeyKind::size,
         .required = true,
         .min = 1,
         .limit = &limits::kSamples,
         .doc = "size of the seeded random training set"},
        {.name = "test_samples",
         .kind = KeyKind::size,
         .min = 0,
         .limit = &limits::kSamples,
         .fallback = "0",
         .doc = "size of the seeded random test set"},
        shape_key("input_shape", true, "per-sample input shape, standard-normal values"),
        {.name = "targets", .kind = KeyKind::map, .required = true, .section = &synthetic_targets()}},
       parse_synthetic,
       write_synthetic,
       load_synthetic},
      {DataFormat::tokens, "tokens",
       concat_keys({split_keys(path_split(), false),
                    {{.name = "block_size",
                      .kind = KeyKind::size,
                      .required = true,
                      .min = 1,
                      .limit = &limits::kExtent,
                      .doc = "T, the positions of a window's input"},
                     {.name = "vocab_size",
                      .kind = KeyKind::size,
                      .nullable = true,
                      .min = 2,
                      .limit = &limits::kTokenVocab,
                      .fallback = "null",
                      .doc = "every token is below it; null: the tokenizer's vocabulary, else 256 for byte data, "
                             "else GPT-2's 50257"},
                     {.name = "tokenizer",
                      .kind = KeyKind::string,
                      .doc = "the tokenizer of the ids (a SentencePiece .model or gputrain_tokenizer.json); default: "
                             "the one gputrain tokenize wrote beside the shards, if any"}}}),
       parse_tokens, write_tokens, load_tokens, R"("anyOf": [{"required": ["train"]}, {"required": ["test"]}])"},
  };
}

}  // namespace gt
