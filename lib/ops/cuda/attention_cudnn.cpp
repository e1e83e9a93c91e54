// cuDNN's fused flash attention (ops/cuda/attention_cudnn.h) through the cuDNN frontend's graph API.
//
// Layout: cuDNN reads q, k and v straight from the packed [B, T, 3C] rows (llm.c's layout): each is a [B, H, T, d]
// view with strides [T·3C, d, 3C, 1] at element offsets 0, C and 2C, so nothing is transposed; out, dout and the
// gradients are the same views of [B, T, C] (strides [T·C, d, C, 1]) and of [B, T, 3C]. The model's activations are
// f32, so each call rounds its inputs to the 16-bit format into scratch (half_scratch.h, nearest even, as the CPU's
// half products round theirs), runs the graph on 16-bit tensors with f32 softmax and accumulation, and widens the
// 16-bit results back into the f32 tensors. lse stays f32 both ways: cuDNN's softmax statistics ("Stats") are the
// natural-log log-sum-exp of the scaled scores, log Σ_j exp(q_i·k_j / √d), which is ops/attention.h's lse as it is
// (stats_use_log2 would make it base 2; it is left off).
//
// Graphs: one per (device, B, T, heads, d, format, kind), kind being the forward with statistics (training), the
// forward without (evaluation) or the backward, built on first use and kept for the process (dnn_common.h's
// PlanCache, counted as PlanFamily::attention). A graph cuDNN refuses is kept too, with its reason, so a shape it
// cannot take is asked about once. The backward asks for cuDNN's deterministic algorithm: on Hopper it sums dQ
// through a dP workspace of about B·H·T²·2 bytes instead of atomics, and gives the same bits on every run, as the
// rest of gputrain does (a seeded run, a captured step against an uncaptured one). Workspaces come from the device's
// shared workspace (context.h).
//
// Numerics, against the CPU's half attention (ops/cpu/attention.cpp): the same rounded q, k, v and dout, products
// summed in f32 (the CPU sums wider), probabilities rounded to the format before they multiply v or dout, and dS before
// it multiplies k or q, as the CPU does; but cuDNN rounds exp(s − running max) where the CPU rounds the normalised
// probability, forms delta from the 16-bit out and dout, and writes out and the gradients in the 16-bit format (the
// CPU keeps them f32). tests/test_cuda_attention.cpp states the tolerances that follow.
#include "ops/cuda/attention_cudnn.h"

#include "core/env.h"
#include "core/error.h"
#include "ops/cuda/context.h"
#include "ops/cuda/dnn_common.h"
#include "ops/cuda/half_scratch.h"
#include "ops/precision.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#if GT_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>
// The frontend's experimental open-source engines (an SM100 RMSNorm) compile kernels with NVRTC; they are reached only
// through HeurMode_t::OPENSOURCE, which nothing here asks for. gputrain does not link NVRTC (a 100 MB library that the
// GPU bundle would have to carry), so the references are weak: unresolved, they are null, and never called.
#pragma weak nvrtcCreateProgram
#pragma weak nvrtcCompileProgram
#pragma weak nvrtcDestroyProgram
#pragma weak nvrtcGetCUBIN
#pragma weak nvrtcGetCUBINSize
#pragma weak nvrtcGetProgramLog
#pragma weak nvrtcGetProgramLogSize
#endif

