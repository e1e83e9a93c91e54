// Shared pieces of the [cuda] tests: skip without a GPU, seeded inputs, guarded outputs, CPU comparisons.
// Every [cuda] test case starts with require_gpu(): without a usable device it prints why and exits with ctest's
// skip code (77), so the case shows as skipped, with its reason, and the suite stays green.
#pragma once

#include "core/rng.h"
#include "core/tensor.h"
#include "ops/devices.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>

namespace gt::test {

inline void require_gpu() {
  const CudaInfo info = query_cuda();
  if (info.devices.empty()) {
    std::printf("SKIPPED: no CUDA device: %s\n", info.problem.c_str());
    std::fflush(stdout);
    std::exit(77);
  }
}

/// The environment variable `name` set to `value` (unset for nullptr) while the object lives, then as it was: the
/// choices the CUDA ops read per call (GPUTRAIN_CUDNN_ATTENTION).
class ScopedEnvVar {
 public:
  ScopedEnvVar(const char* name, const char* value) : m_name(name) {
    if (const char* old = std::getenv(name)) m_old = old;
    put(name, value);
  }
  ~ScopedEnvVar() { put(m_name.c_str(), m_old ? m_old->c_str() : nullptr); }
  ScopedEnvVar(const ScopedEnvVar&) = delete;
  ScopedEnvVar& operator=(const ScopedEnvVar&) = delete;

 private:
  static void put(const char* name, const char* value) { value ? setenv(name, value, 1) : unsetenv(name); }
  std::string m_name;
  std::optional<std::string> m_old;
};

inline constexpr int64_t kGuard = 64;        ///< sentinel elements on each side of a CUDA output
inline constexpr float kSentinel = 1234.5f;  ///< a value no kernel here produces by accident

/// A CUDA tensor of `shape` (f32 or f64) inside a buffer with sentinels on both sides; kernels see `inner`.
template <class T>
struct GuardedT {
  static constexpr DType kType = std::is_same_v<T, float> ? DType::f32 : DType::f64;
  Tensor outer, inner;
  explicit GuardedT(const Shape& shape, T fill = kSentinel) {
    const int64_t n = shape.numel();
    outer = Tensor::empty(Shape{n + 2 * kGuard}, kType, Device::cuda(0));
    Tensor host = Tensor::empty(outer.shape(), kType);
    for (int64_t i = 0; i < host.numel(); ++i) host.data<T>()[i] = kSentinel;
    for (int64_t i = 0; i < n; ++i) host.data<T>()[kGuard + i] = fill;
    outer.copy_from(host);
    inner = outer.slice0(kGuard, n).view(shape);
  }
  /// Copies back; fails on a touched sentinel or, unless allowed, a non-finite value inside.
  Tensor host_checked(bool allow_nonfinite = false) const {
    Tensor host = Tensor::empty(outer.shape(), kType);
    host.copy_from(outer);
    const int64_t n = inner.numel();
    for (int64_t i = 0; i < kGuard; ++i) {
      INFO("sentinel " << i << " before / after the output");
      REQUIRE(host.data<T>()[i] == static_cast<T>(kSentinel));
      REQUIRE(host.data<T>()[kGuard + n + i] == static_cast<T>(kSentinel));
    }
    if (!allow_nonfinite)
      for (int64_t i = 0; i < n; ++i) REQUIRE(std::isfinite(host.data<T>()[kGuard + i]));
    return host.slice0(kGuard, n).view(inner.shape());
  }
};
using Guarded = GuardedT<float>;
using Guarded64 = GuardedT<double>;

/// f32 host tensor with uniform values in [lo, hi), reproducible from `seed`.
inline Tensor seeded(const Shape& shape, uint64_t seed, double lo = -4, double hi = 4) {
  Tensor t = Tensor::empty(shape, DType::f32);
  Rng rng(seed, 0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng.uniform(lo, hi));
  return t;
}

/// An f32 host tensor in T (a copy when T is double).
template <class T>
Tensor as(const Tensor& f32) {
  if constexpr (std::is_same_v<T, float>) {
    return f32;
  } else {
    Tensor t = Tensor::empty(f32.shape(), DType::f64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = f32.data<float>()[i];
    return t;
  }
}

inline Tensor to_cuda(const Tensor& host) {
  Tensor d = Tensor::empty(host.shape(), host.dtype(), Device::cuda(0));
  d.copy_from(host);
  return d;
}

inline Tensor to_host(const Tensor& dev) {
  Tensor h = Tensor::empty(dev.shape(), dev.dtype());
  h.copy_from(dev);
  return h;
}

/// |cuda − cpu| ≤ atol + rtol·|cpu| element by element (f32 or f64 tensors of the same dtype).
inline void check_close(const Tensor& cuda_host, const Tensor& cpu, double atol, double rtol) {
  REQUIRE(cuda_host.numel() == cpu.numel());
  REQUIRE(cuda_host.dtype() == cpu.dtype());
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double a = cuda_host.dtype() == DType::f64 ? cuda_host.data<double>()[i] : cuda_host.data<float>()[i];
    const double b = cpu.dtype() == DType::f64 ? cpu.data<double>()[i] : cpu.data<float>()[i];
    INFO("element " << i << ": cuda " << a << " cpu " << b);
    REQUIRE(std::abs(a - b) <= atol + rtol * std::abs(b));
  }
}

}  // namespace gt::test
