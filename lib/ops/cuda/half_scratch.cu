// 16-bit scratch for the CUDA half products (ops/cuda/half_scratch.h).
#include "ops/cuda/half_scratch.h"

#include "ops/cuda/allocator.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>
#include <type_traits>

namespace gt::cuda {
namespace {

using namespace kern;

constexpr int kThreads = 256;

// out[i] = in[i] rounded to nearest even in the 16-bit type H (__nv_bfloat16 or __half).
template <class H>
__global__ void to_half_kernel(const float* __restrict__ in, H* __restrict__ out, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    if constexpr (std::is_same_v<H, __nv_bfloat16>)
      out[i] = __float2bfloat16_rn(in[i]);
    else
      out[i] = __float2half_rn(in[i]);
  }
}

template <class H>
__global__ void from_half_kernel(const H* __restrict__ in, float* __restrict__ out, int64_t n, float beta) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    float v;
    if constexpr (std::is_same_v<H, __nv_bfloat16>)
      v = __bfloat162float(in[i]);
    else
      v = __half2float(in[i]);
    out[i] = beta != 0 ? v + beta * out[i] : v;
  }
}

// A weight's 16-bit copy on its device (half_weight): the block is kept while the weight keeps its size and device.
struct DeviceCopy {
  std::unique_ptr<HalfBuffer> buffer;
  int64_t numel = 0;
  int device = -1;
};
thread_local ScopeCopies<DeviceCopy> t_weights;

}  // namespace

const void* half_weight(const Tensor& w, HalfFormat format) {
  GT_CHECK(product_scope() != 0, "a 16-bit weight copy outside a ProductPrecisionScope");
  const int device = w.device().index;
  return t_weights
      .get(w.raw(), w.numel(), format,
           [&](DeviceCopy& copy) {
             if (!copy.buffer || copy.numel != w.numel() || copy.device != device) {
               copy.buffer.reset();  // give the old block back before taking the new one
               copy.buffer = std::make_unique<HalfBuffer>(device, w.numel());
               copy.numel = w.numel();
               copy.device = device;
             }
             f32_to_half(device, format, static_cast<const float*>(w.raw()), copy.buffer->get(), w.numel());
           })
      .buffer->get();
}

const void* find_half_weight(const Tensor& t, HalfFormat format) {
  const DeviceCopy* copy = t_weights.find(t.raw(), t.numel(), format);
  return copy && copy->device == t.device().index ? copy->buffer->get() : nullptr;
}

HalfWeightCacheStats half_weight_cache_stats() {
  HalfWeightCacheStats s;
  t_weights.for_each([&](const DeviceCopy& copy) {
    ++s.entries;
    s.bytes += static_cast<size_t>(copy.numel) * 2;
  });
  s.roundings = t_weights.makes();
  s.reuses = t_weights.reuses();
  return s;
}

HalfBuffer::HalfBuffer(int device, int64_t n)
    : m_device(device), m_ptr(n > 0 ? device_alloc(device, static_cast<size_t>(n) * 2) : nullptr) {}

HalfBuffer::~HalfBuffer() {
  if (m_ptr) device_free(m_device, m_ptr);
}

namespace {
thread_local int64_t t_operand_copies = 0;
}  // namespace

HalfOperand::HalfOperand(const Tensor& t, HalfFormat format) : HalfBuffer(t.device().index, t.numel()) {
  f32_to_half(t.device().index, format, static_cast<const float*>(t.raw()), get(), t.numel());
  ++t_operand_copies;
}

int64_t half_operand_copies() { return t_operand_copies; }

void f32_to_half(int device, HalfFormat format, const float* in, void* out, int64_t n) {
  if (n == 0) return;
  const cudaStream_t s = stream(device);
  if (format == HalfFormat::bf16)
    to_half_kernel<__nv_bfloat16><<<grid_for(n, kThreads), kThreads, 0, s>>>(in, static_cast<__nv_bfloat16*>(out), n);
  else
    to_half_kernel<__half><<<grid_for(n, kThreads), kThreads, 0, s>>>(in, static_cast<__half*>(out), n);
  GT_CHECK_LAUNCH();
}

void half_to_f32(int device, HalfFormat format, const void* in, float* out, int64_t n, float beta) {
  if (n == 0) return;
  const cudaStream_t s = stream(device);
  if (format == HalfFormat::bf16)
    from_half_kernel<__nv_bfloat16>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(in), out, n, beta);
  else
    from_half_kernel<__half><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const __half*>(in), out, n, beta);
  GT_CHECK_LAUNCH();
}

}  // namespace gt::cuda
