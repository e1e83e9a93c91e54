// CPU dropout (ops/dropout.h): the Philox mask of ops/math.h, regenerated per element.
#include "ops/dropout.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/math.h"

namespace gt::cpu {
namespace {

template <class T>
void dropout_t(const Tensor& x, double p, uint64_t key, uint64_t step, Tensor& y) {
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  parallel_for(x.numel(), 1 << 14, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      py[i] = dropout_keep(key, step, static_cast<uint64_t>(i), p) ? px[i] * scale : T(0);
  });
}

}  // namespace

void dropout(const Tensor& x, double p, uint64_t key, uint64_t step, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) { dropout_t<decltype(t)>(x, p, key, step, y); });
}

}  // namespace gt::cpu
