// Matmul through cuBLASLt: the row-major product C = op(A)·op(B) is the column-major product Cᵀ = op(B)ᵀ·op(A)ᵀ,
// so the tensors go to cuBLASLt swapped and nothing is transposed in memory. One cached plan per shape.
#include "ops/cuda/context.h"
#include "ops/cuda/dnn.h"
#include "ops/cuda/dnn_common.h"

#include <atomic>
#include <cstdint>

namespace gt::cuda {
namespace dnn {
namespace {

std::atomic<int64_t> g_plan_counts[4];

}  // namespace

void count_plan(PlanFamily family) { ++g_plan_counts[static_cast<int>(family)]; }

}  // namespace dnn

DnnPlanCounts dnn_plan_counts() {
  using dnn::g_plan_counts;
  return {g_plan_counts[0].load(), g_plan_counts[1].load(), g_plan_counts[2].load(), g_plan_counts[3].load()};
}

namespace {

using namespace dnn;

// Scratch the heuristic may plan for; the buffer is the device's shared grow-only workspace (context.h).
constexpr uint64_t kMaxWorkspace = uint64_t{32} << 20;

// The largest power of two up to 256 that divides the address. cuBLASLt's heuristic assumes 256-byte aligned
// operands unless told otherwise, and a view into a batch (narrow0, slice0) can start anywhere on a 4-byte
// boundary, so the plan is chosen for the alignment the pointers actually have.
int64_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int64_t a = 256;
  while (a > 1 && address % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

struct MatmulPlan {
  LtMatmulDesc op;
  LtLayout lt_a, lt_b, lt_c;  // cuBLASLt's A is the tensor b, its B the tensor a; C and D are the tensor c
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

// The layout of a row-major (rows, cols) tensor read column-major: a cols × rows matrix with leading dimension cols.
void make_layout(LtLayout& layout, cudaDataType_t type, const Tensor& t) {
  GT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(layout.out(), type, static_cast<uint64_t>(t.dim(1)),
                                             static_cast<uint64_t>(t.dim(0)), t.dim(1)));
}

std::unique_ptr<MatmulPlan> make_plan(int device, const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c,
                                      const std::array<int64_t, 3>& align) {
  auto plan = std::make_unique<MatmulPlan>();
  const bool f64 = is_f64(c);
  const cudaDataType_t type = f64 ? CUDA_R_64F : CUDA_R_32F;
  // CUBLAS_COMPUTE_32F is plain fp32 arithmetic: no TF32, as PyTorch's default fp32 matmul.
  GT_CHECK_CUBLAS(cublasLtMatmulDescCreate(plan->op.out(), f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F, type));
  const int32_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  GT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op.get(), CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  GT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op.get(), CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  // cuBLASLt computes D (n × m, column-major) = op(A) (n × k) · op(B) (k × m) with A = b and B = a.
  make_layout(plan->lt_a, type, b);
  make_layout(plan->lt_b, type, a);
  make_layout(plan->lt_c, type, c);

  LtPreference pref;
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(pref.out()));
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &kMaxWorkspace, sizeof kMaxWorkspace));
  const uint32_t align_a = static_cast<uint32_t>(align[1]), align_b = static_cast<uint32_t>(align[0]),
                 align_c = static_cast<uint32_t>(align[2]);
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                       &align_a, sizeof align_a));
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                       &align_b, sizeof align_b));
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                       &align_c, sizeof align_c));
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                       &align_c, sizeof align_c));

  cublasLtMatmulHeuristicResult_t results[8] = {};
  int returned = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(lt_handle(device), plan->op.get(), plan->lt_a.get(), plan->lt_b.get(),
                                     plan->lt_c.get(), plan->lt_c.get(), pref.get(), 8, results, &returned);
  for (int i = 0; status == CUBLAS_STATUS_SUCCESS && i < returned; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) {  // ordered by estimated time: the first usable one
      plan->algo = results[i].algo;
      plan->workspace = results[i].workspaceSize;
      return plan;
    }
  throw Error(fmt::format("cuBLASLt has no {} matmul algorithm for {}{} · {}{} → {} with operands aligned to {}/{}/{} "
                          "bytes on cuda:{}: {}",
                          dtype_name(c.dtype()), a.shape().str(), ta ? "ᵀ" : "", b.shape().str(), tb ? "ᵀ" : "",
                          c.shape().str(), align[0], align[1], align[2], device, cublasGetStatusString(status)));
}

}  // namespace

void matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta) {
  const int device = c.device().index;
  const int64_t m = c.dim(0), n = c.dim(1), k = ta ? a.dim(0) : a.dim(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta·c
    if (beta == 0) GT_CHECK_CUDA(cudaMemsetAsync(c.raw(), 0, c.bytes(), stream(device)));
    GT_CHECK(beta == 0 || beta == 1, "matmul with k = 0 supports beta 0 or 1, got {}", beta);
    return;
  }
  const std::array<int64_t, 3> align{alignment_of(a.raw()), alignment_of(b.raw()), alignment_of(c.raw())};
  // Leaked on purpose: destroying descriptors during static destruction could run after the libraries unloaded.
  static auto* cache = new PlanCache<11, MatmulPlan>;
  const PlanCache<11, MatmulPlan>::Key key{device, m,  n,  k, ta, tb, is_f64(c), beta != 0, align[0], align[1],
                                           align[2]};
  const MatmulPlan& plan =
      cache->get(key, PlanFamily::matmul, [&] { return make_plan(device, a, ta, b, tb, c, align); });

  const bool f64 = is_f64(c);
  const HostScalar alpha_s(1.0, f64), beta_s(beta, f64);
  void* ws = plan.workspace ? workspace(device, plan.workspace) : nullptr;
  // C and D are the same tensor with the same layout (in place); with beta = 0 cuBLASLt does not read C.
  GT_CHECK_CUBLAS(cublasLtMatmul(lt_handle(device), plan.op.get(), alpha_s.ptr(), b.raw(), plan.lt_a.get(), a.raw(),
                                 plan.lt_b.get(), beta_s.ptr(), c.raw(), plan.lt_c.get(), c.raw(), plan.lt_c.get(),
                                 &plan.algo, ws, plan.workspace, stream(device)));
}

}  // namespace gt::cuda
