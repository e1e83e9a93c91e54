// CUDA matrix products and the bias ops of a dense layer (ops/matmul.h). Matmul goes through cuBLASLt: the row-major
// product C = op(A)·op(B) is the column-major product Cᵀ = op(B)ᵀ·op(A)ᵀ, so the tensors go to cuBLASLt swapped and
// nothing is transposed in memory; one cached plan per shape. add_row_bias and sum_rows are kernels, their sums in
// double, so they are at least as exact as the CPU's. linear_forward adds its bias in cuBLASLt's epilogue
// (CUBLASLT_EPILOGUE_BIAS): in cuBLASLt's column-major view our columns (the out features) are the rows of D, and its
// bias is per row of D, so the layer's bias fits it as it is. Where cuBLASLt has no algorithm with the epilogue
// (its heuristic says so, for a type or shape) the product runs alone and add_row_bias after it.
//
// Under a bf16/fp16 ProductPrecisionScope (ops/precision.h) an f32 matmul converts both operands to 16-bit scratch
// (round to nearest even, as the CPU's half path rounds them) and runs cuBLASLt with 16-bit A/B, f32 C/D and
// CUBLAS_COMPUTE_32F: each product of two half values is exact in f32 and the sums are f32, so the result is the CPU's
// half product up to the order of the sums, and stays an f32 tensor. An epilogue's vectors (bias, GELU's input,
// the bias gradient) are f32 there too: cuBLASLt keeps them in D's type.
//
// 16-bit activation tensors (DType bf16/f16, Model::set_activation_dtype) under the precision of their own format
// are cuBLASLt's operands as they are: the rounding a HalfOperand copy would make is the one their values already
// had, so only an f32 operand is copied (a weight through half_weight). D is the output tensor in its own dtype, f32
// or 16-bit (CUDA_R_16BF/16F: cuBLASLt sums in f32 and rounds once when it stores), and C, read with beta, has D's
// type. An epilogue's bias beside a 16-bit D is a 16-bit copy of the f32 parameter, made once per step as the weights'
// are (half_weight): cuBLASLt's bias has D's type outside its int8 and fp8 kernels (cublasLt.h,
// CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), as llm.c's bf16 biases do; the CPU adds the f32 bias, so the two differ by the
// bias's rounding, half an ulp of it. GELU's input h has D's type. Where cuBLASLt refuses such a combination (its
// heuristic, or the call's own check of the descriptor) the op computes its 16-bit results in f32 temporaries
// (ops/wide.h) through the f32 paths above and rounds them once, as the CPU does.
#include "ops/matmul.h"

#include "ops/activation.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dnn_common.h"
#include "ops/cuda/half_scratch.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/elementwise.h"
#include "ops/half_storage.h"
#include "ops/math.h"
#include "ops/precision.h"
#include "ops/wide.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <type_traits>

namespace gt::cuda {
namespace {

using namespace dnn;
using namespace kern;

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

// What cuBLASLt does besides the product: an epilogue (CUBLASLT_MATMUL_DESC_EPILOGUE) with its vectors, and C when
// it is not D. The default is the plain product into c.
struct LtExtras {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  // The BIAS forms read it, BGRADB writes it; its length is cuBLASLt's rows of D (the BIAS forms: our columns) or
  // columns of D (BGRADB: our rows), in D's type.
  void* bias = nullptr;
  void* aux = nullptr;         // GELU_AUX: GELU's input, written in D's type and layout
  const void* c_in = nullptr;  // C, read with beta, when it is not D (same shape and layout); null: C is D
  bool any() const { return epilogue != CUBLASLT_EPILOGUE_DEFAULT || c_in; }
};

struct MatmulPlan {
  LtMatmulDesc op;
  LtLayout lt_a, lt_b, lt_c;  // cuBLASLt's A is the tensor b, its B the tensor a; C and D are the tensor c
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  // The heuristic found no algorithm for the extras (an epilogue cuBLASLt lacks for this type or shape): the caller
  // runs the product alone and the rest in kernels. Kept, so the heuristic is asked once per key. `rejected`: the
  // call itself refused the extras (cuBLASLt checks a descriptor's types there too), and the plan is not tried again.
  bool refused = false;
  mutable std::atomic<bool> rejected{false};
  // The epilogue's vectors are set on `op` before each call (they differ per call); a device may be driven from more
  // than one thread.
  mutable std::mutex pointers;
};

// Sets an attribute of the operation descriptor.
template <class V>
void set_desc(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const V& value) {
  GT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof value));
}

