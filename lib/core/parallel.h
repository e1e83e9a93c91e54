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

/// Calls f(begin, end) over [0, n) in chunks of `chunk` items that up to num_threads() threads take as they free
/// up, so that a core slowed by another process takes fewer: for items whose results do not depend on which thread
/// computes them, or in what order (each item writes its own outputs).
template <class F>
void parallel_for_dynamic(int64_t n, int64_t chunk, F&& f) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t chunks = (n + chunk - 1) / chunk;
  const int threads = static_cast<int>(std::min<int64_t>(chunks, omp_get_max_threads()));
  if (threads <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) f(c * chunk, std::min(n, (c + 1) * chunk));
}

/// Calls block(r0, r1, c0, c1) for an m × n matrix's rows r0..r1 and columns c0..c1: on `threads` OpenMP threads,
/// one block of rows (m ≥ n) or columns per thread, inner edges on multiples of 16 so that every block's inner loops
/// run on full vectors; with one thread, the whole matrix on the calling thread.
template <class F>
void for_matrix_blocks(int m, int n, int threads, F&& block) {
  if (threads <= 1) {
    block(0, m, 0, n);
    return;
  }
  const bool split_m = m >= n;
  const int extent = split_m ? m : n;
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; ++t) {
    const int lo = static_cast<int>(int64_t{extent} * t / threads / 16 * 16);
    const int hi = t == threads - 1 ? extent : static_cast<int>(int64_t{extent} * (t + 1) / threads / 16 * 16);
    if (hi <= lo) continue;
    if (split_m)
      block(lo, hi, 0, n);
    else
      block(0, m, lo, hi);
  }
}

}  // namespace gt
