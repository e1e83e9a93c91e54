// The device entry points of a build without the CUDA backend: every call says CUDA is not built in.
#include "core/error.h"
#include "ops/backend.h"
#include "ops/devices.h"

namespace gt {
namespace {
[[noreturn]] void no_cuda() {
  throw Error("this gputrain was built without the CUDA backend (configure with -DGPUTRAIN_CUDA=ON)");
}
}  // namespace

bool cuda_built() { return false; }
void* backend_alloc(Device, size_t) { no_cuda(); }
void backend_free(Device, void*) {}
void backend_memset_zero(Device, void*, size_t) { no_cuda(); }
void backend_copy(void*, Device, const void*, Device, size_t) { no_cuda(); }

CudaInfo query_cuda() {
  CudaInfo info;
  info.problem = "this binary was built without the CUDA backend";
  return info;
}

}  // namespace gt