// The epilogue's vector pointers on the descriptor: the heuristic reads their alignment from them, the call their
// addresses.
void set_pointers(cublasLtMatmulDesc_t op, const LtExtras& ex) {
  if (ex.bias) set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ex.bias);
  if (ex.aux) set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ex.aux);
}

// cuBLASLt's type for a tensor's elements (f32, f64 or 16-bit).
cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// The layout of a row-major (rows, cols) tensor read column-major: a cols × rows matrix with leading dimension cols.
void make_layout(LtLayout& layout, cudaDataType_t type, const Shape& s) {
  GT_CHECK_CUBLAS(
      cublasLtMatrixLayoutCreate(layout.out(), type, static_cast<uint64_t>(s[1]), static_cast<uint64_t>(s[0]), s[1]));
}

// `half`: the operands are 16-bit (copies, or 16-bit tensors) in that format; C and D are c in its dtype (f32, or
// 16-bit in that format), the compute f32.
// `ex`: the epilogue and C ≠ D, whose alignment `align_c_in` gives (align[2] is D's).
std::unique_ptr<MatmulPlan> make_plan(int device, const Tensor& a, bool ta, const Shape& b, bool tb, const Tensor& c,
                                      const std::array<int64_t, 3>& align, bool tf32, std::optional<HalfFormat> half,
                                      const LtExtras& ex, int64_t align_c_in) {
  auto plan = std::make_unique<MatmulPlan>();
  const bool f64 = is_f64(c);
  const cudaDataType_t type = f64 ? CUDA_R_64F : CUDA_R_32F;
  const cudaDataType_t operand_type = !half ? type : *half == HalfFormat::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  // CUBLAS_COMPUTE_32F is plain fp32 arithmetic: no TF32, as PyTorch's default fp32 matmul. Under train.precision
  // tf32 (ops/precision.h) f32 products may round their operands to TF32 on the tensor cores, as PyTorch's
  // allow_tf32.
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F : (tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  GT_CHECK_CUBLAS(cublasLtMatmulDescCreate(plan->op.out(), compute, type));
  const int32_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  GT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op.get(), CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  GT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op.get(), CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  // cuBLASLt computes D (n × m, column-major) = op(A) (n × k) · op(B) (k × m) with A = b and B = a.
  make_layout(plan->lt_a, operand_type, b);
  make_layout(plan->lt_b, operand_type, a.shape());
  make_layout(plan->lt_c, lt_type(c.dtype()), c.shape());
  if (ex.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    set_desc(plan->op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, ex.epilogue);
    // The bias (BGRADB: its gradient) has D's type (cuBLASLt's default, said outright): the f32 or f64 parameter, or
    // its 16-bit copy beside a 16-bit D (epilogue_bias).
    if (ex.bias)
      set_desc(plan->op.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
               static_cast<int32_t>(is_half(c.dtype()) ? lt_type(c.dtype()) : type));
    if (ex.aux) {
      // GELU's input in D's type and layout: leading dimension our columns (cuBLASLt's rows of D), which it wants
      // divisible by 8 (the caller checks, and that h has y's dtype).
      set_desc(plan->op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, c.dim(1));
      set_desc(plan->op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, static_cast<int32_t>(lt_type(c.dtype())));
    }
    set_pointers(plan->op.get(), ex);
  }

  LtPreference pref;
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(pref.out()));
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &kMaxWorkspace, sizeof kMaxWorkspace));
  const uint32_t align_a = static_cast<uint32_t>(align[1]), align_b = static_cast<uint32_t>(align[0]),
                 align_c = static_cast<uint32_t>(align_c_in), align_d = static_cast<uint32_t>(align[2]);
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                       sizeof align_a));
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                       sizeof align_b));
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                       sizeof align_c));
  GT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                       sizeof align_d));

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
  if (ex.any()) {
    plan->refused = true;
    return plan;
  }
  throw Error(fmt::format(
      "cuBLASLt has no {}{} matmul algorithm for {}{} · {}{} → {} with operands aligned to {}/{}/{} "
      "bytes on cuda:{}: {}",
      dtype_name(c.dtype()), half ? (*half == HalfFormat::bf16 ? " (bf16 operands)" : " (fp16 operands)") : "",
      a.shape().str(), ta ? "ᵀ" : "", b.str(), tb ? "ᵀ" : "", c.shape().str(), align[0], align[1], align[2], device,
      cublasGetStatusString(status)));
}

