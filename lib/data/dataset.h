// Data sets held in host memory, the readers that make them, and the batch loader.
#pragma once

#include "config/config.h"
#include "core/tensor.h"
#include "data/tokens.h"
#include "text/tokenizer.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gt {

/// Inputs that stay in a read-only memory-mapped NPY file (uint8 or float32, little-endian, C order): the loader
/// converts the rows of a batch (value × scale) as it gathers them, so a data set larger than memory trains. The
/// reader checks every value finite once through the map (its pages stay evictable); the loader checks again per row.
struct MappedInputs {
  std::shared_ptr<Storage> map;   ///< the mapping (unmapped when the last holder goes)
  const uint8_t* data = nullptr;  ///< the first element
  bool bytes = false;             ///< uint8 elements, else float32
  float scale = 1.0f;
  Shape shape;  ///< [N, sample shape...]
  std::string path;
  int64_t row_numel() const { return shape.numel() / shape[0]; }
  /// Sample i's values × scale into out (row_numel floats); a value that is not finite is a DataError naming the
  /// file, the sample and the element.
  void row(int64_t i, float* out) const;
};

/// Samples and targets on the CPU. Inputs are f32 (N, sample shape). Targets are i32 class labels (N) when
/// num_classes > 0, else f32 (N, target shape) for regression. Token data (`tokens` set) holds no tensors: its
/// samples are windows read from the shards on demand, inputs f32 [T] (token ids) and targets i32 [T].
struct Dataset {
  Tensor inputs;
  Tensor targets;
  int64_t num_classes = 0;
  std::string source;         ///< where it came from, for logs
  std::string labels_source;  ///< the file the class labels came from ("" when made, not read), for messages
  std::shared_ptr<const TokenWindows> tokens;
  /// Token data: the tokenizer of its ids (data.tokenizer, or the one beside the shards), when there is one; eval's
  /// bits per byte count the bytes of its tokens, and generate prints text with it.
  std::shared_ptr<const Tokenizer> tokenizer;
  std::string tokenizer_path;
  /// Inputs read from a mapped NPY file as the loader needs them. `inputs` then views the mapped values when they
  /// need no conversion (float32, scale 1, the data 64-byte aligned in the file), and is empty otherwise.
  std::shared_ptr<const MappedInputs> mapped;

  // Image folders (data/images.h); empty and 0 for other formats.
  std::vector<std::string> class_names;  ///< class i's folder name
  int64_t bad_files = 0;                 ///< files skipped as corrupt or unreadable

  int64_t size() const {
    return tokens ? tokens->windows() : mapped ? mapped->shape[0] : inputs.defined() ? inputs.dim(0) : 0;
  }
  Shape input_shape() const {
    return tokens ? Shape{tokens->block_size()} : mapped ? mapped->shape.sample() : inputs.shape().sample();
  }
  Shape target_shape() const { return tokens ? Shape{tokens->block_size()} : targets.shape().sample(); }
  DType target_dtype() const { return tokens ? DType::i32 : targets.dtype(); }
  /// Byte tokens (a vocabulary of 256): evaluations report bits per byte besides the loss.
  bool byte_tokens() const { return tokens && tokens->vocab_size() == 256; }
  /// Token data whose tokens' bytes are known: a tokenizer, or bytes; evaluations then report bits per byte.
  bool bytes_known() const { return tokens && (tokenizer || (byte_tokens() && tokenizer_path.empty())); }
};

/// Refuses a value that is NaN or infinite (after scaling by `scale`, which the message names when it is not 1) with
/// a DataError naming the file, the sample and the element: every reader checks its inputs and numeric targets.
void check_finite(const Tensor& values, const std::string& path, float scale);

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

/// How to read a CSV file: numeric columns, one of them the label.
struct CsvSpec {
  std::string label;            ///< column name or index (negative from the end); "" = the last column
  std::string header = "auto";  ///< auto (a first row that is not all numbers is a header) | true | false
  bool classes = true;          ///< labels are class indices; false: regression values
};
/// Reads a CSV file into [N, features] inputs and its label column. Errors name the file and line.
Dataset read_csv(const std::string& path, const CsvSpec& spec);

/// A raw NPY array (C order; float32, float64, uint8, int32 or int64, little-endian).
struct NpyArray {
  std::string descr;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
  double at(size_t i) const;  ///< element i as a double
};
NpyArray read_npy(const std::string& path);
/// Inputs [N, ...] (× scale) and targets. Float32 and uint8 inputs in a regular file are memory-mapped
/// (Dataset::mapped), not read; other types are read and converted at once. Targets: integers of shape [N] are class
/// labels, floats are regression targets.
Dataset read_npy_pair(const std::string& inputs_path, const std::string& targets_path, float scale);

/// Specification of a seeded random data set (`format: synthetic`).
struct SyntheticSpec {
  int64_t samples = 0;
  int64_t test_samples = 0;
  std::vector<int64_t> input_shape;
  int64_t classes = 0;                ///< > 0: labels are argmax of a fixed random linear map of the input
  std::vector<int64_t> target_shape;  ///< regression: targets are independent standard normals
};
/// Makes the training set (split 0) or the test set (split 1); both share the labelling rule.
Dataset make_synthetic(const SyntheticSpec& spec, uint64_t seed, int split);

