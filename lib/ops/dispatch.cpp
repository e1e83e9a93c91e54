// The operand checks every op starts with (ops/dispatch.h).
#include "ops/dispatch.h"

namespace gt::ops {

Operands::Operands(const char* op, std::initializer_list<const Tensor*> same_dtype,
                   std::initializer_list<const Tensor*> same_device)
    : m_op(op), m_device(Device::cpu()) {
  const Tensor* first = nullptr;
  for (const Tensor* t : same_dtype) {
    if (!t->defined()) continue;
    if (!first)
      first = t;
    else
      GT_CHECK(t->dtype() == first->dtype(), "{}: operands of {} and {}", op, dtype_name(first->dtype()),
               dtype_name(t->dtype()));
  }
  const Tensor* placed = nullptr;
  for (const auto& list : {same_dtype, same_device})
    for (const Tensor* t : list) {
      if (!t->defined()) continue;
      if (!placed)
        placed = t;
      else if (!(t->device() == placed->device()))
        throw Error(fmt::format("{}: operands on {} and {}", op, placed->device().str(), t->device().str()));
    }
  if (placed) m_device = placed->device();
}

void Operands::no_backend() const {
  throw Error(fmt::format("{} on {}: this gputrain was built without the CUDA backend", m_op, m_device.str()));
}

}  // namespace gt::ops