namespace gt::cuda {
namespace {

constexpr const char* kEnv = "GPUTRAIN_CUDNN_ATTENTION";
constexpr int64_t kMaxHead = 128;

enum class Mode { automatic, off, required };

Mode mode() {
  const std::optional<size_t> v = env_choice(kEnv, {"0", "1"});
  return !v ? Mode::automatic : *v == 0 ? Mode::off : Mode::required;
}

std::atomic<int64_t> g_forward_runs{0}, g_backward_runs{0};

// The call goes to the CUDA kernels, saying why once per reason (at info: a fallback is a choice, not a fault), or,
// under GPUTRAIN_CUDNN_ATTENTION=1, fails naming it.
bool decline(Mode m, const std::string& why) {
  if (m == Mode::required) throw Error(fmt::format("{}=1 but cuDNN's flash attention cannot run: {}", kEnv, why));
  static std::mutex mutex;
  static std::set<std::string> said;
  const std::lock_guard lock(mutex);
  if (said.insert(why).second) spdlog::info("attention on CUDA runs its own kernels, not cuDNN's: {}", why);
  return false;
}

// The half format of a call cuDNN may take: f32 tensors, or 16-bit ones of the same format
// (Model::set_activation_dtype), under a bf16/fp16 product precision. Other calls (fp32, tf32, f64, a 16-bit tensor of
// the other format) are none of cuDNN's business here, and say nothing.
std::optional<HalfFormat> half_call(const Tensor& qkv) {
  const std::optional<HalfFormat> format = half_format(product_precision());
  if (qkv.dtype() == DType::f32 || !format) return format;
  return qkv.dtype() == half_dtype(*format) ? format : std::nullopt;
}

// The refusals known without a device, after the product precision (half_call) has let the call through.
std::optional<std::string> static_refusal(int64_t head_size, const ops::AttentionDropout& dropout) {
  if (mode() == Mode::off) return fmt::format("{}=0", kEnv);
  if (!cudnn_attention_built())
    return std::string(
        "this build has no cuDNN frontend headers (scripts/setup.sh fetches them; CMake's "
        "CUDNN_FRONTEND_INCLUDE_DIR)");
  if (dropout.p > 0)
    return fmt::format("attention dropout {} (the CUDA kernels draw the CPU's mask; cuDNN's would differ)", dropout.p);
  if (head_size > kMaxHead || head_size % 8 != 0)
    return fmt::format("head size {} (cuDNN takes multiples of 8 up to {})", head_size, kMaxHead);
  return std::nullopt;
}

}  // namespace

std::optional<std::string> cudnn_attention_refusal(int64_t head_size, const ops::AttentionDropout& dropout) {
  if (!half_format(product_precision()))
    return fmt::format("product precision {} (cuDNN's flash attention multiplies in bf16 or fp16)",
                       to_string(product_precision()));
  return static_refusal(head_size, dropout);
}

CudnnAttentionRuns cudnn_attention_runs() { return {g_forward_runs.load(), g_backward_runs.load()}; }

#if GT_HAVE_CUDNN_FRONTEND

bool cudnn_attention_built() { return true; }

namespace {

namespace fe = cudnn_frontend;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The tensors of a graph, by the uid execute() binds pointers to.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv };

using Kind = CudnnAttentionKind;

// One attention problem: batch, sequence, heads, head size, the 16-bit format and which graph.
struct Problem {
  int64_t b, t, h, d;
  HalfFormat format;
  Kind kind;
  int64_t c() const { return h * d; }
};

// A built graph, or cuDNN's reason for refusing one.
struct AttentionGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::string refusal;
  int64_t workspace = 0;
  // execute() is const but fills the graph's own pointer table: two threads driving one device (worker ranks that
  // share a GPU) take turns. It only queues work, so the turn is short.
  mutable std::mutex running;
};

// t as a [B, H, T, d] view of the head columns of rows `row` elements apart (3C in qkv, C in out): where the view
// starts (0, C or 2C into the packed rows) is the pointer execute() is given.
void as_heads(fe::graph::Tensor_attributes& t, const char* name, Uid uid, const Problem& p, int64_t row) {
  t.set_name(name).set_uid(uid).set_dim({p.b, p.h, p.t, p.d}).set_stride({p.t * row, p.d, row, 1});
}
TensorAttr heads_input(fe::graph::Graph& g, const char* name, Uid uid, const Problem& p, int64_t row) {
  TensorAttr t = g.tensor(fe::graph::Tensor_attributes());
  as_heads(*t, name, uid, p, row);
  return t;
}
// t as lse, cuDNN's statistics: f32 [B, H, T, 1], packed.
void as_stats(fe::graph::Tensor_attributes& t, const Problem& p) {
  t.set_name("lse")
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({p.b, p.h, p.t, 1})
      .set_stride({p.h * p.t, p.t, 1, 1});
}

