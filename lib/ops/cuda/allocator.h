// The caching device allocator: device memory is taken from the driver in rounded size classes and, once freed,
// kept for reuse, so the training step never calls cudaMalloc or cudaFree. All work runs on one stream per device
// (context.h), so a block freed on the host may be handed out again at once: the stream orders its old and new uses.
#pragma once

#include <cstddef>
#include <string>

namespace gt::cuda {

struct MemoryStats {
  size_t in_use = 0;       ///< bytes of live tensors (rounded to their size class)
  size_t peak = 0;         ///< the most in_use has been
  size_t reserved = 0;     ///< bytes held from the driver, cached or in use
  size_t allocations = 0;  ///< cudaMalloc calls made
};

/// The size class of a request: 512-byte steps up to 1 MiB, 2 MiB steps above.
size_t round_size(size_t bytes);
void* device_alloc(int device, size_t bytes);
void device_free(int device, void* ptr);
MemoryStats memory_stats(int device);
/// Gives every cached block back to the driver (tests; a run ends with everything freed anyway).
void release_cached(int device);

/// CUDA graphs (train.cuda_graphs): a replayed graph reads and writes the blocks its capture saw, whatever the host
/// has freed since, so those blocks must never go to another tensor outside a capture. From begin_graph_pool on,
/// every block live then and every block handed out until end_graph_pool belongs to the device's graph pool for
/// good: freed, it goes back to that pool, whose blocks are handed out again only inside a later capture (on the
/// one compute stream, so in stream order, as the graph runs them). Outside a capture everything else is as before.
void begin_graph_pool(int device);
void end_graph_pool(int device);
/// The graph is gone (destroyed, or its capture abandoned): its blocks are ordinary again, the free ones back in the
/// general cache (work a last replay queued still runs first, in stream order). One graph per device at a time.
void release_graph_pool(int device);
/// Blocks (and bytes) the graph pool of `device` holds, in use or free.
size_t graph_pool_bytes(int device);

}  // namespace gt::cuda