constexpr int kThreads = 256;

// Column sums: a block is 32 columns (one warp wide, so each row's read is coalesced) × kColRows row lanes.
constexpr int kColRows = 16;

// An activation's element read as f32 (f64), and a sum stored into one: a 16-bit activation (Y = __nv_bfloat16 or
// __half) beside f32 parameters is widened exactly and rounded to nearest even once, as the CPU rounds its f32 result.
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
template <class Y, class V>
__device__ __forceinline__ Y narrow(V v) {
  if constexpr (std::is_same_v<Y, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<Y, __half>)
    return __float2half_rn(v);
  else
    return static_cast<Y>(v);
}

// y (rows, cols) += bias (cols) on every row; Y is T, or a 16-bit type beside an f32 bias (the sum in f32).
template <class Y, class T>
__global__ void add_row_bias_kernel(Y* __restrict__ y, const T* __restrict__ bias, int64_t n, int64_t cols) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) y[i] = narrow<Y>(widen(y[i]) + bias[i % cols]);
}

// db (cols) = Σ_r dy (rows, cols) + beta · db, dy's elements of type Y (T, or 16-bit). Each output is summed by one
// block in a fixed order: deterministic.
template <class Y, class T>
__global__ void sum_rows_kernel(const Y* __restrict__ dy, T* __restrict__ db, int64_t rows, int64_t cols, double beta) {
  __shared__ double part[kColRows][kWarp + 1];  // +1: lanes of a row lane hit distinct banks
  const int64_t j = blockIdx.x * int64_t{kWarp} + threadIdx.x;
  double acc = 0;
  if (j < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kColRows) acc += static_cast<double>(widen(dy[r * cols + j]));
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  double s = 0;
  for (int k = 0; k < kColRows; ++k) s += part[k][threadIdx.x];
  db[j] = static_cast<T>(s + (beta != 0 ? beta * static_cast<double>(db[j]) : 0.0));
}

// Calls f(Y{}, T{}) for an activation of dtype `act` beside parameters of dtype `param`: T is float or double, Y is
// T or, for a 16-bit activation beside f32 parameters, __nv_bfloat16 or __half.
template <class F>
void with_activation_type(const char* op, DType act, DType param, F&& f) {
  if (is_half(act)) {
    GT_CHECK(param == DType::f32, "{} on CUDA: a {} activation with {} parameters (16-bit activations go with f32)", op,
             dtype_name(act), dtype_name(param));
    if (act == DType::bf16)
      f(__nv_bfloat16{}, float{});
    else
      f(__half{}, float{});
    return;
  }
  GT_CHECK(act == param && (act == DType::f32 || act == DType::f64),
           "{} on CUDA takes f32 or f64 tensors, or 16-bit activations with f32 parameters, got {} with {}", op,
           dtype_name(act), dtype_name(param));
  with_float_type(act == DType::f64, [&](auto t) { f(t, t); });
}

void launch_add_row_bias(cudaStream_t s, DType y_type, DType bias_type, void* y, const void* bias, int64_t rows,
                         int64_t cols) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  with_activation_type("add_row_bias", y_type, bias_type, [&](auto yt, auto t) {
    using Y = decltype(yt);
    using T = decltype(t);
    add_row_bias_kernel<Y, T>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<Y*>(y), static_cast<const T*>(bias), n, cols);
  });
  GT_CHECK_LAUNCH();
}

