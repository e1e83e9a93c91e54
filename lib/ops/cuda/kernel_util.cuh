// Pieces the CUDA kernels share: the element-type switch, grid sizes and warp/block reductions, and the dtype check
// of the tensor entry points. nvcc only.
#pragma once

#include "core/tensor.h"
#include "ops/cuda/context.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace gt::cuda {

/// The kernels take f32 or f64 (like the CPU's for_float_type); says whether the tensor is f64.
inline bool is_f64(const char* op, const Tensor& t) {
  GT_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, "{} on CUDA takes f32 or f64 tensors, got {}", op,
           dtype_name(t.dtype()));
  return t.dtype() == DType::f64;
}

/// A kernel's pointer to an optional tensor: null when it is undefined.
inline void* raw_or_null(const Tensor& t) { return t.defined() ? t.raw() : nullptr; }

}  // namespace gt::cuda

namespace gt::cuda::kern {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

/// Calls f(float{}) or f(double{}): every pointer of a launch has the one element type.
template <class F>
void with_float_type(bool is_double, F&& f) {
  if (is_double)
    f(double{});
  else
    f(float{});
}

/// Kernels that take 16-bit activations (Model::set_activation_dtype) store them as S = __nv_bfloat16 or __half and
/// compute on them in float: load() widens exactly, store() rounds once to nearest even (NaN stays NaN), as the CPU's
/// ops/wide.h path does. For float and double both are the identity, so a kernel templated on its storage types runs
/// the f32 and f64 arithmetic it ran before.
template <class S>
inline constexpr bool is_half_storage = std::is_same_v<S, __nv_bfloat16> || std::is_same_v<S, __half>;
/// The type a kernel computes in for storage types S...: double where one is double, float otherwise.
template <class... S>
using compute_t = std::conditional_t<(std::is_same_v<S, double> || ...), double, float>;

template <class S>
__device__ __forceinline__ compute_t<S> load(S v) {
  if constexpr (std::is_same_v<S, __nv_bfloat16>)
    return __bfloat162float(v);
  else if constexpr (std::is_same_v<S, __half>)
    return __half2float(v);
  else
    return v;
}
template <class S, class C>
__device__ __forceinline__ S store(C v) {
  static_assert(std::is_same_v<C, float> || std::is_same_v<C, double>);
  if constexpr (std::is_same_v<S, __nv_bfloat16>)
    return __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<S, __half>)
    return __float2half_rn(static_cast<float>(v));
  else
    return static_cast<S>(v);
}

/// Calls f(S{}) with the storage type of an element-wise op's one dtype: f32, f64, bf16 or f16.
template <class F>
void with_storage(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::f16: f(__half{}); return;
    default: GT_CHECK(false, "{} on CUDA takes f32, f64, bf16 or f16 tensors, got {}", op, dtype_name(t));
  }
}

/// Calls f(X{}, Y{}) with the storage types of an op's two sets of activation tensors (an input and its gradient, an
/// output and its gradient): both f32 or both f64, or each f32 or one and the same 16-bit dtype (the parameters are
/// then f32). What the op layer routes here (ops/wide.h takes every other mix).
template <class F>
void with_storage_pair(const char* op, DType x, DType y, F&& f) {
  GT_CHECK(x == y || (is_half(x) && y == DType::f32) || (x == DType::f32 && is_half(y)),
           "{} on CUDA: activations of {} and {}", op, dtype_name(x), dtype_name(y));
  with_storage(op, x, [&](auto sx) {
    using X = decltype(sx);
    if constexpr (std::is_same_v<X, double>)
      f(double{}, double{});
    else if (y == DType::f32)
      f(X{}, float{});
    else if constexpr (is_half_storage<X>)
      f(X{}, X{});  // (y is x's 16-bit dtype: checked above)
    else if (y == DType::bf16)
      f(float{}, __nv_bfloat16{});
    else
      f(float{}, __half{});
  });
}

