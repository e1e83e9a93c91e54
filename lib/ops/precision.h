// The precision of a run's matrix products (train.precision), the scope that turns half products on for the
// calling thread (how the mode of a bf16/fp16 run reaches the ops without a parameter through every layer), and the
// scope's rounded weights.
#pragma once

#include "core/half.h"
#include "core/tensor.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gt {

/// train.precision: fp32 (the default), tf32 (fp32 products on TF32 tensor cores on GPUs; fp32 on the CPU), bf16 and
/// fp16 (matrix products of half operands with fp32 accumulation; everything else stays fp32).
enum class Precision { fp32, tf32, bf16, fp16 };
const std::string& to_string(Precision p);

/// The half format a Precision multiplies in; nullopt for fp32 and tf32.
std::optional<HalfFormat> half_format(Precision p);

/// Autocast, in the manner of torch.autocast: while one is alive, the calling thread's matrix products (ops::matmul,
/// ops::linear_forward, the CPU's convolution GEMMs and attention's four products) run in `p`; before it and after it,
/// in the tensors' own precision. The training step and the evaluation of a bf16/fp16/tf32 run enter one around their
/// forward and backward passes, and nothing else does, so a half mode never leaks into code outside a run's step (a
/// test, a checkpoint's export). The setting is per thread because each rank of a worker-threads run (dist.launch:
/// threads) is a thread; the op reads it on the calling thread before it fans out over OpenMP's. Scopes nest: the
/// innermost one wins and the outer returns on exit.
///
/// A scope is also the lifetime of the rounded weights (half_weight below): the weights a step's products read do
/// not change while its scope is alive (the optimizer updates them after it), so each is rounded once per scope.
class ProductPrecisionScope {
 public:
  explicit ProductPrecisionScope(Precision p);
  ~ProductPrecisionScope();
  ProductPrecisionScope(const ProductPrecisionScope&) = delete;
  ProductPrecisionScope& operator=(const ProductPrecisionScope&) = delete;

 private:
  Precision m_previous;
  uint64_t m_previous_generation;
};

/// The calling thread's product precision: that of the innermost live scope, fp32 when there is none.
Precision product_precision();

/// out[i] = in[i] rounded to `format` (nearest even), over OpenMP's threads when n is large: a half product's
/// operand. `in` and `out` may be the same array.
void round_operand(HalfFormat format, const float* in, float* out, int64_t n);

/// Activations kept for backward in 16 bits (Model::set_activation_storage): out[i] = in[i] in `format` (nearest
/// even), and back (exact), over OpenMP's threads when n is large.
void pack_half(HalfFormat format, const float* in, uint16_t* out, int64_t n);
void unpack_half(HalfFormat format, const uint16_t* in, float* out, int64_t n);

/// `t` (f32, contiguous, on the CPU) rounded to `format` into `buf` (grown to fit, kept by the caller: a thread's
/// scratch); returns buf's data.
const float* rounded_copy(const Tensor& t, HalfFormat format, std::vector<float>& buf);

/// The weight `w` (f32, on the CPU) rounded to `format`: the copy is made the first time a product reads `w` inside
/// the calling thread's innermost live ProductPrecisionScope and returned again to every later product of that scope
/// (a step's forward and both backward products read it once per micro-batch, and pay one rounding per step).
/// Only the ops whose contract names an operand a weight call this (linear_forward's w, conv2d's w), and a weight
/// must stay alive and unchanged while the scope lives. The copies belong to the calling thread (each rank of a
/// threads run is one); their buffers outlive the scope, so later steps reuse them without allocating, and an entry
/// no product read during the last scope is freed when the next one starts. Outside a scope: rounds into a
/// per-thread buffer that the next call may overwrite.
const float* half_weight(const Tensor& w, HalfFormat format);

/// The copy half_weight made in this scope for the same tensor (same data, same element count, same format), or
/// null: how ops::matmul, whose contract does not say which operand is a weight, finds the one of dx = dy·W.
const float* find_half_weight(const Tensor& t, HalfFormat format);

/// What the calling thread's rounded weights hold now: entries and bytes (4 per element: the CPU keeps the rounded
/// values as f32, which its f32 GEMM multiplies); and, over the thread's life, how many copies half_weight made and
/// how many times a product was handed a copy made before it in the same scope.
struct HalfWeightCacheStats {
  size_t entries = 0, bytes = 0;
  uint64_t roundings = 0, reuses = 0;
};
HalfWeightCacheStats half_weight_cache_stats();

}  // namespace gt
