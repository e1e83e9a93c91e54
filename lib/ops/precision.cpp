// The product precision of the calling thread and its rounded weights (ops/precision.h).
#include "ops/precision.h"

#include "core/parallel.h"

#include <unordered_map>

namespace gt {
namespace {

thread_local Precision t_precision = Precision::fp32;

// Scopes are numbered on each thread as they start; t_generation is the innermost live one's (0: none). A rounded
// weight is valid in the scope whose number it carries, and no other: an inner scope's number is new, and when it
// ends the outer one's copies that it overwrote carry the inner number, so the outer scope rounds them again.
thread_local uint64_t t_scopes = 0;
thread_local uint64_t t_generation = 0;

struct RoundedWeight {
  int64_t numel = 0;
  HalfFormat format = HalfFormat::bf16;
  uint64_t generation = 0;  // the scope the values were rounded in
  uint64_t last_read = 0;   // the last scope a product read them in
  std::vector<float> values;
};

struct WeightCache {
  std::unordered_map<const void*, RoundedWeight> entries;  // by the weight's first element
  std::vector<float> outside;                              // half_weight outside any scope
  uint64_t roundings = 0, reuses = 0;
};
thread_local WeightCache t_cache;

constexpr int64_t kRoundGrain = 1 << 15;  // below this many elements the rounding stays on one thread

}  // namespace

const std::string& to_string(Precision p) {
  static const std::string names[] = {"fp32", "tf32", "bf16", "fp16"};
  return names[static_cast<int>(p)];
}

std::optional<HalfFormat> half_format(Precision p) {
  if (p == Precision::bf16) return HalfFormat::bf16;
  if (p == Precision::fp16) return HalfFormat::fp16;
  return std::nullopt;
}

ProductPrecisionScope::ProductPrecisionScope(Precision p)
    : m_previous(t_precision), m_previous_generation(t_generation) {
  t_precision = p;
  t_generation = ++t_scopes;
  // Copies of weights that no product read in the scope before this one (a model since destroyed, a smaller
  // evaluation) give their memory back; those of a model still training were read in the last step or evaluation.
  std::erase_if(t_cache.entries, [](const auto& e) { return e.second.last_read + 1 < t_scopes; });
}
ProductPrecisionScope::~ProductPrecisionScope() {
  t_precision = m_previous;
  t_generation = m_previous_generation;
}

Precision product_precision() { return t_precision; }

void round_operand(HalfFormat format, const float* in, float* out, int64_t n) {
  parallel_for(n, kRoundGrain,
               [&](int64_t i0, int64_t i1) { round_to_half(format, in + i0, out + i0, static_cast<size_t>(i1 - i0)); });
}

void pack_half(HalfFormat format, const float* in, uint16_t* out, int64_t n) {
  parallel_for(n, kRoundGrain, [&](int64_t i0, int64_t i1) {
    const auto m = static_cast<size_t>(i1 - i0);
    if (format == HalfFormat::bf16)
      floats_to_bf16(in + i0, out + i0, m);
    else
      floats_to_fp16(in + i0, out + i0, m);
  });
}

void unpack_half(HalfFormat format, const uint16_t* in, float* out, int64_t n) {
  parallel_for(n, kRoundGrain, [&](int64_t i0, int64_t i1) {
    const auto m = static_cast<size_t>(i1 - i0);
    if (format == HalfFormat::bf16)
      bf16_to_floats(in + i0, out + i0, m);
    else
      fp16_to_floats(in + i0, out + i0, m);
  });
}

const float* rounded_copy(const Tensor& t, HalfFormat format, std::vector<float>& buf) {
  const auto n = static_cast<size_t>(t.numel());
  if (buf.size() < n) buf.resize(n);
  round_operand(format, t.data<float>(), buf.data(), t.numel());
  return buf.data();
}

const float* half_weight(const Tensor& w, HalfFormat format) {
  if (t_generation == 0) return rounded_copy(w, format, t_cache.outside);
  RoundedWeight& e = t_cache.entries[w.raw()];
  e.last_read = t_generation;
  if (e.generation == t_generation && e.numel == w.numel() && e.format == format) {
    ++t_cache.reuses;
    return e.values.data();
  }
  e.values.resize(static_cast<size_t>(w.numel()));  // the same weight as in earlier steps: its buffer fits already
  round_operand(format, w.data<float>(), e.values.data(), w.numel());
  e.numel = w.numel();
  e.format = format;
  e.generation = t_generation;
  ++t_cache.roundings;
  return e.values.data();
}

const float* find_half_weight(const Tensor& t, HalfFormat format) {
  if (t_generation == 0) return nullptr;
  const auto it = t_cache.entries.find(t.raw());
  if (it == t_cache.entries.end()) return nullptr;
  const RoundedWeight& e = it->second;
  if (e.generation != t_generation || e.numel != t.numel() || e.format != format) return nullptr;
  ++t_cache.reuses;
  return e.values.data();
}

HalfWeightCacheStats half_weight_cache_stats() {
  HalfWeightCacheStats s;
  for (const auto& [data, e] : t_cache.entries) {
    ++s.entries;
    s.bytes += e.values.capacity() * sizeof(float);
  }
  s.roundings = t_cache.roundings;
  s.reuses = t_cache.reuses;
  return s;
}

}  // namespace gt
