// Dropout with a mask regenerated from a Philox draw (ops/math.h dropout_keep), never stored. ops/dropout.cpp checks
// the contract; ops/cpu/dropout.cpp and ops/cuda/dropout.cu implement it.
#pragma once

#include "core/tensor.h"
#include "ops/entry_points.h"

#include <cstdint>

namespace gt::ops {

/// y = x · keep / (1 − p); keep is drawn from Philox for (key, step, element), so the backward pass (the same call
/// on dy) regenerates the mask instead of storing it.
void dropout(const Tensor& x, double p, uint64_t key, uint64_t step, Tensor& y);

}  // namespace gt::ops

// The backends' entry points: the op above calls them once the contract holds.
GT_BACKEND_ENTRY_POINTS(dropout)
