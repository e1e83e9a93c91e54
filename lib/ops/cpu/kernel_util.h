// What the CPU kernels share: the element-type switch and the grain below which a loop stays on one thread.
#pragma once

#include "core/tensor.h"

#include <cstdint>

namespace gt::cpu {

/// Calls f(float{}) or f(double{}) for the tensor's element type; the kernels are templates over it, so gradient
/// checks run the same code in double.
template <class F>
void for_float_type(DType t, F&& f) {
  if (t == DType::f32)
    f(float{});
  else if (t == DType::f64)
    f(double{});
  else
    throw Error(fmt::format("CPU kernel called on a {} tensor; it takes f32 or f64", dtype_name(t)));
}

/// Below this many elements a loop runs on one thread: waking the others costs more than it saves.
inline constexpr int64_t kGrain = 1 << 15;

}  // namespace gt::cpu
