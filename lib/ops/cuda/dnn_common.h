// What the cuBLASLt- and cuDNN-backed ops (matmul.cu, conv2d.cpp, pool2d.cpp, batchnorm.cu, attention_cudnn.cpp) share:
// owned library descriptors, host scalars of the type the libraries read, the dtype mapping, 32-bit dimension checks
// and the per-shape plan cache.
#pragma once

#include "core/error.h"
#include "core/noncopyable.h"
#include "core/tensor.h"
#include "ops/cuda/cuda_check.h"

#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace gt::cuda::dnn {

/// Owns a library handle created through out() and destroys it with `Destroy`. Plans are kept for the process's
/// life, so this matters only when making a plan fails half-way.
template <class T, auto Destroy>
class Owned : NonCopyable {
 public:
  Owned() = default;
  ~Owned() {
    if (m_handle) (void)Destroy(m_handle);
  }
  T get() const { return m_handle; }
  /// Where a Create function writes the new handle.
  T* out() { return &m_handle; }

 private:
  T m_handle = nullptr;
};

using TensorDesc = Owned<cudnnTensorDescriptor_t, &cudnnDestroyTensorDescriptor>;
using FilterDesc = Owned<cudnnFilterDescriptor_t, &cudnnDestroyFilterDescriptor>;
using ConvDesc = Owned<cudnnConvolutionDescriptor_t, &cudnnDestroyConvolutionDescriptor>;
using PoolDesc = Owned<cudnnPoolingDescriptor_t, &cudnnDestroyPoolingDescriptor>;
using LtMatmulDesc = Owned<cublasLtMatmulDesc_t, &cublasLtMatmulDescDestroy>;
using LtLayout = Owned<cublasLtMatrixLayout_t, &cublasLtMatrixLayoutDestroy>;
using LtPreference = Owned<cublasLtMatmulPreference_t, &cublasLtMatmulPreferenceDestroy>;

/// A host scaling factor (alpha, beta) in the type the libraries read it as: double for f64 data, float for f32.
/// Keep it in a named variable for the duration of the call that reads it.
class HostScalar {
 public:
  HostScalar(double value, bool is_double) : m_f(static_cast<float>(value)), m_d(value), m_is_double(is_double) {}
  const void* ptr() const { return m_is_double ? static_cast<const void*>(&m_d) : static_cast<const void*>(&m_f); }

 private:
  float m_f;
  double m_d;
  bool m_is_double;
};

inline bool is_f64(const Tensor& t) { return t.dtype() == DType::f64; }

inline cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::i32:
    case DType::bf16:
    case DType::f16: break;
  }
  throw Error(fmt::format("cuDNN ops take f32 or f64 tensors, got {}", dtype_name(t)));
}

/// cuDNN's legacy descriptors take int dimensions and strides: a tensor must have fewer than 2³¹ elements.
inline int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw Error(fmt::format("{} = {} does not fit cuDNN's 32-bit dimensions; use a smaller batch", what, v));
  return static_cast<int>(v);
}
inline void check_numel(const Tensor& t, const char* what) {
  if (t.numel() > INT_MAX)
    throw Error(fmt::format("{} {} has {} elements, more than cuDNN's 32-bit strides allow; use a smaller batch", what,
                            t.shape().str(), t.numel()));
}

/// An NCHW tensor descriptor of the given extents.
inline void set_4d(TensorDesc& d, cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w) {
  GT_CHECK_CUDNN(cudnnCreateTensorDescriptor(d.out()));
  GT_CHECK_CUDNN(cudnnSetTensor4dDescriptor(d.get(), CUDNN_TENSOR_NCHW, type, to_int(n, "batch"), to_int(c, "channels"),
                                            to_int(h, "height"), to_int(w, "width")));
}

/// The op families whose plans are counted (dnn_plan_counts).
enum class PlanFamily { matmul, conv, pool, batchnorm, attention };
void count_plan(PlanFamily family);

/// Plans by shape key, made once by `make` on the first call with a key and kept for the process. Lookups take a
/// mutex: one process may drive several devices from several threads.
template <size_t N, class Plan>
class PlanCache {
 public:
  using Key = std::array<int64_t, N>;
  template <class Make>
  const Plan& get(const Key& key, PlanFamily family, Make&& make) {
    std::lock_guard lock(m_mutex);
    if (const auto it = m_plans.find(key); it != m_plans.end()) return *it->second;
    std::unique_ptr<Plan> plan = make();
    count_plan(family);
    return *m_plans.emplace(key, std::move(plan)).first->second;
  }

 private:
  std::mutex m_mutex;
  std::map<Key, std::unique_ptr<Plan>> m_plans;
};

}  // namespace gt::cuda::dnn

namespace gt::cuda {

/// How many plans each op family has made (a plan is made on a cache miss: a shape not seen before). Tests use it
/// to check that a second call with the same shape reuses the plan.
struct DnnPlanCounts {
  int64_t matmul = 0, conv = 0, pool = 0, batchnorm = 0, attention = 0;
};
DnnPlanCounts dnn_plan_counts();

}  // namespace gt::cuda
