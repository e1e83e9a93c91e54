// The `data:` section: its settings, and one table row per data.format with the keys it reads, its parser, its
// YAML writer and its loader.
#pragma once

#include "config/config.h"
#include "config/schema.h"
#include "data/dataset.h"
#include "data/images.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gt {

enum class DataFormat { idx, csv, npy, synthetic, tokens, images };
const std::string& to_string(DataFormat format);

/// A setting of auto | true | false (data.pin_memory, data.device_resident).
enum class AutoSwitch { automatic, on, off };
const std::string& to_string(AutoSwitch value);

struct DataConfig {
  /// Whether parsing checks that the data files exist (the default): off for commands that read none (generate),
  /// which then fail, naming the key, only if they do read one.
  bool check_files = true;
  DataFormat format = DataFormat::idx;
  std::string train_images, train_labels, test_images, test_labels;  ///< idx; npy inputs and targets
  std::string train_csv, test_csv;                                   ///< csv
  CsvSpec csv;
  double scale = 1.0;
  SyntheticSpec synthetic;
  std::string train_tokens, test_tokens;  ///< tokens: globs of llm.c shards
  int64_t block_size = 0;                 ///< tokens: T, the positions of one window's input
  int64_t vocab_size = 0;                 ///< tokens: 0 = the default (data/tokens.h)
  std::string tokenizer;                  ///< tokens: the tokenizer file (data.tokenizer, or found beside the shards)
  bool tokenizer_given = false;           ///< tokens: data.tokenizer was in the config (else found, or none)
  std::string train_dir, test_dir;        ///< images: DIR/<class>/<file>.png|.jpg|.jpeg
  ImageSpec image;                        ///< images: data.image
  bool bad_file_error = false;            ///< images: data.on_bad_file: error
  std::string cache;                      ///< images: data.cache ("" none)
  NormalizeSpec normalize;                ///< idx and images: data.normalize
  int64_t batch_size = 64;
  bool shuffle = true;
  AugmentConfig augment;   ///< training set only
  bool tta_hflip = false;  ///< data.tta.hflip: evaluations average the logits of each image and its mirror
  int64_t workers = 0;     ///< loader threads for the training set (0: the trainer's thread)
  int64_t prefetch = 2;    ///< with workers: batches prepared ahead
  AutoSwitch pin_memory = AutoSwitch::automatic;       ///< page-locked staging on a GPU (auto: on)
  AutoSwitch device_resident = AutoSwitch::automatic;  ///< the training set held and gathered on the device
};

/// What one data.format reads and makes.
struct DataFormatSpec {
  DataFormat value;
  std::string name;           ///< as data.format writes it
  std::vector<KeySpec> keys;  ///< the section's keys of this format besides format, batch_size, shuffle, augment
  /// Reads the format's own keys (the section's keys are checked already).
  void (*parse)(const ConfigNode& d, DataConfig& out);
  /// Writes the format's own keys into the section's resolved YAML.
  void (*write)(const DataConfig& c, YAML::Node& d);
  /// Reads or makes the training set and, when the config names one, the test set (left empty otherwise).
  void (*load)(const DataConfig& c, uint64_t seed, Dataset& train, Dataset& test);
  /// What the format requires beyond single keys, as JSON Schema members ("train or test").
  std::string extra_json = "";
};
/// The table: one row per format.
const std::vector<DataFormatSpec>& data_formats();
/// The row of `format`.
const DataFormatSpec& data_format(DataFormat format);

/// The keys of each data.format, their bounds and defaults (parse_data reads by them).
const SectionSpec& data_section();
/// Reads the `data:` section; throws ConfigError naming the key (a data file that does not exist, too).
void parse_data(const ConfigNode& d, DataConfig& out);
/// The section after defaults, as config.resolved.yaml writes it.
YAML::Node to_yaml(const DataConfig& c);

}  // namespace gt
