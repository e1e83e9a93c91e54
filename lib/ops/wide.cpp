// 16-bit activations through f32 ops (ops/wide.h): the conversions are ops/half_storage.h's on each backend.
#include "ops/wide.h"

#include "ops/half_storage.h"

#include <algorithm>
#include <atomic>

namespace gt::ops {
namespace {

std::atomic<int64_t> g_temporaries{0};  // wide_temporaries()

}  // namespace

void convert(const Tensor& src, Tensor& dst) {
  GT_CHECK(src.numel() == dst.numel() && src.device() == dst.device(), "convert {} {} on {} into {} {} on {}",
           dtype_name(src.dtype()), src.shape().str(), src.device().str(), dtype_name(dst.dtype()), dst.shape().str(),
           dst.device().str());
  if (src.dtype() == dst.dtype()) {
    dst.copy_from(src.view(dst.shape()));
  } else if (src.dtype() == DType::f32 && is_half(dst.dtype())) {
    pack_activation(half_format_of(dst.dtype()), src, dst.raw());
  } else if (is_half(src.dtype()) && dst.dtype() == DType::f32) {
    unpack_activation(half_format_of(src.dtype()), src.raw(), dst);
  } else {
    GT_CHECK(false, "convert: {} into {} is not a conversion between f32 and 16 bits", dtype_name(src.dtype()),
             dtype_name(dst.dtype()));
  }
}

int64_t wide_temporaries() { return g_temporaries.load(std::memory_order_relaxed); }

bool any_half(std::initializer_list<const Tensor*> ts) {
  return std::any_of(ts.begin(), ts.end(), [](const Tensor* t) { return t->defined() && is_half(t->dtype()); });
}

Tensor Wide::temp(const Tensor& t, bool read) {
  for (Temp& m : m_temps)
    if (m.half.raw() == t.raw() && m.half.numel() == t.numel() && m.half.dtype() == t.dtype()) {
      if (read && !m.filled) convert(t, m.wide);  // an out() first, then the same tensor as an input
      m.filled = m.filled || read;
      return m.wide.view(t.shape());
    }
  Tensor wide = Tensor::empty(t.shape(), DType::f32, t.device());
  g_temporaries.fetch_add(1, std::memory_order_relaxed);
  if (read) convert(t, wide);
  m_temps.push_back({t, wide, read});
  return wide;
}

Tensor Wide::in(const Tensor& t) {
  if (!t.defined() || !is_half(t.dtype())) return t;
  return temp(t, true);
}

Tensor Wide::out(const Tensor& t, bool read) {
  if (!t.defined() || !is_half(t.dtype())) return t;
  Tensor wide = temp(t, read);
  for (size_t i = 0; i < m_temps.size(); ++i)
    if (m_temps[i].wide.raw() == wide.raw() && std::find(m_outs.begin(), m_outs.end(), i) == m_outs.end())
      m_outs.push_back(i);
  return wide;
}

void Wide::finish() {
  for (size_t i : m_outs) convert(m_temps[i].wide, m_temps[i].half);
  m_outs.clear();
}

}  // namespace gt::ops