/// Blocks for a grid-stride loop over n elements, capped so that a huge tensor does not launch millions of blocks.
inline int grid_for(int64_t n, int threads, int64_t cap = 65535 * 4) {
  return static_cast<int>(std::clamp<int64_t>((n + threads - 1) / threads, 1, cap));
}

/// Threads for one block per row of length d: a multiple of the warp size, at most `cap`.
inline int row_threads(int64_t d, int cap = 256) {
  return static_cast<int>(std::clamp<int64_t>((d + kWarp - 1) / kWarp * kWarp, kWarp, cap));
}

/// The float (T of 4 bytes) or double whose bits are f32_bits or f64_bits.
template <class T>
__device__ __forceinline__ T from_bits(int f32_bits, long long f64_bits) {
  if constexpr (sizeof(T) == 4)
    return __int_as_float(f32_bits);
  else
    return __longlong_as_double(f64_bits);
}
/// +inf and a quiet NaN of T in device code (std::numeric_limits' members are host functions to nvcc).
template <class T>
__device__ __forceinline__ T infinity() {
  return from_bits<T>(0x7f800000, 0x7ff0000000000000LL);
}
template <class T>
__device__ __forceinline__ T quiet_nan() {
  return from_bits<T>(0x7fc00000, 0x7ff8000000000000LL);
}

__device__ __forceinline__ int64_t global_index() { return blockIdx.x * int64_t{blockDim.x} + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return int64_t{gridDim.x} * blockDim.x; }

/// Sum over the 32 lanes of a warp; every lane gets the total. All lanes must call it.
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total. Every thread of the
/// block must call it; it synchronises, so it may be called again right away.
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double part[kWarp];
  __shared__ double total;
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double s = lane < warps ? part[lane] : 0.0;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const double result = total;
  __syncthreads();  // the next call may overwrite part and total only after every thread has read them
  return result;
}

/// Maximum over the block (same rules as block_sum). NaNs are not ordered here: callers use the result only where
/// a NaN in the row makes the whole row NaN anyway.
template <class T>
__device__ __forceinline__ T block_max(T v) {
  __shared__ T part[kWarp];
  __shared__ T total;
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const T o = __shfl_xor_sync(kFullMask, v, offset);
    v = o > v ? o : v;
  }
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T m = lane < warps ? part[lane] : part[0];
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const T o = __shfl_xor_sync(kFullMask, m, offset);
      m = o > m ? o : m;
    }
    if (lane == 0) total = m;
  }
  __syncthreads();
  const T result = total;
  __syncthreads();
  return result;
}

/// Adds each block's values v[0..K) (thread 0's are used) to out[0..K) in block order: every block stores its values
/// in the scratch, and the last block to finish sums all of them — strided over its threads, then block_sum's fixed
/// tree — and adds the totals to out. The same bits on every run, where an atomicAdd from each block adds in whatever
/// order the blocks finish (a grad norm a few ulp apart between runs is a clip coefficient a few ulp apart, and then
/// weights that are). Every thread of every block must call it, once per launch; gridDim.x ≤ ReduceScratch::kBlocks,
/// K ≤ ReduceScratch::kValues. The ticket wraps back to 0 as the last block takes it, ready for the next launch.
template <int K>
__device__ void add_in_block_order(const double (&v)[K], double* out, ReduceScratch scratch) {
  static_assert(K >= 1 && K <= ReduceScratch::kValues);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    for (int k = 0; k < K; ++k) scratch.partials[k * ReduceScratch::kBlocks + blockIdx.x] = v[k];
    __threadfence();  // the values are visible to every block before this block's ticket is
    last = atomicInc(scratch.ticket, gridDim.x - 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;  // (the same for the whole block)
  __threadfence();
  for (int k = 0; k < K; ++k) {
    double acc = 0;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x)
      acc += __ldcg(scratch.partials + k * ReduceScratch::kBlocks + b);  // (from L2: not a stale L1 line)
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[k] += acc;
  }
}

}  // namespace gt::cuda::kern
