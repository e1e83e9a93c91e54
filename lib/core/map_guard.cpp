// The SIGBUS handler of guarded mappings: a fixed table of slots, read by the handler without locks (a slot is
// published by storing its start last, withdrawn by clearing it first).
#include "core/map_guard.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace gt {
namespace {

struct Slot {
  std::atomic<uintptr_t> start{0};
  size_t bytes = 0;
  char path[512] = {};
};
constexpr size_t kSlots = 256;
Slot g_slots[kSlots];
std::mutex g_change;  // guard and unguard from any thread, one at a time

void write_all(const char* text, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

extern "C" void on_sigbus(int sig, siginfo_t* info, void*) {
  const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const Slot& s : g_slots) {
    const uintptr_t start = s.start.load(std::memory_order_acquire);
    if (start == 0 || at < start || at - start >= s.bytes) continue;
    static const char head[] = "\nerror: ";
    static const char tail[] =
        ": the file was cut short while this run read it (a memory-mapped input truncated or rewritten in place); "
        "the run stops here, its last complete checkpoint kept\n";
    write_all(head, sizeof head - 1);
    write_all(s.path, ::strnlen(s.path, sizeof s.path));
    write_all(tail, sizeof tail - 1);
    ::_exit(1);
  }
  // Not ours: the default action, when the faulting access runs again.
  ::signal(sig, SIG_DFL);
}

void install_once() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, nullptr);
    return true;
  }();
  (void)installed;
}

}  // namespace

void guard_mapping(const void* addr, size_t bytes, const std::string& path) {
  if (!addr || bytes == 0) return;
  const std::lock_guard lock(g_change);
  install_once();
  for (Slot& s : g_slots) {
    if (s.start.load(std::memory_order_relaxed) != 0) continue;
    s.bytes = bytes;
    const size_t n = std::min(path.size(), sizeof s.path - 1);
    std::memcpy(s.path, path.data(), n);
    s.path[n] = '\0';
    s.start.store(reinterpret_cast<uintptr_t>(addr), std::memory_order_release);
    return;
  }
}

void unguard_mapping(const void* addr) {
  const std::lock_guard lock(g_change);
  for (Slot& s : g_slots)
    if (s.start.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(addr))
      s.start.store(0, std::memory_order_release);
}

}  // namespace gt
