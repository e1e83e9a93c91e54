// Putting back the host storage's peak (core/tensor.h's counters) after a measurement that reset it.
#pragma once

#include <cstddef>

namespace gt {

/// Raises host_storage_peak_bytes() to `bytes` when it is lower: a measurement over part of a run resets the peak
/// (reset_host_storage_peak) and puts back the one from before when it ends.
void raise_host_storage_peak(size_t bytes);

}  // namespace gt