void launch_sum_rows(cudaStream_t s, DType dy_type, DType db_type, const void* dy, void* db, int64_t rows, int64_t cols,
                     double beta) {
  if (cols == 0) return;
  const dim3 block(kWarp, kColRows);
  const auto grid = static_cast<unsigned>((cols + kWarp - 1) / kWarp);
  with_activation_type("sum_rows", dy_type, db_type, [&](auto yt, auto t) {
    using Y = decltype(yt);
    using T = decltype(t);
    sum_rows_kernel<Y, T><<<grid, block, 0, s>>>(static_cast<const Y*>(dy), static_cast<T*>(db), rows, cols, beta);
  });
  GT_CHECK_LAUNCH();
}

// An operand of a half product: a 16-bit tensor in the product's format as it is, the 16-bit copy of a weight this
// scope made already (half_weight; `weight`: the contract says it is one), or a copy into scratch that goes back to
// the allocator when queued.
class HalfProductOperand {
 public:
  HalfProductOperand(const Tensor& t, HalfFormat format, bool weight) {
    if (is_half(t.dtype())) {
      GT_CHECK(half_format_of(t.dtype()) == format, "a {} operand of a {} product", dtype_name(t.dtype()),
               format == HalfFormat::bf16 ? "bf16" : "fp16");
      m_ptr = t.raw();
      return;
    }
    m_ptr = weight ? cuda::half_weight(t, format) : cuda::find_half_weight(t, format);
    if (!m_ptr) m_ptr = m_scratch.emplace(t, format).get();
  }
  const void* get() const { return m_ptr; }

 private:
  std::optional<HalfOperand> m_scratch;
  const void* m_ptr = nullptr;
};

// c = op(a)·op(b) + beta·C with cuBLASLt's extras `ex` (C: c, or ex.c_in). False, having done nothing, where the
// extras cannot run: an empty product (the caller's kernels give what an epilogue would have) or a plan the
// heuristic (or the call) refused; the plain product (no extras) always runs or throws.
// `a_half`: a's 16-bit copy in the scope's format, made by the caller for more than one product (null: made here).
// b is a tensor or, under a half scope, 16-bit elements in the scope's format (a 16-bit matrix the caller keeps: an
// input the model stored in 16 bits). Under a half scope a, b and c may be 16-bit tensors in its format (activations):
// a and b are read as they are, c is D (and C) in its own dtype.
struct ProductB {
  const Tensor* tensor = nullptr;
  const void* half = nullptr;  // with tensor null
  Shape shape;
};

