// Loader threads: a ring of batch slots filled ahead of the trainer by threads that share nothing mutable but the
// ring's bookkeeping (under one mutex).
#include "data/prefetcher.h"

#include "core/error.h"

#include <pthread.h>

#include <csignal>
#include <string>

namespace gt {

Prefetcher::Prefetcher(const Loader& loader, const Dataset& data, int64_t batch, int workers, int slots, bool pinned)
    : m_loader(loader) {
  GT_CHECK(workers >= 1 && slots >= 1, "prefetcher: {} threads, {} slots", workers, slots);
  const Shape xs = data.input_shape().batched(batch), ys = data.target_shape().batched(batch);
  for (int i = 0; i < slots; ++i) {
    Slot s;
    s.x = pinned ? Tensor::empty_pinned(xs, DType::f32) : Tensor::empty(xs, DType::f32);
    s.y = pinned ? Tensor::empty_pinned(ys, data.target_dtype()) : Tensor::empty(ys, data.target_dtype());
    m_slots.push_back(std::move(s));
  }
  m_entries.resize(m_slots.size());
  m_head = m_next = {loader.epoch(), loader.position(), loader.order()};
  // The threads inherit a mask that blocks every signal, so SIGINT and SIGTERM reach the trainer's thread.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  try {
    for (int i = 0; i < workers; ++i) {
      m_threads.emplace_back([this] { work(); });
      pthread_setname_np(m_threads.back().native_handle(), ("gt-loader-" + std::to_string(i)).substr(0, 15).c_str());
    }
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    {
      std::lock_guard lock(m_mutex);
      m_stop = true;
    }
    m_changed.notify_all();
    for (std::thread& t : m_threads) t.join();
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard lock(m_mutex);
    m_stop = true;
  }
  m_changed.notify_all();
  for (std::thread& t : m_threads) t.join();
}

Prefetcher::Job Prefetcher::after(Job job) const {
  job.position += m_loader.stride();
  if (m_loader.has_batch(job.position)) return job;
  ++job.epoch;
  job.position = 0;
  job.order.reset();  // drawn by whoever hands out that batch (m_head needs none)
  return job;
}

void Prefetcher::work() {
  const auto slots = static_cast<int64_t>(m_slots.size());
  std::unique_lock lock(m_mutex);
  for (;;) {
    // Batch m_next_seq may be filled once its slot's previous batch (number m_next_seq - slots) was released.
    m_changed.wait(lock, [&] { return m_stop || (!m_pause && !m_failed && m_next_seq < m_taken_seq + slots); });
    if (m_stop) return;
    Job job = m_next;
    if (!job.order) job.order = m_loader.order_of(job.epoch);  // the first batch of a new epoch: its order, once
    const int64_t seq = m_next_seq++, generation = m_generation;
    m_next = after(job);
    if (m_next.epoch == job.epoch) m_next.order = job.order;
    if (!m_loader.has_batch(0)) m_failed = true;  // no batch in any epoch: nothing more to hand out
    ++m_busy;
    lock.unlock();
    Slot& slot = m_slots[static_cast<size_t>(seq % slots)];
    int64_t n = 0;
    std::exception_ptr error;
    try {
      n = m_loader.fill(*job.order, job.epoch, job.position, slot.x, slot.y);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    --m_busy;
    if (generation == m_generation) {
      Entry& e = m_entries[static_cast<size_t>(seq % slots)];
      e.ready = true;
      e.n = n;
      e.error = error;
      if (error) m_failed = true;
    }
    m_changed.notify_all();
  }
}

// Drops the ring and starts it over at the loader's batch.
void Prefetcher::restart(const Loader& loader) {
  std::unique_lock lock(m_mutex);
  ++m_generation;
  m_pause = true;
  m_changed.wait(lock, [&] { return m_busy == 0; });  // no thread writes a slot any more
  for (Entry& e : m_entries) e = {};
  m_head = m_next = {loader.epoch(), loader.position(), loader.order()};
  m_next_seq = m_taken_seq;
  m_pause = false;
  m_failed = false;
  lock.unlock();
  m_changed.notify_all();
}

int64_t Prefetcher::take(const Loader& loader, Slot*& slot) {
  GT_CHECK(&loader == &m_loader, "prefetcher: a take from another loader");
  if (m_held) release();
  slot = nullptr;
  if (!loader.has_batch(loader.position())) return 0;
  bool same = false;
  {
    std::lock_guard lock(m_mutex);
    same = m_head.epoch == loader.epoch() && m_head.position == loader.position();
  }
  if (!same) restart(loader);
  const auto i = static_cast<size_t>(m_taken_seq % static_cast<int64_t>(m_slots.size()));
  std::unique_lock lock(m_mutex);
  m_changed.wait(lock, [&] { return m_entries[i].ready; });
  // The error stays in the slot: another take of this batch rethrows it again instead of waiting forever.
  if (m_entries[i].error) std::rethrow_exception(m_entries[i].error);
  m_held = true;
  slot = &m_slots[i];
  return m_entries[i].n;
}

void Prefetcher::release() {
  {
    std::lock_guard lock(m_mutex);
    if (!m_held) return;
    m_held = false;
    m_entries[static_cast<size_t>(m_taken_seq % static_cast<int64_t>(m_slots.size()))] = {};
    ++m_taken_seq;
    m_head = after(m_head);
  }
  m_changed.notify_all();
}

}  // namespace gt
