// CPU row gathers (ops/gather.h): one memcpy per row.
#include "ops/gather.h"

#include "core/error.h"

#include <cstring>

namespace gt::cpu {

void gather_rows(const Tensor& src, const Tensor& order, int64_t first, Tensor& dst) {
  const int64_t rows = src.dim(0), n = dst.dim(0);
  const size_t row_bytes = rows > 0 ? src.bytes() / static_cast<size_t>(rows) : 0;
  const int32_t* idx = order.data<int32_t>() + first;
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
  for (int64_t k = 0; k < n; ++k) {
    if (idx[k] < 0 || idx[k] >= rows)
      throw Error(fmt::format("gather_rows: index {} at {} is not a row of {}", idx[k], first + k, src.shape().str()));
    std::memcpy(d + static_cast<size_t>(k) * row_bytes, s + static_cast<size_t>(idx[k]) * row_bytes, row_bytes);
  }
}

}  // namespace gt::cpu
