// Reading, writing back and loading the data section, one table row per format; each bad value names its path.
#include "data/settings.h"

#include "config/choice.h"

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
namespace {

// A data file that can be read; otherwise the message says what the path is instead (missing, a directory, a
// device, unreadable), since "file not found" for a directory sends the user looking in the wrong place.
std::string existing_file(const ConfigNode& n) {
  namespace fs = std::filesystem;
  const std::string path = n.as_string();
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

// idx and npy: each split names two files, read into train_/test_images and train_/test_labels.
void parse_file_pairs(const ConfigNode& d, DataConfig& out, const std::string& first, const std::string& second) {
  d.require("train");
  for (const char* split : {"train", "test"}) {
    const ConfigNode s = d[split];
    if (!s.defined()) continue;
    s.expect_keys({first, second});
    s.require(first);
    s.require(second);
    const std::string a = existing_file(s[first]), b = existing_file(s[second]);
    (std::string(split) == "train" ? out.train_images : out.test_images) = a;
    (std::string(split) == "train" ? out.train_labels : out.test_labels) = b;
  }
  out.scale = d.get_double("scale", 1.0);
  // The readers scale in float: a scale past float's range makes every nonzero input infinite.
  if (std::fabs(out.scale) > std::numeric_limits<float>::max())
    d["scale"].fail(fmt::format("expected a number a 32-bit float holds (at most {:g} in size), got {}",
                                std::numeric_limits<float>::max(), d["scale"].as_string()));
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

void parse_idx(const ConfigNode& d, DataConfig& out) { parse_file_pairs(d, out, "images", "labels"); }
void write_idx(const DataConfig& c, YAML::Node& d) { write_file_pairs(c, d, "images", "labels"); }
void load_idx(const DataConfig& c, uint64_t, Dataset& train, Dataset& test) {
  train = read_idx(c.train_images, c.train_labels, static_cast<float>(c.scale));
  if (!c.test_images.empty()) test = read_idx(c.test_images, c.test_labels, static_cast<float>(c.scale));
}

void parse_npy(const ConfigNode& d, DataConfig& out) { parse_file_pairs(d, out, "inputs", "targets"); }
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
    s.expect_keys({"path"});
    s.require("path");
    read(std::string(split) == "train", s["path"]);
  }
}

void parse_csv(const ConfigNode& d, DataConfig& out) {
  d.require("train");
  for_each_split_path(
      d, [&](bool train, const ConfigNode& path) { (train ? out.train_csv : out.test_csv) = existing_file(path); });
  if (d.has("label")) out.csv.label = d["label"].as_string();
  out.csv.header = d.get_choice("header", "auto", {"auto", "true", "false"});
  out.csv.classes = d.get_choice("targets", "classes", {"classes", "values"}) == "classes";
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

void parse_synthetic(const ConfigNode& d, DataConfig& out) {
  d.require("samples");
  d.require("input_shape");
  d.require("targets");
  out.synthetic.samples = d["samples"].as_size(1, limits::kSamples);
  out.synthetic.test_samples = d.get_size("test_samples", 0, 0, limits::kSamples);
  out.synthetic.input_shape = d["input_shape"].as_size_list(1, limits::kExtent);
  if (out.synthetic.input_shape.empty()) d["input_shape"].fail("expected at least one dimension");
  check_elements(d["input_shape"], out.synthetic.input_shape, "input", d["samples"], out.synthetic.samples,
                 d["test_samples"], out.synthetic.test_samples);
  const ConfigNode t = d["targets"];
  t.expect_keys({"shape", "classes"});
  if (t.has("classes") == t.has("shape")) t.fail("give exactly one of `classes: K` or `shape: [..]`");
  if (t.has("classes")) {
    out.synthetic.classes = t["classes"].as_size(2, limits::kExtent);
  } else {
    out.synthetic.target_shape = t["shape"].as_size_list(1, limits::kExtent);
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
void parse_tokens(const ConfigNode& d, DataConfig& out) {
  if (!d.has("test")) d.require("train");  // test shards alone serve eval (an imported model), not training
  d.require("block_size");
  for_each_split_path(d, [&](bool train, const ConfigNode& path) {
    const std::string pattern = path.as_string();
    const std::vector<std::string> files = glob_files(pattern);
    if (files.empty()) {
      if (pattern.find_first_of("*?[") == std::string::npos) existing_file(path);  // says what the path is
      path.fail(fmt::format("no file matches {}", pattern));
    }
    for (const std::string& f : files)
      if (!std::filesystem::is_regular_file(f))
        path.fail(fmt::format("{} (matched by {}) is not a regular file", f, pattern));
    (train ? out.train_tokens : out.test_tokens) = pattern;
  });
  out.block_size = d["block_size"].as_size(1, limits::kExtent);
  out.vocab_size = d.get_size("vocab_size", 0, 2, limits::kTokenVocab);
}

void write_tokens(const DataConfig& c, YAML::Node& d) {
  d["train"]["path"] = c.train_tokens;
  if (!c.test_tokens.empty()) d["test"]["path"] = c.test_tokens;
  d["block_size"] = c.block_size;
  if (c.vocab_size > 0)
    d["vocab_size"] = c.vocab_size;
  else
    d["vocab_size"] = YAML::Node();  // null: from the data (256 for bytes, else GPT-2's 50257)
}

Dataset token_dataset(const std::string& pattern, int64_t block_size, int64_t vocab_size) {
  const std::vector<std::string> files = glob_files(pattern);
  if (files.empty()) throw DataError(fmt::format("{}: no file matches", pattern));
  Dataset ds;
  ds.tokens = std::make_shared<const TokenWindows>(files, block_size, vocab_size);
  ds.num_classes = ds.tokens->vocab_size();
  ds.source = ds.tokens->describe();
  return ds;
}

void load_tokens(const DataConfig& c, uint64_t, Dataset& train, Dataset& test) {
  if (c.train_tokens.empty()) {  // test shards only: they give the shapes too; training refuses such a config
    test = token_dataset(c.test_tokens, c.block_size, c.vocab_size);
    train = test;
    return;
  }
  train = token_dataset(c.train_tokens, c.block_size, c.vocab_size);
  // The test shards are held to the training data's vocabulary, so both agree with the model's output.
  if (!c.test_tokens.empty()) test = token_dataset(c.test_tokens, c.block_size, train.tokens->vocab_size());
}

}  // namespace

const std::vector<DataFormatSpec>& data_formats() {
  static const std::vector<DataFormatSpec> table{
      {DataFormat::idx, "idx", {"train", "test", "scale"}, parse_idx, write_idx, load_idx},
      {DataFormat::csv, "csv", {"train", "test", "label", "header", "targets"}, parse_csv, write_csv, load_csv},
      {DataFormat::npy, "npy", {"train", "test", "scale"}, parse_npy, write_npy, load_npy},
      {DataFormat::synthetic,
       "synthetic",
       {"samples", "test_samples", "input_shape", "targets"},
       parse_synthetic,
       write_synthetic,
       load_synthetic},
      {DataFormat::tokens,
       "tokens",
       {"train", "test", "block_size", "vocab_size"},
       parse_tokens,
       write_tokens,
       load_tokens},
  };
  return table;
}

const DataFormatSpec& data_format(DataFormat format) { return choice_row(data_formats(), format); }
const std::string& to_string(DataFormat format) { return data_format(format).name; }

void parse_data(const ConfigNode& d, DataConfig& out) {
  d.require("format");
  out.format = parse_choice(d["format"], data_formats());
  const DataFormatSpec& f = data_format(out.format);
  std::vector<std::string> keys{"format"};
  keys.insert(keys.end(), f.keys.begin(), f.keys.end());
  keys.insert(keys.end(), {"batch_size", "shuffle", "augment"});
  d.expect_keys(keys);
  f.parse(d, out);
  out.batch_size = d.get_size("batch_size", 64, 1, limits::kBatch);
  out.shuffle = d.get_bool("shuffle", true);
  if (d.has("augment")) {
    const ConfigNode a = d["augment"];
    a.expect_keys({"random_crop", "hflip"});
    if (a.has("random_crop")) {
      a["random_crop"].expect_keys({"padding"});
      a["random_crop"].require("padding");
      out.augment.crop_padding = a["random_crop"]["padding"].as_size(0, limits::kCropPadding);
    }
    out.augment.hflip = a.get_bool("hflip", false);
  }
}

YAML::Node to_yaml(const DataConfig& c) {
  YAML::Node d(YAML::NodeType::Map);
  d["format"] = to_string(c.format);
  data_format(c.format).write(c, d);
  d["batch_size"] = c.batch_size;
  d["shuffle"] = c.shuffle;
  if (c.augment.crop_padding >= 0) d["augment"]["random_crop"]["padding"] = c.augment.crop_padding;
  if (c.augment.hflip) d["augment"]["hflip"] = true;
  return d;
}

}  // namespace gt
