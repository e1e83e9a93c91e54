// The largest sizes gputrain takes, in one place: every size a user can write is checked against one of these, so
// that no product of sizes (elements, bytes, FLOPs, steps) can wrap around in 64 bits. docs/runs.md's section "What
// gputrain refuses, and how it fails" lists them; change both together.
#pragma once

#include <cstdint>

namespace gt {

/// A bound on one user-written size, with the words a message uses for it.
struct SizeLimit {
  int64_t max;
  const char* what;  ///< "the largest batch size", for "expected … ≤ max (what), got …"
};

namespace limits {

/// One extent of a tensor: a feature count, channels, classes, a spatial side, a vocabulary. 2^24 is where a float
/// stops holding every integer (class labels pass through floats in the NPY and CSV readers), and is 60 times the
/// largest vocabulary or image side in common use; three such extents still multiply within 64 bits.
inline constexpr SizeLimit kExtent{int64_t{1} << 24, "the largest extent of one dimension"};
/// Samples in one batch. The same 2^24: a batch tensor is batch × sample elements, and both sides are bounded.
inline constexpr SizeLimit kBatch{int64_t{1} << 24, "the largest batch size"};
/// Samples in a data set (synthetic samples and test_samples; a file's first dimension). 2^32 is a hundred times
/// the largest public image data sets and keeps sample indices, permutations and offsets far from overflow.
inline constexpr SizeLimit kSamples{int64_t{1} << 32, "the largest number of samples"};
/// Dimensions of one sample's shape ([C, H, W] is 3). Ops are written for up to 4-D tensors plus the batch.
inline constexpr SizeLimit kRank{8, "the most dimensions a sample may have"};
/// Elements of one tensor (a batch, a layer's weights, a whole data set in memory): 2^40 floats are 4 TiB, more
/// than any one machine's memory, and × 8 bytes or × a 2^24 extent still fits in 64 bits (bytes, FLOPs).
inline constexpr SizeLimit kElements{int64_t{1} << 40, "the most elements one tensor may hold"};
/// Training epochs. 2^20 (a million) passes is past any real run; epochs × steps per epoch then fits easily.
inline constexpr SizeLimit kEpochs{int64_t{1} << 20, "the most epochs"};
/// Optimizer steps in a run (train.max_steps, and epochs × steps per epoch): 2^40 is ~35 years at 1000 steps/s.
inline constexpr SizeLimit kSteps{int64_t{1} << 40, "the most steps in one run"};
/// Micro-batches accumulated into one step. 2^16: batch × accumulate × ranks (the global batch) stays below 2^50.
inline constexpr SizeLimit kAccumulate{int64_t{1} << 16, "the most micro-batches one step accumulates"};
/// Logging, evaluation and checkpoint intervals in steps, and other step counts: the same bound as a run.
inline constexpr SizeLimit kInterval{int64_t{1} << 40, "the most steps in one run"};
/// Zero padding of a random crop, per side. Beyond an image's side a crop is all padding; 2^16 is past any image
/// side and keeps the shift's range (2 × padding + 1) small.
inline constexpr SizeLimit kCropPadding{int64_t{1} << 16, "the largest crop padding"};

/// Bytes of a config file. A real config is a few KiB; 1 MiB leaves room for generated ones and keeps `check
/// /dev/zero` and its kin from reading without end.
inline constexpr int64_t kConfigBytes = int64_t{1} << 20;
/// YAML nodes a config may expand to once aliases are followed. A billion-laughs file of 1 KiB expands to 10^9;
/// a real config has a few hundred nodes, and 100000 walk in milliseconds.
inline constexpr int64_t kConfigNodes = 100000;
/// Characters of a run name (one path component): room for a timestamp and a description, well below NAME_MAX
/// (255) once the run directory adds its suffixes.
inline constexpr int64_t kRunNameChars = 128;
/// Characters of a file's value echoed into an error message (a CSV field, a header string): enough to recognise
/// it, short enough that a 10 MB field does not become a 10 MB line.
inline constexpr int64_t kQuotedChars = 64;

}  // namespace limits
}  // namespace gt
