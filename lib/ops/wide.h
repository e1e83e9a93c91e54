// 16-bit activation tensors (DType::bf16 and f16, Model::set_activation_dtype) through ops written for f32: convert
// between the dtypes, and Wide, which an op's dispatch uses where its backend has no 16-bit kernel, so that every op
// takes 16-bit activations and computes on them in f32 (rounding its 16-bit results once, at the end).
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace gt::ops {

/// dst = src element for element, on one device: f32 to bf16 or f16 rounds to nearest even (NaN stays NaN), 16 bits
/// to f32 is exact, and the same dtype copies. Same element count; other pairs of dtypes are refused.
void convert(const Tensor& src, Tensor& dst);

/// Whether some defined tensor among `ts` holds 16-bit elements.
bool any_half(std::initializer_list<const Tensor*> ts);

/// How many f32 temporaries Wide has made in this process so far (every thread's): an op that reads and writes its
/// 16-bit tensors itself leaves it as it was, which the tests of the CUDA kernels check.
int64_t wide_temporaries();

/// An op's 16-bit operands seen as f32: in(t) is t widened into a temporary f32 tensor on its device (t itself when
/// it is not 16-bit, or undefined); out(t) is a temporary f32 tensor for a 16-bit result, rounded into t by finish()
/// (t itself when it is not 16-bit). A result whose old contents the op reads (an accumulating beta, a gradient added
/// to) is out(t, true): its temporary starts as t widened. One temporary per distinct tensor: an operand that is
/// also a result (y = x + y) is the same f32 temporary both ways.
class Wide {
 public:
  Wide() = default;
  Wide(const Wide&) = delete;
  Wide& operator=(const Wide&) = delete;
  Tensor in(const Tensor& t);
  Tensor out(const Tensor& t, bool read = false);
  /// Rounds every out() temporary into its 16-bit tensor: call once the op has run (not on an exception's way out,
  /// where the op's results are lost either way).
  void finish();

 private:
  Tensor temp(const Tensor& t, bool read);
  struct Temp {
    Tensor half, wide;
    bool filled;  // wide holds half's values (an in(), or an out() that reads)
  };
  std::vector<Temp> m_temps;
  std::vector<size_t> m_outs;  // positions in m_temps that finish() rounds back
};

}  // namespace gt::ops
