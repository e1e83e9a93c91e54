// Data sets held in host memory, the readers that make them, and the batch loader.
#pragma once

#include "config/config.h"
#include "core/tensor.h"

#include <string>
#include <vector>

namespace gt {

/// Samples and targets on the CPU. Inputs are f32 (N, sample shape). Targets are i32 class labels (N) when
/// num_classes > 0, else f32 (N, target shape) for regression.
struct Dataset {
  Tensor inputs;
  Tensor targets;
  int64_t num_classes = 0;
  std::string source;  ///< where it came from, for logs

  int64_t size() const { return inputs.defined() ? inputs.dim(0) : 0; }
  Shape input_shape() const { return inputs.shape().sample(); }
  Shape target_shape() const { return targets.shape().sample(); }
};

/// Reads an IDX image file ([N, H, W] unsigned bytes, gzip or plain) and its IDX label file ([N]); images become
/// samples of shape [1, H, W] holding pixel × scale. Errors (bad magic, truncation, count mismatch) are
/// DataErrors naming the file.
Dataset read_idx(const std::string& images_path, const std::string& labels_path, float scale);

/// Raw IDX contents: dims and bytes (for readers and tests).
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};
IdxArray read_idx_file(const std::string& path);

/// Specification of a seeded random data set (`format: synthetic`).
struct SyntheticSpec {
  int64_t samples = 0;
  int64_t test_samples = 0;
  std::vector<int64_t> input_shape;
  int64_t classes = 0;                 ///< > 0: labels are argmax of a fixed random linear map of the input
  std::vector<int64_t> target_shape;   ///< regression: targets are independent standard normals
};
/// Makes the training set (split 0) or the test set (split 1); both share the labelling rule.
Dataset make_synthetic(const SyntheticSpec& spec, uint64_t seed, int split);

/// Cuts a data set into mini-batches in a seeded order: epoch e's permutation depends only on (seed, e).
class Loader {
 public:
  Loader(const Dataset& data, int64_t batch_size, bool shuffle, uint64_t seed);

  int64_t batch_size() const { return m_batch; }
  int64_t batches_per_epoch() const { return (m_data->size() + m_batch - 1) / m_batch; }
  /// Starts epoch `epoch` (0-based), drawing its order.
  void start_epoch(int64_t epoch);
  /// Copies the next batch into x (batch_size, input shape) and y; returns the number of samples in it (the last
  /// batch of an epoch may be smaller; 0 when the epoch is over). x and y must hold batch_size samples.
  int64_t next(Tensor& x, Tensor& y);

 private:
  const Dataset* m_data;
  int64_t m_batch;
  bool m_shuffle;
  uint64_t m_seed;
  std::vector<int64_t> m_order;
  int64_t m_pos = 0;
};

}  // namespace gt