bool matmul_core(const Tensor& a, bool ta, const ProductB& b, bool tb, Tensor& c, double beta, bool b_weight,
                 const LtExtras& ex, const void* a_half) {
  const int device = c.device().index;
  const int64_t m = c.dim(0), n = c.dim(1), k = ta ? a.dim(0) : a.dim(1);
  if (ex.any() && (m == 0 || n == 0 || k == 0)) return false;
  if (m == 0 || n == 0) return true;
  if (k == 0) {  // an empty sum: c = beta·c
    if (beta == 0) GT_CHECK_CUDA(cudaMemsetAsync(c.raw(), 0, c.bytes(), stream(device)));
    GT_CHECK(beta == 0 || beta == 1, "matmul with k = 0 supports beta 0 or 1, got {}", beta);
    return true;
  }
  // bf16/fp16: both operands as 16-bit copies (f32 tensors only; f64 products stay f64, as on the CPU). A weight's
  // copy is made once per scope (half_weight: linear_forward's w, found again by the dx = dy·W that reads it); any
  // other operand is converted into scratch for this product alone.
  const std::optional<HalfFormat> half = is_f64(c) ? std::nullopt : half_format(product_precision());
  GT_CHECK(half || (b.tensor && !is_half(b.tensor->dtype()) && !is_half(a.dtype()) && !is_half(c.dtype())),
           "a 16-bit operand outside a bf16/fp16 product scope");
  GT_CHECK(!half || !is_half(c.dtype()) || half_format_of(c.dtype()) == *half, "a {} result of a {} product",
           dtype_name(c.dtype()), *half == HalfFormat::bf16 ? "bf16" : "fp16");
  std::optional<HalfProductOperand> half_a, half_b;
  if (half) {
    if (!a_half) half_a.emplace(a, *half, false);
    if (b.tensor) half_b.emplace(*b.tensor, *half, b_weight);
  }
  const void* pa = !half ? a.raw() : a_half ? a_half : half_a->get();
  const void* pb = !half ? b.tensor->raw() : b.tensor ? half_b->get() : b.half;
  const std::array<int64_t, 3> align{alignment_of(pa), alignment_of(pb), alignment_of(c.raw())};
  // Leaked on purpose: destroying descriptors during static destruction could run after the libraries unloaded.
  // The key holds the epilogue and the alignment of its vectors and of C (the heuristic reads them all).
  static auto* cache = new PlanCache<17, MatmulPlan>;
  const bool tf32 = !is_f64(c) && product_precision() == Precision::tf32;
  const int64_t half_key = half ? 1 + static_cast<int64_t>(*half) : 0;
  const void* c_in = ex.c_in ? ex.c_in : c.raw();
  const int64_t align_c_in = alignment_of(c_in);
  const int64_t align_bias = ex.bias ? alignment_of(ex.bias) : 0, align_aux = ex.aux ? alignment_of(ex.aux) : 0;
  const PlanCache<17, MatmulPlan>::Key key{
      device,     m,         n,         k,        ta,   tb,       static_cast<int64_t>(c.dtype()),
      beta != 0,  align[0],  align[1],  align[2], tf32, half_key, static_cast<int64_t>(ex.epilogue),
      align_bias, align_aux, align_c_in};
  const MatmulPlan& plan = cache->get(key, PlanFamily::matmul, [&] {
    return make_plan(device, a, ta, b.shape, tb, c, align, tf32, half, ex, align_c_in);
  });
  if (plan.refused || plan.rejected.load(std::memory_order_relaxed)) return false;

  const bool f64 = is_f64(c);
  const HostScalar alpha_s(1.0, f64), beta_s(beta, f64);
  void* ws = plan.workspace ? workspace(device, plan.workspace) : nullptr;
  // C is c (in place) or ex.c_in, with c's layout; with beta = 0 cuBLASLt does not read C.
  std::unique_lock<std::mutex> lock(plan.pointers, std::defer_lock);
  if (ex.bias || ex.aux) {
    lock.lock();
    set_pointers(plan.op.get(), ex);
  }
  const cublasStatus_t status = cublasLtMatmul(lt_handle(device), plan.op.get(), alpha_s.ptr(), pb, plan.lt_a.get(), pa,
                                               plan.lt_b.get(), beta_s.ptr(), c_in, plan.lt_c.get(), c.raw(),
                                               plan.lt_c.get(), &plan.algo, ws, plan.workspace, stream(device));
  // cuBLASLt checks the descriptor before it queues anything: extras it does not take for these types (an f32 bias
  // beside a 16-bit D, which its documentation leaves to the heuristic) come back as a refusal, not a failure.
  if (ex.any() && (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE)) {
    plan.rejected.store(true, std::memory_order_relaxed);
    return false;
  }
  if (status != CUBLAS_STATUS_SUCCESS) throw_cublas_error("cublasLtMatmul", __FILE__, __LINE__, status);
  return true;
}

bool matmul_impl(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta, bool b_weight,
                 const LtExtras& ex = {}, const void* a_half = nullptr) {
  return matmul_core(a, ta, {.tensor = &b, .shape = b.shape()}, tb, c, beta, b_weight, ex, a_half);
}

}  // namespace

void matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double beta) {
  matmul_impl(a, ta, b, tb, c, beta, false);
}

namespace {

// An epilogue's bias beside D (y): the parameter itself beside an f32 or f64 D, its 16-bit copy of the step beside a
// 16-bit one (the native path runs inside a ProductPrecisionScope of D's format, which half_weight needs).
// (LtExtras::bias is writable for BGRADB's gradient; a BIAS epilogue only reads it.)
void* epilogue_bias(const Tensor& bias, const Tensor& y) {
  if (!is_half(y.dtype())) return bias.raw();
  return const_cast<void*>(cuda::half_weight(bias, half_format_of(y.dtype())));
}

}  // namespace