// The graph of one problem: the causal mask is the band right of the diagonal (right bound 0, diagonal at the top
// left: query i sees keys j ≤ i), the scale 1/√d. `sm` (e.g. 90) checks it for that SM version; 0 for the current
// device's (set before the nodes are added: each node keeps a copy of the graph's context).
std::shared_ptr<fe::graph::Graph> describe(const Problem& p, int sm = 0) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm > 0) g->set_sm_version(sm);
  g->set_io_data_type(p.format == HalfFormat::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.d)));
  const int64_t qkv_row = 3 * p.c();
  const TensorAttr q = heads_input(*g, "q", kQ, p, qkv_row), k = heads_input(*g, "k", kK, p, qkv_row),
                   v = heads_input(*g, "v", kV, p, qkv_row);
  if (p.kind == Kind::backward) {
    const TensorAttr o = heads_input(*g, "out", kO, p, p.c()), dout = heads_input(*g, "dout", kDout, p, p.c());
    const TensorAttr stats = g->tensor(fe::graph::Tensor_attributes());
    as_stats(*stats, p);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats,
                                         fe::graph::SDPA_backward_attributes()
                                             .set_name("flash_attention_backward")
                                             .set_attn_scale(scale)
                                             .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                                             .set_diagonal_band_right_bound(0)
                                             .set_deterministic_algorithm(true));
    as_heads(dq->set_output(true), "dq", kDq, p, qkv_row);
    as_heads(dk->set_output(true), "dk", kDk, p, qkv_row);
    as_heads(dv->set_output(true), "dv", kDv, p, qkv_row);
    return g;
  }
  const bool train = p.kind == Kind::forward_train;
  auto [o, stats] = g->sdpa(q, k, v,
                            fe::graph::SDPA_attributes()
                                .set_name("flash_attention")
                                .set_generate_stats(train)
                                .set_attn_scale(scale)
                                .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                                .set_diagonal_band_right_bound(0));
  as_heads(o->set_output(true), "out", kO, p, p.c());
  if (train) as_stats(stats->set_output(true), p);
  return g;
}

// By CudnnAttentionKind.
constexpr const char* kKindNames[] = {"forward", "evaluation forward", "backward"};

// Builds the problem's graph on `device`'s handle; a step cuDNN refuses leaves the graph null and says why.
std::unique_ptr<AttentionGraph> build(int device, const Problem& p) {
  auto made = std::make_unique<AttentionGraph>();
  const std::shared_ptr<fe::graph::Graph> g = describe(p);
  cudnnHandle_t handle = cudnn_handle(device);  // makes `device` current: check_support reads its SM version
  const auto refused = [&](const char* step, fe::error_t e) {
    made->refusal = fmt::format("cuDNN {} refuses the {} {} graph for B {} T {} heads {} head size {} ({}: {})",
                                cudnnGetVersion(), p.format == HalfFormat::bf16 ? "bf16" : "fp16",
                                kKindNames[static_cast<int>(p.kind)], p.b, p.t, p.h, p.d, step, e.get_message());
    return std::move(made);
  };
  if (fe::error_t e = g->validate(); e.is_bad()) return refused("validate", e);
  if (fe::error_t e = g->build_operation_graph(handle); e.is_bad()) return refused("build_operation_graph", e);
  if (fe::error_t e = g->create_execution_plans({fe::HeurMode_t::A}); e.is_bad())
    return refused("create_execution_plans", e);
  if (fe::error_t e = g->check_support(); e.is_bad()) return refused("check_support", e);
  if (fe::error_t e = g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); e.is_bad())
    return refused("build_plans", e);
  if (fe::error_t e = g->get_workspace_size(made->workspace); e.is_bad()) return refused("get_workspace_size", e);
  made->graph = g;
  return made;
}

