// cuBLASLt's epilogues for the CUDA dense layer (ops/cuda/matmul.cu) against the CPU's ops on the same seeded
// inputs: linear_forward's bias (CUBLASLT_EPILOGUE_BIAS), with sentinels around every output. Without a usable GPU
// every case exits with ctest's skip code (77) after printing why.
//
// Tolerances. An output is a sum of K products |x·w| ≤ 16 (inputs in [-4, 4)) plus the bias: the two sides add the
// same terms in different orders, and, as in test_cuda_dnn.cpp, |Δ| ≤ 1e-5 · K · 16 in f32 (≥ 10× what such sums
// show, far below the ≈ 16/3 a missing, doubled or misplaced term costs) and 1e-13 · K · 16 in f64; the bias adds
// one rounding of a value ≤ 4 + |sum|, inside that. Under tf32 the tensor cores round both operands to 10 mantissa
// bits and the CPU multiplies in fp32: up to 2·2⁻¹¹ of each term, K · 16 · 2⁻¹⁰. Under bf16 and fp16 both sides
// multiply the same rounded operands exactly and sum in f32: the f32 bound.
#include "cuda_helpers.h"
#include "ops/matmul.h"
#include "ops/precision.h"

#include <limits>
#include <optional>
#include <string>
#include <type_traits>

using namespace gt;
using namespace gt::test;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

template <class T>
constexpr DType kDType = std::is_same_v<T, float> ? DType::f32 : DType::f64;

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

/// The product's tolerance for K terms (file comment) in T and the product precision p.
template <class T>
double product_tol(int64_t k, std::optional<Precision> p) {
  const double per_term = std::is_same_v<T, double> ? 1e-13 : p == Precision::tf32 ? 0x1p-10 : 1e-5;
  return per_term * static_cast<double>(k) * 16;
}

std::string precision_name(std::optional<Precision> p) { return p ? to_string(*p) : std::string("fp32"); }

/// Rows × in inputs, out × in weights: dims off multiples of 8 and 16 (45, 29, 37), on them (64, 48, 32), tiny ones.
struct Dims {
  int64_t rows, in, out;
};
constexpr Dims kDims[] = {{37, 29, 45}, {64, 32, 48}, {5, 7, 3}};

/// An optional ProductPrecisionScope.
struct MaybeScope {
  explicit MaybeScope(std::optional<Precision> p) {
    if (p) scope.emplace(*p);
  }
  std::optional<ProductPrecisionScope> scope;
};

template <class T>
void check_linear_forward(const Dims& d, bool with_bias, std::optional<Precision> p, uint64_t seed) {
  INFO("linear_forward rows " << d.rows << " in " << d.in << " out " << d.out << (with_bias ? " bias" : " no bias")
                              << " " << (std::is_same_v<T, double> ? "f64" : precision_name(p).c_str()));
  const Tensor x = as<T>(seeded(Shape{d.rows, d.in}, seed)), w = as<T>(seeded(Shape{d.out, d.in}, seed + 1));
  const Tensor bias = with_bias ? as<T>(seeded(Shape{d.out}, seed + 2)) : Tensor();
  Tensor cpu = Tensor::empty(Shape{d.rows, d.out}, kDType<T>);
  GuardedT<T> y(Shape{d.rows, d.out}, kNaN);  // y is written, never read: NaN would show
  {
    const MaybeScope scope(p);
    ops::linear_forward(x, w, bias, cpu);
    ops::linear_forward(to_cuda(x), to_cuda(w), with_bias ? to_cuda(bias) : Tensor(), y.inner);
  }
  check_close(y.host_checked(), cpu, product_tol<T>(d.in, p), 0);
}

}  // namespace

TEST_CASE("CUDA linear_forward with its bias in cuBLASLt's epilogue matches the CPU in f32, f64, tf32, bf16, fp16",
          "[cuda]") {
  require_gpu();
  uint64_t seed = 7000;
  for (const Dims& d : kDims)
    for (const bool with_bias : {true, false}) {
      for (const std::optional<Precision> p : {std::optional<Precision>{}, std::optional{Precision::tf32},
                                               std::optional{Precision::bf16}, std::optional{Precision::fp16}})
        check_linear_forward<float>(d, with_bias, p, seed += 3);
      check_linear_forward<double>(d, with_bias, std::nullopt, seed += 3);
    }
}
