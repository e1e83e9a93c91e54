// Per-device streams, library handles and workspaces, created on first use and kept for the process's life, and
// the counters of the library ops' plan caches (dnn_common.h).
#include "ops/cuda/context.h"

#include "core/error.h"
#include "ops/cuda/allocator.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dnn_common.h"
#include "ops/cuda_context.h"

#include <array>
#include <atomic>
#include <memory>
#include <mutex>

namespace gt::cuda {
namespace {

constexpr int kMaxDevices = 64;

struct DeviceContext {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  cudnnHandle_t cudnn = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  ReduceScratch reduce;
};

std::mutex g_mutex;
std::array<std::unique_ptr<DeviceContext>, kMaxDevices> g_contexts;

// The device's context with its stream made; `device` is current on return.
DeviceContext& context(int device) {
  GT_CHECK(g_device_hooks_installed, "the CUDA device hooks of core/backend.h are not installed");
  GT_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index {}", device);
  GT_CHECK_CUDA(cudaSetDevice(device));
  std::lock_guard lock(g_mutex);
  auto& c = g_contexts[static_cast<size_t>(device)];
  if (!c) {
    auto made = std::make_unique<DeviceContext>();
    GT_CHECK_CUDA(cudaStreamCreate(&made->stream));
    ReduceScratch& r = made->reduce;
    GT_CHECK_CUDA(cudaMalloc(&r.partials, sizeof(double) * ReduceScratch::kBlocks * ReduceScratch::kValues));
    GT_CHECK_CUDA(cudaMalloc(&r.ticket, sizeof *r.ticket));
    GT_CHECK_CUDA(cudaMemset(r.ticket, 0, sizeof *r.ticket));
    c = std::move(made);
  }
  return *c;
}

}  // namespace

cudaStream_t stream(int device) { return context(device).stream; }

void* compute_stream(int device) { return stream(device); }

ReduceScratch reduce_scratch(int device) { return context(device).reduce; }

cublasLtHandle_t lt_handle(int device) {
  DeviceContext& c = context(device);
  if (!c.lt) GT_CHECK_CUBLAS(cublasLtCreate(&c.lt));
  return c.lt;
}

cudnnHandle_t cudnn_handle(int device) {
  DeviceContext& c = context(device);
  if (!c.cudnn) {
    GT_CHECK_CUDNN(cudnnCreate(&c.cudnn));
    GT_CHECK_CUDNN(cudnnSetStream(c.cudnn, c.stream));
  }
  return c.cudnn;
}

void* workspace(int device, size_t bytes) {
  DeviceContext& c = context(device);
  if (bytes > c.workspace_bytes) {
    // The old buffer may still be read by queued work; the caching allocator hands it out again only to later
    // work on the same stream, which runs after it.
    if (c.workspace) device_free(device, c.workspace);
    c.workspace = nullptr;
    c.workspace_bytes = 0;
    c.workspace = device_alloc(device, bytes);
    c.workspace_bytes = bytes;
  }
  return c.workspace;
}

namespace dnn {
namespace {

std::atomic<int64_t> g_plan_counts[5];

}  // namespace

void count_plan(PlanFamily family) { ++g_plan_counts[static_cast<int>(family)]; }

}  // namespace dnn

DnnPlanCounts dnn_plan_counts() {
  using dnn::g_plan_counts;
  return {g_plan_counts[0].load(), g_plan_counts[1].load(), g_plan_counts[2].load(), g_plan_counts[3].load(),
          g_plan_counts[4].load()};
}

}  // namespace gt::cuda
