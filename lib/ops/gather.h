// Row gathers by an index list: the batches of a data set held on the device (data.device_resident).
// ops/gather.cpp checks the contract; ops/cpu/gather.cpp and ops/cuda/gather.cu implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"

#include <cstdint>

namespace gt::ops {

/// dst[k] = src[order[first + k]] for k < dst.dim(0): whole rows (one sample each) of src (N, sample...) copied into
/// dst (n, sample...), of the same dtype, by the i32 indices order[first, first + n). All three on one device. An
/// index outside [0, N) is an error on the CPU; a CUDA kernel cannot throw, so on CUDA that row of dst is zero.
void gather_rows(const Tensor& src, const Tensor& order, int64_t first, Tensor& dst);

}  // namespace gt::ops

GT_BACKEND_ENTRY_POINTS(gather_rows)
