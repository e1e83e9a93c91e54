// The product precision of the calling thread (ops/precision.h).
#include "ops/precision.h"

namespace gt {
namespace {

thread_local Precision t_precision = Precision::fp32;

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

ProductPrecisionScope::ProductPrecisionScope(Precision p) : m_previous(t_precision) { t_precision = p; }
ProductPrecisionScope::~ProductPrecisionScope() { t_precision = m_previous; }

Precision product_precision() { return t_precision; }

}  // namespace gt
