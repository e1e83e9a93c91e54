// CPU activations (ops/activation.h): OpenMP loops over ops/math.h's per-element math, one loop per activation.
#include "ops/activation.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"

#include <type_traits>

namespace gt::cpu {
namespace {

template <class T>
void act_fwd_t(Activation a, const Tensor& x, Tensor& y) {
  const T* px = x.data<T>();
  T* py = y.data<T>();
  auto loop = [&](auto act) {
    parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) py[i] = act_forward<T>(act, px[i]);
    });
  };
  with_activation(a, loop);
}

template <class T>
void act_bwd_t(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const T *px = x.data<T>(), *py = y.data<T>(), *pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  auto loop = [&](auto act) {
    parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pdx[i] = act_backward<T>(act, px[i], py[i], pdy[i]);
    });
  };
  with_activation(a, loop);
}

}  // namespace

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) { act_fwd_t<decltype(t)>(a, x, y); });
}
void activation_backward(Activation a, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  for_float_type(x.dtype(), [&](auto t) { act_bwd_t<decltype(t)>(a, x, y, dy, dx); });
}

}  // namespace gt::cpu