/// Random training-time transforms of [C, H, W] images (`data.augment`).
struct AugmentConfig {
  int64_t crop_padding = -1;  ///< random_crop: shift by up to ±padding pixels, zero-filled; -1 = off
  bool hflip = false;         ///< mirror left-right with probability 1/2
  bool mirror = false;        ///< mirror every image left-right (the second pass of data.tta.hflip), no draw
  bool any() const { return crop_padding >= 0 || hflip || mirror; }
};

/// Cuts a data set into mini-batches in a seeded order: epoch e's permutation depends only on (seed, e), and so do
/// the augmentations drawn for each position of the epoch.
class Loader {
 public:
  Loader(const Dataset& data, int64_t batch_size, bool shuffle, uint64_t seed, AugmentConfig augment = {});

  int64_t batch_size() const { return m_batch; }
  /// Batches this rank takes per epoch. One rank: the last may be partial. Several: every rank takes the same
  /// number of full batches and the remainder of the epoch's order (fewer than ranks × batch samples) is dropped,
  /// so no rank waits in a collective that the others never reach.
  int64_t batches_per_epoch() const {
    return m_world == 1 ? (m_size + m_batch - 1) / m_batch : m_size / (m_batch * m_world);
  }
  /// Data-parallel: global batch k of the epoch's order is samples [k·B·world, (k+1)·B·world), and rank r takes
  /// its r-th B of them: ranks × batch B see what one process with batch B·world sees.
  void shard(int rank, int world) {
    m_rank = rank;
    m_world = world;
  }
  /// Starts epoch `epoch` (0-based), drawing its order; `position` skips that many samples of it (resuming; with
  /// several ranks, samples of the global order).
  void start_epoch(int64_t epoch, int64_t position = 0);
  /// Copies the next batch into x (batch_size, input shape) and y; returns the number of samples in it (the last
  /// batch of an epoch may be smaller; 0 when the epoch is over). x and y must hold batch_size samples.
  int64_t next(Tensor& x, Tensor& y) {
    const int64_t n = fill(*m_order, m_epoch, m_pos, x, y);
    advance(n);
    return n;
  }
  /// Passes over the next batch without copying it (another rank's share of an evaluation).
  void skip() { m_pos += stride(); }
  /// Takes only the first `samples` of the data set's order (an evaluation limited by train.eval_tokens).
  void limit(int64_t samples) { m_size = std::clamp<int64_t>(samples, 0, m_data->size()); }
  int64_t size() const { return m_size; }

  // The pieces of next() for loader threads (data/prefetcher.h), which prepare batches ahead of the trainer.

  /// Epoch `epoch`'s order of the samples: a function of (seed, epoch) alone.
  std::shared_ptr<const std::vector<int64_t>> order_of(int64_t epoch) const;
  /// Fills x and y with the batch of epoch `epoch` (whose order is `order`) that starts at `position` of the global
  /// order (this rank's share of it); returns its samples, 0 past the epoch's end. The result depends only on the
  /// arguments: it changes nothing in the loader and keeps its scratch per call, so threads may call it at once.
  /// It runs no OpenMP region (loader threads work beside the step's team).
  int64_t fill(const std::vector<int64_t>& order, int64_t epoch, int64_t position, Tensor& x, Tensor& y) const;
  /// The batch at `position` of the global order: where this rank's share of it starts in the order, and its
  /// samples (0 past the epoch's end); fill() copies exactly these.
  std::pair<int64_t, int64_t> span(int64_t position) const {
    if (m_world > 1 && position + m_batch * m_world > m_size) return {0, 0};  // the dropped remainder
    const int64_t start = position + m_rank * m_batch;
    return {start, std::max<int64_t>(0, std::min(m_batch, m_size - start))};
  }
  /// Where the batch after the one at `position` starts (one rank: the end of a partial batch is the epoch's end).
  int64_t stride() const { return m_world == 1 ? m_batch : m_batch * m_world; }
  /// Whether fill() finds a batch at `position` (false: the epoch is over).
  bool has_batch(int64_t position) const {
    return m_world == 1 ? position < m_size : position + m_batch * m_world <= m_size;
  }
  /// The current epoch, its order, and where its next batch starts.
  int64_t epoch() const { return m_epoch; }
  const std::shared_ptr<const std::vector<int64_t>>& order() const { return m_order; }
  int64_t position() const { return m_pos; }
  /// Moves past a batch of n samples that fill() returned (n > 0).
  void advance(int64_t n) {
    if (n > 0) m_pos += m_world == 1 ? n : stride();
  }

 private:
  void augment(float* sample, int64_t epoch, int64_t position, std::vector<float>& scratch) const;

  const Dataset* m_data;
  int64_t m_batch;
  bool m_shuffle;
  uint64_t m_seed;
  AugmentConfig m_augment;
  std::shared_ptr<const std::vector<int64_t>> m_order;
  int64_t m_pos = 0, m_epoch = 0;  ///< m_pos: where the next global batch starts in m_order
  int64_t m_size = 0;              ///< the samples of the order taken (limit)
  int m_rank = 0, m_world = 1;
};

}  // namespace gt
