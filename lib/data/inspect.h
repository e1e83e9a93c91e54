// `gputrain data inspect`: what a loaded data set holds — classes, shapes, value range, per-channel mean and std, and
// for token data the token count, distinct tokens and id range.
#pragma once

#include "data/dataset.h"

#include <cstdint>
#include <string>
#include <vector>

namespace gt {

/// The numbers of one split, as the model sees its inputs (after data.scale).
struct DataStats {
  std::string split;  ///< "train" | "test"
  std::string source;
  int64_t samples = 0;
  std::vector<int64_t> input_shape, target_shape;  ///< of one sample
  int64_t num_classes = 0;                         ///< 0: regression targets or token data
  std::vector<int64_t> class_counts;               ///< samples per class, when there are classes
  std::vector<std::string> class_names;            ///< image folders: the class folders, in label order
  int64_t bad_files = -1;                          ///< image folders: files skipped as bad; -1 for other formats
  double min = 0, max = 0;                         ///< over every input value
  /// Mean and standard deviation (population: divided by the count, as numpy's std) per channel: the first axis of
  /// a sample of rank ≥ 2 ([C, H, W]: per colour channel), each feature of a rank-1 sample.
  std::vector<double> mean, std;
  // Token data: over every token of the shards (not only those in full windows).
  bool tokens = false;
  int64_t token_count = 0, distinct_tokens = 0, min_token = 0, max_token = 0, vocab_size = 0;
};

/// The statistics of `data` (one pass over its values, accumulated in double), named as split `split`. Token data
/// also reads every token of the shards `token_glob` names (the pattern data.train or data.test gave the loader).
DataStats inspect_dataset(const Dataset& data, const std::string& split, const std::string& token_glob = "");
/// For the console: a few lines per split.
std::string data_stats_text(const DataStats& s);
/// One JSON object per split.
std::string data_stats_json(const DataStats& s);

}  // namespace gt
