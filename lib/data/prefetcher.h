// Loader threads (`data.workers`): whole batches prepared ahead of the trainer in a bounded ring of slots.
#pragma once

#include "core/noncopyable.h"
#include "core/tensor.h"
#include "data/dataset.h"

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace gt {

/// `workers` threads fill the batches that follow the loader's position (gather, scale, augment: Loader::fill) into
/// a ring of `slots` batches, and the trainer takes them in the loader's order. Batch k goes to slot k mod slots
/// and a thread takes batch k only while slot k mod slots is free, so at most `slots` batches are ready ahead, and
/// as fill() is a function of (epoch, position) alone the batches are the same for any number of threads. At an
/// epoch's end the threads go on with the next epoch from its start; a take for any other batch (a resume, a
/// rollback, a new epoch started elsewhere) drops the ring and restarts it there. An exception in a thread is kept
/// in its batch's slot and rethrown by the take of that batch, on the trainer's thread. The destructor stops the
/// threads (one blocked on a full ring too) and joins them. The threads block every signal: the trainer's thread
/// takes SIGINT and SIGTERM.
class Prefetcher : NonCopyable {
 public:
  struct Slot {
    Tensor x, y;  ///< (batch, input shape) f32 and (batch, target shape); the first n samples hold the batch
  };
  /// For batches of up to `batch` samples of `data` cut by `loader` (both must outlive this). Slots are page-locked
  /// (Tensor::empty_pinned) when `pinned`, so the trainer may copy from them asynchronously.
  Prefetcher(const Loader& loader, const Dataset& data, int64_t batch, int workers, int slots, bool pinned);
  ~Prefetcher();

  /// Waits for the batch at `loader`'s epoch and position and returns its size, its slot in `slot`; 0 (and no slot)
  /// when the epoch is over. The slot is the caller's until release(), and the loader does not move: the caller
  /// advances it. Rethrows the exception of the thread that filled the batch.
  int64_t take(const Loader& loader, Slot*& slot);
  /// Hands the taken slot back to the threads.
  void release();

  int workers() const { return static_cast<int>(m_threads.size()); }

 private:
  struct Job {
    int64_t epoch = 0, position = 0;
    std::shared_ptr<const std::vector<int64_t>> order;  ///< the epoch's order (threads share it read-only)
  };
  struct Entry {
    bool ready = false;
    int64_t n = 0;
    std::exception_ptr error;
  };
  void work();
  Job after(Job job) const;  ///< the batch after `job`: the next position, or the next epoch's start
  void restart(const Loader& loader);

  const Loader& m_loader;
  std::vector<Slot> m_slots;
  std::vector<Entry> m_entries;  ///< per slot, guarded by m_mutex (the slot's tensors belong to its filler)
  std::mutex m_mutex;
  std::condition_variable m_changed;
  Job m_next;                ///< the batch the next idle thread takes, number m_next_seq
  int64_t m_next_seq = 0;    ///< batches are numbered in handing-over order
  int64_t m_taken_seq = 0;   ///< the number of the batch the trainer takes (or holds) next
  Job m_head;                ///< that batch
  bool m_held = false;       ///< the trainer holds slot m_taken_seq mod slots
  int64_t m_generation = 0;  ///< bumped by a restart: a batch filled for an older one is dropped
  int m_busy = 0;            ///< threads inside fill()
  bool m_pause = false;      ///< a restart waits for the busy threads; no new batch is handed out meanwhile
  bool m_failed = false;     ///< a thread's fill threw: no later batch is handed out
  bool m_stop = false;
  std::vector<std::thread> m_threads;
};

}  // namespace gt
