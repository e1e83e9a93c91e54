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
#include <unordered_map>
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

/// The calling thread's scopes are numbered as they start: the innermost live one's number (0 outside any scope),
/// and how many have started on the thread so far.
uint64_t product_scope();
uint64_t product_scopes_started();
/// Inside a scope: the weights its products read may have moved or changed (dist.zero 3 gathers a unit of
/// parameters into memory another unit's weights held a moment ago), so the innermost scope takes a new number and
/// the weight copies made so far in it are not handed out again (they are remade at their next use). Outside any
/// scope nothing is cached, and this does nothing.
void renew_product_scope();

/// Copies of weights valid for one scope, keyed by the weight's first element: the bookkeeping of the CPU's rounded
/// weights (half_weight below: `Values` f32 values) and of CUDA's 16-bit device copies (ops/cuda/half_scratch.h).
/// A copy is valid in the scope it was made in and no other: an inner scope's number is new, and when it ends the
/// outer one's copies that it remade carry the inner number, so the outer scope makes them again. An entry whose
/// copy no product read in the scope before the current one (a model since destroyed, a smaller evaluation) is
/// freed at the next lookup after a scope starts; the others keep their buffers, so later steps remake their copies
/// without allocating. One object per thread: the scope numbers are the calling thread's.
template <class Values>
class ScopeCopies {
 public:
  /// The copy of the `numel`-element tensor at `key` in `format` for the current scope (there must be one): the
  /// one made earlier in this scope, or `make(values)` called now to (re)make it in the entry's buffer (which holds
  /// the last scope's copy, or is new). An exception from `make` leaves the entry invalid.
  template <class Make>
  const Values& get(const void* key, int64_t numel, HalfFormat format, Make&& make) {
    sweep();
    Entry& e = m_entries[key];
    e.last_read = product_scope();
    if (e.scope == product_scope() && e.numel == numel && e.format == format) {
      ++m_reuses;
      return e.values;
    }
    e.scope = 0;
    make(e.values);
    e.numel = numel;
    e.format = format;
    e.scope = product_scope();
    ++m_makes;
    return e.values;
  }

  /// The copy made in the current scope for the same key, element count and format, or null.
  const Values* find(const void* key, int64_t numel, HalfFormat format) {
    if (product_scope() == 0) return nullptr;
    sweep();
    const auto it = m_entries.find(key);
    if (it == m_entries.end()) return nullptr;
    Entry& e = it->second;
    if (e.scope != product_scope() || e.numel != numel || e.format != format) return nullptr;
    e.last_read = product_scope();
    ++m_reuses;
    return &e.values;
  }

  /// Frees the entries that no product read in the scope before the newest one started (once per started scope).
  void sweep() {
    const uint64_t started = product_scopes_started();
    if (m_swept == started) return;
    m_swept = started;
    std::erase_if(m_entries, [&](const auto& kv) { return kv.second.last_read + 1 < started; });
  }

  /// f(values) for each entry (after a sweep: what the thread holds now).
  template <class F>
  void for_each(F&& f) {
    sweep();
    for (const auto& kv : m_entries) f(kv.second.values);
  }
  size_t size() {
    sweep();
    return m_entries.size();
  }
  /// Over the object's life: copies made, and copies handed out again in the scope that made them.
  uint64_t makes() const { return m_makes; }
  uint64_t reuses() const { return m_reuses; }

 private:
  struct Entry {
    int64_t numel = 0;
    HalfFormat format = HalfFormat::bf16;
    uint64_t scope = 0;      // the scope the copy was made in (0: none valid)
    uint64_t last_read = 0;  // the last scope a product read it in
    Values values;
  };
  std::unordered_map<const void*, Entry> m_entries;
  uint64_t m_swept = 0;
  uint64_t m_makes = 0, m_reuses = 0;
};

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
/// no product read during the last scope is freed in the next one (ScopeCopies above). Outside a scope: rounds into
/// a per-thread buffer that the next call may overwrite.
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