void add_row_bias(Tensor& y, const Tensor& bias) {
  launch_add_row_bias(stream(y.device().index), y.dtype(), bias.dtype(), y.raw(), bias.raw(), y.dim(0), y.dim(1));
}

// A 16-bit y whose bias epilogue cuBLASLt refused: the product and the bias into an f32 temporary, rounded into y
// once (Wide), not rounded after the product and again after the bias.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  if (bias.defined() && matmul_impl(x, false, w, true, y, 0.0, true,
                                    {.epilogue = CUBLASLT_EPILOGUE_BIAS, .bias = epilogue_bias(bias, y)}))
    return;
  if (bias.defined() && is_half(y.dtype())) {
    ops::Wide wide;
    Tensor yw = wide.out(y);
    linear_forward(x, w, bias, yw);
    wide.finish();
    return;
  }
  matmul_impl(x, false, w, true, y, 0.0, true);
  if (bias.defined()) add_row_bias(y, bias);
}

// relu or GELU after the bias in cuBLASLt's epilogue: RELU_BIAS, GELU_AUX_BIAS (GELU's input written to h) or
// GELU_BIAS (h undefined); without a bias RELU, GELU_AUX or GELU (the bit of CUBLASLT_EPILOGUE_BIAS is what
// differs). cuBLASLt's GELU is the tanh approximation, GPT-2's. GELU_AUX wants h's leading dimension (our columns)
// divisible by 8, and relu's aux is a bit-mask, not its input; in f64 GELU is our kernel's (cuBLASLt does not say
// in what precision it evaluates tanh there, and f64 models are compared with the CPU at 1e-10). For those, or where
// the heuristic refuses, the product and bias go into h (or y) and a kernel activates them. With 16-bit results (GELU's
// h in y's dtype, or cuBLASLt's epilogue refused) those go through f32 temporaries, rounded once at the end (Wide).
void linear_forward_act(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act, Tensor& h, Tensor& y) {
  const bool keep_h = h.defined();
  const bool aux_fits = !keep_h || (h.dtype() == y.dtype() && y.dim(1) % 8 == 0);
  if (act == Activation::relu ? !keep_h : (!is_f64(y) && aux_fits)) {
    const int base = act == Activation::relu ? CUBLASLT_EPILOGUE_RELU
                     : keep_h                ? CUBLASLT_EPILOGUE_GELU_AUX
                                             : CUBLASLT_EPILOGUE_GELU;
    LtExtras ex{.epilogue = static_cast<cublasLtEpilogue_t>(base | (bias.defined() ? CUBLASLT_EPILOGUE_BIAS : 0))};
    if (bias.defined()) ex.bias = epilogue_bias(bias, y);
    if (keep_h) ex.aux = h.raw();
    if (matmul_impl(x, false, w, true, y, 0.0, true, ex)) return;
  }
  if (ops::any_half({&h, &y})) {
    ops::Wide wide;
    Tensor hw = wide.out(h), yw = wide.out(y);
    linear_forward_act(x, w, bias, act, hw, yw);
    wide.finish();
    return;
  }
  Tensor& sum = keep_h ? h : y;
  linear_forward(x, w, bias, sum);
  activation_forward(act, sum, y);  // in place when h is undefined (the CUDA kernel allows it)
}

// y = (x·wᵀ + bias) + r: cuBLASLt's D = x·wᵀ + 1·C with C = r and D = y (distinct, same layout), the bias in its
// epilogue. C has D's type: a 16-bit y with a 16-bit r of its dtype runs so; where their dtypes differ, or the
// heuristic refuses a 16-bit y, the 16-bit ones go through f32 temporaries (Wide, y rounded once). Where the
// heuristic refuses f32 ones, linear_forward into y and the add after it.
void linear_forward_add(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& r, Tensor& y) {
  if (r.dtype() == y.dtype()) {
    LtExtras ex{.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, .c_in = r.raw()};
    if (bias.defined()) ex.bias = epilogue_bias(bias, y);
    if (matmul_impl(x, false, w, true, y, 1.0, true, ex)) return;
  }
  if (ops::any_half({&r, &y})) {
    ops::Wide wide;
    Tensor yw = wide.out(y);
    linear_forward_add(x, w, bias, wide.in(r), yw);
    wide.finish();
    return;
  }
  linear_forward(x, w, bias, y);
  cuda::add(y, r.view(y.shape()), y);
}