// The problem's graph, built on first use; null (after declining, once per reason) when cuDNN cannot take it.
const AttentionGraph* graph_for(int device, const Problem& p, Mode m) {
  static dnn::PlanCache<7, AttentionGraph> cache;
  const AttentionGraph& made =
      cache.get({device, p.b, p.t, p.h, p.d, static_cast<int64_t>(p.format), static_cast<int64_t>(p.kind)},
                dnn::PlanFamily::attention, [&] { return build(device, p); });
  if (!made.graph) {
    decline(m, made.refusal);
    return nullptr;
  }
  return &made;
}

// The problem of a call cuDNN may take, or nullopt when it declines (saying why once).
std::optional<Problem> problem_of(const Tensor& qkv, int64_t heads, const ops::AttentionDropout& dropout, Kind kind,
                                  Mode m) {
  const std::optional<HalfFormat> format = half_call(qkv);
  if (!format) return std::nullopt;
  const int64_t c = qkv.dim(2) / 3, d = c / heads;
  if (const std::optional<std::string> why = static_refusal(d, dropout)) {
    decline(m, *why);
    return std::nullopt;
  }
  // Checked once per process: cuDNN 8 has a flash attention too, but not every feature used here.
  static const size_t version = cudnnGetVersion();
  if (version < 90000) {
    decline(m, fmt::format("cuDNN {} at run time (flash attention here needs 9.0 or newer)", version));
    return std::nullopt;
  }
  return Problem{qkv.dim(0), qkv.dim(1), heads, d, *format, kind};
}

void run(const AttentionGraph& g, int device, std::unordered_map<int64_t, void*>& pointers) {
  const std::lock_guard lock(g.running);
  void* ws = g.workspace > 0 ? workspace(device, static_cast<size_t>(g.workspace)) : nullptr;
  if (fe::error_t e = g.graph->execute(cudnn_handle(device), pointers, ws); e.is_bad())
    throw Error(fmt::format("cuDNN flash attention failed to run: {}", e.get_message()));
}

}  // namespace

std::optional<std::string> cudnn_attention_check_graph(int64_t batch, int64_t t, int64_t heads, int64_t head_size,
                                                       HalfFormat format, CudnnAttentionKind kind, int sm) {
  fe::error_t e = describe(Problem{batch, t, heads, head_size, format, kind}, sm)->validate();
  if (e.is_good()) return std::nullopt;
  return e.get_message();
}

namespace {

// The element `offset` 16-bit values into `base`.
void* at(void* base, int64_t offset) { return static_cast<uint16_t*>(base) + offset; }

// `t`'s elements in `format` for the graph: t's own when it holds that format already (a 16-bit activation), else a
// copy rounded into `copy` (nearest even, as the CPU's half products round).
void* half_in(const Tensor& t, HalfFormat format, std::optional<HalfOperand>& copy) {
  if (is_half(t.dtype())) return t.raw();
  copy.emplace(t, format);
  return copy->get();
}

// Where the graph writes a result bound for `t`: t itself when it is 16-bit, else `scratch`, widened into t after.
void* half_out(Tensor& t, std::optional<HalfBuffer>& scratch) {
  if (is_half(t.dtype())) return t.raw();
  scratch.emplace(t.device().index, t.numel());
  return scratch->get();
}

void widen_out(Tensor& t, HalfFormat format, const std::optional<HalfBuffer>& scratch) {
  if (scratch) half_to_f32(t.device().index, format, scratch->get(), static_cast<float*>(t.raw()), t.numel(), 0.0f);
}

}  // namespace

