// The caching device allocator (allocator.h): exact size classes, one free list per class and device.
#include "ops/cuda/allocator.h"

#include "core/backend.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"

#include <array>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace gt::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kSmallStep = 512, kSmallLimit = size_t{1} << 20, kLargeStep = size_t{2} << 20;

struct Pool {
  std::map<size_t, std::vector<void*>> free;  // size class → cached blocks
  std::unordered_map<void*, size_t> live;     // block → its size class
  MemoryStats stats;
  // The graph pool (allocator.h): the blocks a captured graph may touch, and those of them free now.
  std::unordered_set<void*> graph_owned;
  std::map<size_t, std::vector<void*>> graph_free;
  size_t graph_bytes = 0;
  bool capturing = false;
};

// A cached block of `size` from `from`, or null.
void* take_cached(std::map<size_t, std::vector<void*>>& from, size_t size) {
  const auto it = from.find(size);
  if (it == from.end() || it->second.empty()) return nullptr;
  void* block = it->second.back();
  it->second.pop_back();
  return block;
}

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
  // Inside a capture the graph pool's free blocks come first; a block taken from the general cache or the driver
  // joins the pool.
  void* block = p.capturing ? take_cached(p.graph_free, size) : nullptr;
  const bool from_graph_pool = block != nullptr;
  if (!block) block = take_cached(p.free, size);
  if (!block) {
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
  if (p.capturing && !from_graph_pool && p.graph_owned.insert(block).second) p.graph_bytes += size;
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
  (p.graph_owned.contains(ptr) ? p.graph_free : p.free)[it->second].push_back(ptr);
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

void begin_graph_pool(int device) {
  std::lock_guard lock(g_mutex);
  Pool& p = pool(device);
  // What the graph may read or write besides its own temporaries: everything live now (parameters, gradients,
  // optimizer state, the batch tensors, the layers' buffers, the library workspace).
  for (const auto& [block, size] : p.live)
    if (p.graph_owned.insert(block).second) p.graph_bytes += size;
  p.capturing = true;
}

void end_graph_pool(int device) {
  std::lock_guard lock(g_mutex);
  pool(device).capturing = false;
}

void release_graph_pool(int device) {
  std::lock_guard lock(g_mutex);
  Pool& p = pool(device);
  for (auto& [size, blocks] : p.graph_free) p.free[size].insert(p.free[size].end(), blocks.begin(), blocks.end());
  p.graph_free.clear();
  p.graph_owned.clear();
  p.graph_bytes = 0;
  p.capturing = false;
}

size_t graph_pool_bytes(int device) {
  std::lock_guard lock(g_mutex);
  return pool(device).graph_bytes;
}

}  // namespace gt::cuda
