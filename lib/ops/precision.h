// The precision of a run's matrix products (train.precision) and the scope that turns half products on for the
// calling thread: how the mode of a bf16/fp16 run reaches the matmul ops without a parameter through every layer.
#pragma once

#include "core/half.h"

#include <optional>
#include <string>

namespace gt {

/// train.precision: fp32 (the default), tf32 (fp32 products on TF32 tensor cores on GPUs; fp32 on the CPU), bf16 and
/// fp16 (matrix products of half operands with fp32 accumulation; everything else stays fp32).
enum class Precision { fp32, tf32, bf16, fp16 };
const std::string& to_string(Precision p);

/// The half format a Precision multiplies in; nullopt for fp32 and tf32.
std::optional<HalfFormat> half_format(Precision p);

/// Autocast, in the manner of torch.autocast: while one is alive, the calling thread's matrix products (ops::matmul
/// and ops::linear_forward) run in `p`; before it and after it, in the tensors' own precision. The training step and
/// the evaluation of a bf16/fp16/tf32 run enter one around their forward and backward passes, and nothing else does,
/// so a half mode never leaks into code outside a run's step (a test, a checkpoint's export). The setting is per
/// thread because each rank of a worker-threads run (dist.launch: threads) is a thread; the op reads it on the
/// calling thread before it fans out over OpenMP's. Scopes nest: the innermost one wins and the outer returns on exit.
class ProductPrecisionScope {
 public:
  explicit ProductPrecisionScope(Precision p);
  ~ProductPrecisionScope();
  ProductPrecisionScope(const ProductPrecisionScope&) = delete;
  ProductPrecisionScope& operator=(const ProductPrecisionScope&) = delete;

 private:
  Precision m_previous;
};

/// The calling thread's product precision: that of the innermost live scope, fp32 when there is none.
Precision product_precision();

}  // namespace gt
