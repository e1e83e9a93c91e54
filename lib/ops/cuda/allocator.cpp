// The caching device allocator (allocator.h): exact size classes, one free list per class and device.
#include "ops/cuda/allocator.h"

#include "core/backend.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"

#include <array>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace gt::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kSmallStep = 512, kSmallLimit = size_t{1} << 20, kLargeStep = size_t{2} << 20;

struct Pool {
  std::map<size_t, std::vector<void*>> free;  // size class → cached blocks
  std::unordered_map<void*, size_t> live;     // block → its size class
  MemoryStats stats;
};

std::mutex g_mutex;
std::array<Pool, kMaxDevices> g_pools;

Pool& pool(int device) {
  GT_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index {}", device);
  return g_pools[static_cast<size_t>(device)];
}

void release_locked(Pool& p) {
  for (auto& [size, blocks] : p.free)
    for (void* b : blocks) {
      cudaFree(b);
      p.stats.reserved -= size;
    }
  p.free.clear();
}

std::string mib(size_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

size_t round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t step = bytes <= kSmallLimit ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

void* device_alloc(int device, size_t bytes) {
  const size_t size = round_size(bytes);
  std::lock_guard lock(g_mutex);
  Pool& p = pool(device);
  void* block = nullptr;
  if (auto it = p.free.find(size); it != p.free.end() && !it->second.empty()) {
    block = it->second.back();
    it->second.pop_back();
  } else {
    GT_CHECK_CUDA(cudaSetDevice(device));
    cudaError_t status = cudaMalloc(&block, size);
    if (status == cudaErrorMemoryAllocation) {  // cached blocks of other sizes may make room
      cudaGetLastError();
      release_locked(p);
      status = cudaMalloc(&block, size);
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error(
          fmt::format("out of memory on cuda:{} allocating {} for {}: {} in use by tensors (peak {}), "
                      "{} of {} free on the device ({})",
                      device, mib(size), AllocLabel::current(), mib(p.stats.in_use), mib(p.stats.peak), mib(free_b),
                      mib(total_b), cudaGetErrorString(status)));
    }
    p.stats.reserved += size;
    ++p.stats.allocations;
  }
  p.live.emplace(block, size);
  p.stats.in_use += size;
  p.stats.peak = std::max(p.stats.peak, p.stats.in_use);
  return block;
}

void device_free(int device, void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(g_mutex);
  Pool& p = pool(device);
  const auto it = p.live.find(ptr);
  if (it == p.live.end()) return;  // not ours: never happens, and a destructor must not throw
  p.stats.in_use -= it->second;
  p.free[it->second].push_back(ptr);
  p.live.erase(it);
}

MemoryStats memory_stats(int device) {
  std::lock_guard lock(g_mutex);
  return pool(device).stats;
}

void release_cached(int device) {
  std::lock_guard lock(g_mutex);
  if (cudaSetDevice(device) == cudaSuccess) release_locked(pool(device));
}

}  // namespace gt::cuda