bool cudnn_attention_forward(const Tensor& qkv, int64_t heads, const ops::AttentionDropout& dropout, Tensor& out,
                             Tensor& lse) {
  const Mode m = mode();
  const std::optional<Problem> p =
      problem_of(qkv, heads, dropout, lse.defined() ? Kind::forward_train : Kind::forward_eval, m);
  if (!p) return false;
  const int device = qkv.device().index;
  const AttentionGraph* g = graph_for(device, *p, m);
  if (!g) return false;
  std::optional<HalfOperand> qkv_copy;
  std::optional<HalfBuffer> out_scratch;
  void* qkv16 = half_in(qkv, p->format, qkv_copy);  // [B, T, 3C]
  void* out16 = half_out(out, out_scratch);         // [B, T, C]
  std::unordered_map<int64_t, void*> pointers{
      {kQ, at(qkv16, 0)}, {kK, at(qkv16, p->c())}, {kV, at(qkv16, 2 * p->c())}, {kO, out16}};
  if (lse.defined()) pointers[kStats] = lse.raw();  // f32 [B, heads, T]: written in place
  run(*g, device, pointers);
  widen_out(out, p->format, out_scratch);
  ++g_forward_runs;
  return true;
}

bool cudnn_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              int64_t heads, const ops::AttentionDropout& dropout, Tensor& dqkv) {
  const Mode m = mode();
  const std::optional<Problem> p = problem_of(qkv, heads, dropout, Kind::backward, m);
  if (!p) return false;
  const int device = qkv.device().index;
  const AttentionGraph* g = graph_for(device, *p, m);
  if (!g) return false;
  std::optional<HalfOperand> qkv_copy, out_copy, dout_copy;
  std::optional<HalfBuffer> dqkv_scratch;
  void* qkv16 = half_in(qkv, p->format, qkv_copy);
  void* out16 = half_in(out, p->format, out_copy);
  void* dout16 = half_in(dout, p->format, dout_copy);
  void* dqkv16 = half_out(dqkv, dqkv_scratch);  // [B, T, 3C]: dq, dk and dv fill every element
  const int64_t c = p->c();
  std::unordered_map<int64_t, void*> pointers{{kQ, at(qkv16, 0)},   {kK, at(qkv16, c)},   {kV, at(qkv16, 2 * c)},
                                              {kO, out16},          {kDout, dout16},      {kStats, lse.raw()},
                                              {kDq, at(dqkv16, 0)}, {kDk, at(dqkv16, c)}, {kDv, at(dqkv16, 2 * c)}};
  run(*g, device, pointers);
  widen_out(dqkv, p->format, dqkv_scratch);
  ++g_backward_runs;
  return true;
}

#else  // no cuDNN frontend: every half-precision call is declined, saying so once

bool cudnn_attention_built() { return false; }

std::optional<std::string> cudnn_attention_check_graph(int64_t, int64_t, int64_t, int64_t, HalfFormat,
                                                       CudnnAttentionKind, int) {
  return std::string("this build has no cuDNN frontend");
}

namespace {
bool decline_unbuilt(const Tensor& qkv, int64_t heads, const ops::AttentionDropout& dropout) {
  if (!half_call(qkv)) return false;
  const std::optional<std::string> why = static_refusal(qkv.dim(2) / 3 / heads, dropout);
  return why ? decline(mode(), *why) : false;
}
}  // namespace

bool cudnn_attention_forward(const Tensor& qkv, int64_t heads, const ops::AttentionDropout& dropout, Tensor&, Tensor&) {
  return decline_unbuilt(qkv, heads, dropout);
}

bool cudnn_attention_backward(const Tensor& qkv, const Tensor&, const Tensor&, const Tensor&, int64_t heads,
                              const ops::AttentionDropout& dropout, Tensor&) {
  return decline_unbuilt(qkv, heads, dropout);
}

#endif

}  // namespace gt::cuda
