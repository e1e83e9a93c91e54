// The device side of a TensorGroup (ops.h): one table of pointers and sizes per group, and the chunks the fused
// kernels split the group's elements into. nvcc-safe.
#pragma once

#include "ops/math.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace gt::cuda {

/// A slice of one row's elements that one thread block updates.
struct GroupChunk {
  int32_t row;
  int64_t begin, end;
};

/// The table the kernels take by value: device arrays ptrs[row * width + col] (null for an undefined tensor) and
/// chunks[].
struct GroupView {
  void** ptrs = nullptr;
  GroupChunk* chunks = nullptr;
  int32_t width = 0, rows = 0;
  int64_t num_chunks = 0;
  bool is_double = false;
};

/// Owns a GroupView's device arrays (made once per group by ops_cuda.cpp).
struct GroupTable {
  GroupView view;
  int device = 0;
  GroupTable() = default;
  GroupTable(const GroupTable&) = delete;
  GroupTable& operator=(const GroupTable&) = delete;
  ~GroupTable();
};

/// Elements per chunk: large enough to amortise a block's start, small enough to spread a big row over many SMs.
inline constexpr int64_t kGroupChunk = 1 << 16;

/// per_row may be null.
void launch_sum_squares_group(cudaStream_t s, const GroupTable& t, int column, double* out, double* per_row);
void launch_sgd_group(cudaStream_t s, const SgdHyper& h, const GroupTable& t, const double* stats, double max_norm);
void launch_adam_group(cudaStream_t s, const AdamHyper& h, bool amsgrad, const GroupTable& t, const double* stats,
                       double max_norm);
void launch_accumulate_step(cudaStream_t s, const double* stats, double* window);

}  // namespace gt::cuda
