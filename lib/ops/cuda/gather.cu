// CUDA row gathers (ops/gather.h): a thread per 4-byte word of the output (every dtype is 4 or 8 bytes wide).
#include "ops/gather.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kThreads = 256;

// dst (n, words) = src[idx[k], :] in 4-byte words; a row whose index is outside [0, rows) is zero (ops/gather.h).
__global__ void gather_rows_kernel(const uint32_t* __restrict__ src, const int32_t* __restrict__ idx, int64_t n,
                                   int64_t words, int64_t rows, uint32_t* __restrict__ dst) {
  const int64_t total = n * words;
  for (int64_t e = global_index(); e < total; e += grid_stride()) {
    const int64_t k = e / words, j = e - k * words;
    const int64_t row = idx[k];
    dst[e] = row >= 0 && row < rows ? src[row * words + j] : 0u;
  }
}

}  // namespace

void gather_rows(const Tensor& src, const Tensor& order, int64_t first, Tensor& dst) {
  const int64_t n = dst.dim(0), rows = src.dim(0);
  if (n == 0 || rows == 0) return;
  const int64_t words = static_cast<int64_t>(src.bytes() / static_cast<size_t>(rows) / sizeof(uint32_t));
  if (words == 0) return;
  gather_rows_kernel<<<grid_for(n * words, kThreads), kThreads, 0, stream(src.device().index)>>>(
      static_cast<const uint32_t*>(src.raw()), order.data<int32_t>() + first, n, words, rows,
      static_cast<uint32_t*>(dst.raw()));
  GT_CHECK_LAUNCH();
}

}  // namespace gt::cuda
