// The contract of dropout (ops/dropout.h): sizes, dtypes and devices, then the backend's entry point.
#include "ops/dropout.h"

#include "ops/dispatch.h"
#include "ops/wide.h"

namespace gt::ops {

void dropout(const Tensor& x, double p, uint64_t key, uint64_t step, Tensor& y) {
  if (any_half({&x, &y})) {  // 16-bit activations (ops/wide.h): the same mask, computed in f32
    Wide wide;
    Tensor yw = wide.out(y);
    dropout(wide.in(x), p, key, step, yw);
    wide.finish();
    return;
  }
  const Operands op("dropout", {&x, &y});
  GT_CHECK(x.numel() == y.numel() && p >= 0 && p < 1, "dropout sizes or p");
  GT_DISPATCH(op, dropout(x, p, key, step, y));
}

}  // namespace gt::ops
