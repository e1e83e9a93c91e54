// The product precision of the calling thread and its rounded weights (ops/precision.h).
#include "ops/precision.h"

#include "core/parallel.h"

namespace gt {
namespace {

thread_local Precision t_precision = Precision::fp32;

// Scopes are numbered on each thread as they start: t_generation is the innermost live one's (0: none).
thread_local uint64_t t_scopes = 0;
thread_local uint64_t t_generation = 0;

struct WeightCache {
  ScopeCopies<std::vector<float>> copies;  // in a scope
  std::vector<float> outside;              // half_weight outside any scope
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
}
ProductPrecisionScope::~ProductPrecisionScope() {
  t_precision = m_previous;
  t_generation = m_previous_generation;
}

Precision product_precision() { return t_precision; }
uint64_t product_scope() { return t_generation; }
uint64_t product_scopes_started() { return t_scopes; }
void renew_product_scope() {
  if (t_generation != 0) t_generation = ++t_scopes;
}

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
  return t_cache.copies
      .get(w.raw(), w.numel(), format,
           [&](std::vector<float>& values) {
             values.resize(static_cast<size_t>(w.numel()));  // the same weight as in earlier steps: it fits already
             round_operand(format, w.data<float>(), values.data(), w.numel());
           })
      .data();
}

const float* find_half_weight(const Tensor& t, HalfFormat format) {
  const std::vector<float>* values = t_cache.copies.find(t.raw(), t.numel(), format);
  return values ? values->data() : nullptr;
}

HalfWeightCacheStats half_weight_cache_stats() {
  HalfWeightCacheStats s;
  t_cache.copies.for_each([&](const std::vector<float>& values) {
    ++s.entries;
    s.bytes += values.capacity() * sizeof(float);
  });
  s.roundings = t_cache.copies.makes();
  s.reuses = t_cache.copies.reuses();
  return s;
}

}  // namespace gt
