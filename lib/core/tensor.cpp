// Tensor storage on the CPU and views; other devices' storage comes from the backend hooks (core/backend.h).
#include "core/tensor.h"

#include "core/backend.h"
#include "core/storage_peak.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <utility>

#include <sys/mman.h>
#include <sys/resource.h>

namespace gt {

namespace {
std::atomic<size_t> g_host_bytes{0}, g_host_peak{0};
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeFrom = size_t{8} << 20;

// Counts `bytes` more of host storage, raising the peak when it is passed.
void count_host_bytes(size_t bytes) {
  const size_t now = g_host_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  for (size_t peak = g_host_peak.load(std::memory_order_relaxed);
       now > peak && !g_host_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed);) {
  }
}

}  // namespace

size_t host_storage_bytes() { return g_host_bytes.load(std::memory_order_relaxed); }
size_t host_storage_peak_bytes() { return g_host_peak.load(std::memory_order_relaxed); }
void reset_host_storage_peak() { g_host_peak.store(host_storage_bytes(), std::memory_order_relaxed); }
void raise_host_storage_peak(size_t bytes) {
  for (size_t peak = g_host_peak.load(std::memory_order_relaxed);
       bytes > peak && !g_host_peak.compare_exchange_weak(peak, bytes, std::memory_order_relaxed);) {
  }
}

std::shared_ptr<Storage> allocate_storage(size_t bytes, Device device) {
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->device = device;
  if (device.is_cpu()) {
    // Large blocks on 2 MiB boundaries, marked for transparent huge pages: a first touch then faults (and clears)
    // one 2 MiB page instead of 512 small ones, and the products walk them with fewer TLB misses.
    const bool huge = bytes >= kHugeFrom;
    const size_t align = huge ? kHugePage : 64;
    const size_t rounded = (bytes + align - 1) / align * align;
    s->ptr = std::aligned_alloc(align, rounded ? rounded : align);
    if (!s->ptr) throw Error(host_out_of_memory(bytes));
#ifdef MADV_HUGEPAGE
    if (huge) madvise(s->ptr, rounded, MADV_HUGEPAGE);  // advice only: where THP is off nothing changes
#endif
    count_host_bytes(bytes);
    s->release = [bytes](void* p) {
      g_host_bytes.fetch_sub(bytes, std::memory_order_relaxed);
      std::free(p);
    };
  } else {
    s->ptr = backend_alloc(device, bytes);
    s->release = [device](void* p) { backend_free(device, p); };
  }
  return s;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.m_shape = shape;
  t.m_dtype = dtype;
  t.m_storage = allocate_storage(static_cast<size_t>(shape.numel()) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::mapped_zeros(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype), length = std::max<size_t>(bytes, 1);
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw Error(host_out_of_memory(bytes));
#ifdef MADV_HUGEPAGE
  if (length >= kHugeFrom) madvise(p, length, MADV_HUGEPAGE);  // as allocate_storage: advice only
#endif
  count_host_bytes(bytes);
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->device = Device::cpu();
  s->ptr = p;  // anonymous pages read as zeros
  s->release = [bytes, length](void* q) {
    g_host_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    munmap(q, length);
  };
  Tensor t;
  t.m_shape = shape;
  t.m_dtype = dtype;
  t.m_storage = std::move(s);
  return t;
}

Tensor Tensor::over_storage(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  GT_CHECK(storage && offset <= storage->bytes && bytes <= storage->bytes - offset,
           "{} bytes at offset {} do not fit in a storage of {} bytes", bytes, offset, storage ? storage->bytes : 0);
  Tensor t;
  t.m_shape = shape;
  t.m_dtype = dtype;
  t.m_storage = std::move(storage);
  t.m_offset = offset;
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  Tensor t;
  t.m_shape = shape;
  t.m_dtype = dtype;
  auto s = std::make_shared<Storage>();
  s->bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  s->device = Device::cpu();
  s->ptr = allocate_pinned(s->bytes);
  s->release = [](void* p) { free_pinned(p); };
  t.m_storage = std::move(s);
  return t;
}

Tensor Tensor::narrow0(int64_t n) const { return slice0(0, n); }

Tensor Tensor::slice0(int64_t begin, int64_t n) const {
  GT_CHECK(rank() >= 1 && begin >= 0 && n >= 0 && begin + n <= m_shape[0], "slice [{}, {}) of {}", begin, begin + n,
           m_shape.str());
  Tensor t = *this;
  const int64_t row = m_shape[0] ? numel() / m_shape[0] : 0;
  t.m_offset += static_cast<size_t>(begin * row) * dtype_size(m_dtype);
  t.m_shape[0] = n;
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  GT_CHECK(shape.numel() == numel(), "view {} of {}", shape.str(), m_shape.str());
  Tensor t = *this;
  t.m_shape = shape;
  return t;
}

Tensor Tensor::reinterpret(DType dtype, const Shape& shape) const {
  GT_CHECK(static_cast<size_t>(shape.numel()) * dtype_size(dtype) <= bytes() && m_offset % dtype_size(dtype) == 0,
           "reinterpret {} {} as {} {}", dtype_name(m_dtype), m_shape.str(), dtype_name(dtype), shape.str());
  Tensor t = *this;
  t.m_dtype = dtype;
  t.m_shape = shape;
  return t;
}

void Tensor::zero_() {
  if (device().is_cpu())
    std::memset(raw(), 0, bytes());
  else
    backend_memset_zero(device(), raw(), bytes());
}

Tensor Tensor::clone() const {
  Tensor t = empty(m_shape, m_dtype, device());
  t.copy_from(*this);
  return t;
}

namespace {

// Checks that src fits dst; copies and returns true when both are on the CPU (a plain memcpy), false when the
// backend is to copy.
bool copy_on_host(Tensor& dst, const Tensor& src) {
  GT_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(), "copy {} {} into {} {}", dtype_name(src.dtype()),
           src.shape().str(), dtype_name(dst.dtype()), dst.shape().str());
  if (!dst.device().is_cpu() || !src.device().is_cpu()) return false;
  std::memcpy(dst.raw(), src.raw(), dst.bytes());
  return true;
}

}  // namespace

