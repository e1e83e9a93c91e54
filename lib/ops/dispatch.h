// The checks every op makes before it runs (its operands on one device and of one dtype) and the call of the backend
// that owns that device: the helpers each family's dispatch (ops/<family>.cpp) is written with.
#pragma once

#include "core/tensor.h"

#include <initializer_list>

namespace gt::ops {

/// An op's operands, checked where the op starts: the defined tensors of `same_dtype` have one dtype, and they and
/// the defined tensors of `same_device` live on one device (undefined, optional tensors are skipped; with none
/// defined the device is the CPU). Keeps the op's name for its messages.
class Operands {
 public:
  Operands(const char* op, std::initializer_list<const Tensor*> same_dtype,
           std::initializer_list<const Tensor*> same_device = {});
  /// For operands that are not a list of tensors (a TensorGroup): the device they were found on.
  Operands(const char* op, Device device) : m_op(op), m_device(device) {}

  const char* op() const { return m_op; }
  Device device() const { return m_device; }
  /// Throws: the device is not the CPU and this build has no backend for it (GT_DISPATCH in a build without CUDA).
  [[noreturn]] void no_backend() const;

 private:
  const char* m_op;
  Device m_device;
};

}  // namespace gt::ops

/// Calls the backend entry point of the operands' device: GT_DISPATCH(op, matmul(a, b, c)) runs cpu::matmul(a, b, c)
/// on the CPU and cuda::matmul(a, b, c) on a CUDA device. A build without CUDA has no cuda:: entry points, and a CUDA
/// device is then an error that names the op.
#if GT_WITH_CUDA
#define GT_DISPATCH(operands, ...)    \
  do {                                \
    if ((operands).device().is_cpu()) \
      ::gt::cpu::__VA_ARGS__;         \
    else                              \
      ::gt::cuda::__VA_ARGS__;        \
  } while (0)
#else
#define GT_DISPATCH(operands, ...)    \
  do {                                \
    if ((operands).device().is_cpu()) \
      ::gt::cpu::__VA_ARGS__;         \
    else                              \
      (operands).no_backend();        \
  } while (0)
#endif
