// Tensor: a typed, shaped view of a device buffer. Views share storage; copies are explicit.
#pragma once

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

#include <cstddef>
#include <functional>
#include <memory>

namespace gt {

/// A block of device memory and the function that gives it back.
struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  std::function<void(void*)> release;
  ~Storage() {
    if (release) release(ptr);
  }
};

/// Allocates `bytes` on `device` (64-byte aligned on the CPU). Throws gt::Error when memory runs out.
std::shared_ptr<Storage> allocate_storage(size_t bytes, Device device);
/// Bytes of CPU storage from allocate_storage alive now (not pinned memory): tests measure what a model allocates.
size_t host_storage_bytes();
/// The most host_storage_bytes() has been since the last reset_host_storage_peak() (or the start): tests measure
/// what a step holds at its fullest, such as ZeRO-2's gradient buckets during the backward pass.
size_t host_storage_peak_bytes();
void reset_host_storage_peak();

class Tensor {
 public:
  Tensor() = default;
  /// Uninitialised contents.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  /// Zeros on the CPU in pages of their own (mmap), given back to the system when the storage is freed: for a
  /// buffer that lives for part of a step (ZeRO-2's gradient buckets), which malloc would keep resident once freed.
  static Tensor mapped_zeros(const Shape& shape, DType dtype);
  /// Host memory that is page-locked in CUDA builds, so copy_from_async can read or write it directly.
  static Tensor empty_pinned(const Shape& shape, DType dtype);
  /// A tensor over memory someone else owns (a memory-mapped file): `storage` holds it and gives it back; the
  /// elements start `offset` bytes into it, which must leave room for all of them.
  static Tensor over_storage(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape, DType dtype);

  const Shape& shape() const { return m_shape; }
  int64_t dim(size_t i) const { return m_shape[i]; }
  size_t rank() const { return m_shape.rank(); }
  int64_t numel() const { return m_shape.numel(); }
  DType dtype() const { return m_dtype; }
  Device device() const { return m_storage ? m_storage->device : Device::cpu(); }
  bool defined() const { return m_storage != nullptr; }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(m_dtype); }

  void* raw() const { return static_cast<char*>(m_storage->ptr) + m_offset; }
  template <class T>
  T* data() const {
    GT_CHECK(m_dtype == dtype_of<T>::value, "tensor holds {}, asked for {}", dtype_name(m_dtype),
             dtype_name(dtype_of<T>::value));
    return static_cast<T*>(raw());
  }

  /// The first `n` entries along dimension 0, sharing storage (a smaller last batch).
  Tensor narrow0(int64_t n) const;
  /// Rows [begin, begin + n) along dimension 0, sharing storage.
  Tensor slice0(int64_t begin, int64_t n) const;
  /// The same elements under another shape with the same element count, sharing storage.
  Tensor view(const Shape& shape) const;
  /// The first bytes of this tensor's elements as `shape` elements of `dtype`, sharing storage (scratch of one dtype
  /// lent to an op of another: attention's 16-bit gradients in the model's f32 scratch). Their contents are whatever
  /// those bytes hold.
  Tensor reinterpret(DType dtype, const Shape& shape) const;
  /// Sets every element to zero.
  void zero_();
  /// A deep copy on the same device.
  Tensor clone() const;
  /// Copies `src` (same dtype and element count) into this tensor, across devices if needed.
  void copy_from(const Tensor& src);
  /// Like copy_from, but queued on the CUDA device's stream without waiting; the host side must be pinned and stay
  /// untouched until the device has consumed it (an event or a later synchronous call). Host to host is memcpy.
  void copy_from_async(const Tensor& src);

 private:
  std::shared_ptr<Storage> m_storage;
  size_t m_offset = 0;  // bytes
  Shape m_shape;
  DType m_dtype = DType::f32;
};

}  // namespace gt