void Tensor::copy_from(const Tensor& src) {
  if (!copy_on_host(*this, src)) backend_copy(raw(), device(), src.raw(), src.device(), bytes());
}

void Tensor::copy_from_async(const Tensor& src) {
  if (!copy_on_host(*this, src)) backend_copy_async(raw(), device(), src.raw(), src.device(), bytes());
}

namespace {
thread_local std::string t_alloc_label;
std::mutex g_unwound_mutex;
std::string g_unwound;  // AllocLabel::take_unwound(); the first label unwound is the innermost
}  // namespace

AllocLabel::AllocLabel(std::string what)
    : m_previous(std::move(t_alloc_label)), m_exceptions(std::uncaught_exceptions()) {
  t_alloc_label = std::move(what);
}
AllocLabel::~AllocLabel() {
  if (std::uncaught_exceptions() > m_exceptions) {
    const std::lock_guard lock(g_unwound_mutex);
    if (g_unwound.empty()) g_unwound = t_alloc_label;
  }
  t_alloc_label = std::move(m_previous);
}
std::string AllocLabel::take_unwound() {
  const std::lock_guard lock(g_unwound_mutex);
  return std::exchange(g_unwound, std::string());
}
const std::string& AllocLabel::current() {
  static const std::string kDefault = "a tensor";
  return t_alloc_label.empty() ? kDefault : t_alloc_label;
}

std::string host_out_of_memory(size_t bytes, const std::string& what) {
  std::string limit;
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    limit =
        fmt::format("; the address space is limited to {:.0f} MB (ulimit -v)", static_cast<double>(as.rlim_cur) * 1e-6);
  const std::string size =
      bytes ? fmt::format(" {:.1f} MB ({} bytes) for", static_cast<double>(bytes) * 1e-6, bytes) : "";
  return fmt::format("out of host memory allocating{} {}{}", size, what.empty() ? AllocLabel::current() : what, limit);
}

}  // namespace gt