// dw = dyᵀ·x: cuBLASLt's A is x, its B is dy (transposed), its k our rows, so db = Σ_r dy is the sum over k of B
// for each column of D, BGRADB. Only with beta 0 (the epilogue writes db, it adds nothing to it) and outside a
// bf16/fp16 scope (there it would sum dy's 16-bit copy, where sum_rows sums dy itself; a 16-bit dy and x, which
// only come under such a scope, take the same road): elsewhere, or where the heuristic refuses, the product and
// sum_rows.
namespace {

// linear_backward_weight with dy's 16-bit copy `dy_half` (null: made by the product) under a half scope.
void weight_gradient(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, double beta, const void* dy_half) {
  const bool half = !is_f64(dw) && half_format(product_precision());
  if (db.defined() && beta == 0 && !half &&
      matmul_impl(dy, true, x, false, dw, 0.0, false, {.epilogue = CUBLASLT_EPILOGUE_BGRADB, .bias = db.raw()}))
    return;
  matmul_impl(dy, true, x, false, dw, beta, false, {}, dy_half);
  if (db.defined()) sum_rows(dy, db, beta);
}

}  // namespace

void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, double beta) {
  weight_gradient(dy, x, dw, db, beta, nullptr);
}

namespace {

// matmul_half_b with a's 16-bit copy `a_half` (null: made by the product). Under the precision of b's format b's
// elements are the product's operand as they are: what matmul with b widened would round them back to.
void half_b_product(const Tensor& a, bool ta, const ops::HalfMatrix& b, Tensor& c, double beta, const void* a_half) {
  const std::optional<HalfFormat> half = half_format(product_precision());
  if (half && *half == b.format) {
    matmul_core(a, ta, {.half = b.data, .shape = Shape{b.rows, b.cols}}, false, c, beta, false, {}, a_half);
    return;
  }
  Tensor wide = Tensor::empty(Shape{b.rows, b.cols}, DType::f32, c.device());
  half_to_f32(c.device().index, b.format, b.data, static_cast<float*>(wide.raw()), wide.numel(), 0.0f);
  matmul_core(a, ta, {.tensor = &wide, .shape = wide.shape()}, false, c, beta, false, {}, a_half);
}

}  // namespace

void matmul_half_b(const Tensor& a, bool ta, const ops::HalfMatrix& b, Tensor& c, double beta) {
  half_b_product(a, ta, b, c, beta, nullptr);
}

// Both products read dy: under a half scope its copy is made once, here, and handed to both (the rounding is the
// same either way, so are the bits); a 16-bit dy is that operand already. An input the model kept in 16 bits is dw's
// operand as it is, and so is a 16-bit x; dx is written in its own dtype.
void linear_backward(const Tensor& dy, const Tensor& x, const ops::HalfMatrix* x_half, const Tensor& w, Tensor& dw,
                     Tensor& db, Tensor& dx, double beta) {
  const std::optional<HalfFormat> half = is_f64(dy) ? std::nullopt : half_format(product_precision());
  std::optional<HalfOperand> dy_half;
  if (half && !is_half(dy.dtype()) && dw.defined() && dx.defined() && dy.numel() > 0) dy_half.emplace(dy, *half);
  const void* shared = dy_half ? dy_half->get() : nullptr;
  if (dw.defined() && x_half) {
    half_b_product(dy, true, *x_half, dw, beta, shared);
    if (db.defined()) sum_rows(dy, db, beta);
  } else if (dw.defined()) {
    weight_gradient(dy, x, dw, db, beta, shared);
  } else if (db.defined()) {
    sum_rows(dy, db, beta);
  }
  if (dx.defined()) matmul_impl(dy, false, w, false, dx, 0.0, false, {}, shared);
}

void sum_rows(const Tensor& dy, Tensor& db, double beta) {
  launch_sum_rows(stream(dy.device().index), dy.dtype(), db.dtype(), dy.raw(), db.raw(), dy.dim(0), dy.dim(1), beta);
}

}  // namespace gt::cuda
