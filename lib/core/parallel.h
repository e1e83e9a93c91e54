// Threading for the CPU backend: OpenMP over static chunks (deterministic for a fixed thread count),
// and the one switch that sets both our threads and OpenBLAS's.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace gt {

/// Sets the threads used by CPU kernels (OpenBLAS itself is kept single-threaded inside them).
void set_num_threads(int n);
int num_threads();

/// Calls f(begin, end) over [0, n) in contiguous chunks of at least `grain` items, on up to num_threads() threads.
/// Chunk boundaries depend only on n, grain and the thread count, so results are reproducible.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
  const int chunks = static_cast<int>(std::min<int64_t>(max_chunks, omp_get_max_threads()));
  if (chunks <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (int c = 0; c < chunks; ++c) {
    const int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    f(begin, end);
  }
}

/// Part t of `extent` rows or columns of a matrix split `threads` ways: [lo, hi) with inner edges on multiples of 16,
/// so that every part's inner loops run on full vectors; the last part runs to the end (lo ≥ hi: an empty part).
inline void split16(int extent, int t, int threads, int& lo, int& hi) {
  lo = static_cast<int>(int64_t{extent} * t / threads / 16 * 16);
  hi = t == threads - 1 ? extent : static_cast<int>(int64_t{extent} * (t + 1) / threads / 16 * 16);
}

}  // namespace gt
