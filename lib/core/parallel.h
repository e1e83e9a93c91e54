// Threading for the CPU backend: OpenMP over static chunks (deterministic for a fixed thread count),
// and the one switch that sets both our threads and OpenBLAS's.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

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

/// Items [0, n) shared by the threads of an OpenMP team: each thread is dealt the contiguous range parallel_for
/// gives it (thread t of T: [n·t/T, n·(t+1)/T)) and takes its own from the front, so that it works on the rows an
/// earlier loop left in its core's caches; a thread whose range is empty takes the last item left in another's, so
/// that a core slowed by another process takes fewer. Inside a parallel region: every thread deals its own range,
/// a barrier, then take() until it returns -1 (and a barrier before dealing again).
class WorkPile {
 public:
  explicit WorkPile(int threads)
      : slots_(std::make_unique<Slot[]>(static_cast<size_t>(std::max(threads, 1)))), threads_(std::max(threads, 1)) {}

  /// The calling thread's range of n items (n < 2^32) in a team of team_size threads (at most the constructor's).
  void deal(int thread, int team_size, int64_t n) {
    const auto lo = static_cast<uint64_t>(n * thread / team_size),
               hi = static_cast<uint64_t>(n * (thread + 1) / team_size);
    slots_[thread].range.store(lo << 32 | hi, std::memory_order_relaxed);
  }

  /// The next item for `thread` (the first left in its own range, else the last left in another's), -1 when none is.
  int64_t take(int thread) {
    if (const int64_t own = claim(thread, true); own >= 0) return own;
    for (int i = 1; i < threads_; ++i)
      if (const int64_t other = claim((thread + i) % threads_, false); other >= 0) return other;
    return -1;
  }

 private:
  int64_t claim(int slot, bool front) {
    std::atomic<uint64_t>& range = slots_[slot].range;
    uint64_t v = range.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t lo = v >> 32, hi = v & 0xFFFFFFFFu;
      if (lo >= hi) return -1;
      const uint64_t next = front ? (lo + 1) << 32 | hi : lo << 32 | (hi - 1);
      if (range.compare_exchange_weak(v, next, std::memory_order_relaxed))
        return static_cast<int64_t>(front ? lo : hi - 1);
    }
  }

  struct alignas(64) Slot {
    std::atomic<uint64_t> range{0};  // [lo, hi) as lo << 32 | hi
  };
  std::unique_ptr<Slot[]> slots_;
  int threads_;
};

/// Calls f(begin, end) over [0, n) in chunks of `chunk` items on up to num_threads() threads, each taking the
/// chunks of its own share of [0, n) first and then what is left of others' (WorkPile), so that a core slowed by
/// another process takes fewer: for items whose results do not depend on which thread computes them, or in what
/// order (each item writes its own outputs).
template <class F>
void parallel_for_stealing(int64_t n, int64_t chunk, F&& f) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t chunks = (n + chunk - 1) / chunk;
  const int threads = static_cast<int>(std::min<int64_t>(chunks, omp_get_max_threads()));
  if (threads <= 1) {
    f(int64_t{0}, n);
    return;
  }
  WorkPile pile(threads);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    pile.deal(t, omp_get_num_threads(), chunks);
#pragma omp barrier
    for (int64_t c = pile.take(t); c >= 0; c = pile.take(t)) f(c * chunk, std::min(n, (c + 1) * chunk));
  }
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
