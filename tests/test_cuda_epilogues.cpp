// cuBLASLt's epilogues for the CUDA dense layer (ops/cuda/matmul.cu) against the CPU's ops on the same seeded
// inputs: linear_forward's bias (CUBLASLT_EPILOGUE_BIAS), linear_forward_act's relu and GELU (RELU_BIAS, GELU_BIAS,
// GELU_AUX_BIAS with GELU's input kept in h), linear_forward_add's residual (C = r, D = y) and
// linear_backward_weight's bias gradient (BGRADB), with sentinels around every output; and a small GPT-like model
// on the device trained with the dense layers' chains (graph/model.h's Model::chains) and without. Out-feature counts
// of 45 and 3 take the fallback for GELU_AUX (its leading dimension must be a multiple of 8), 48 the epilogue: both
// must give the CPU's numbers. Without a usable GPU every case exits with ctest's skip code (77) after printing why.
//
// Tolerances. An output is a sum of K products |x·w| ≤ 16 (inputs in [-4, 4)) plus the bias: the two sides add the
// same terms in different orders, and, as in test_cuda_dnn.cpp, |Δ| ≤ 1e-5 · K · 16 in f32 (≥ 10× what such sums
// show, far below the ≈ 16/3 a missing, doubled or misplaced term costs) and 1e-13 · K · 16 in f64; the bias adds
// one rounding of a value ≤ 4 + |sum|, inside that. Under tf32 the tensor cores round both operands to 10 mantissa
// bits and the CPU multiplies in fp32: up to 2·2⁻¹¹ of each term, K · 16 · 2⁻¹⁰. Under bf16 and fp16 both sides
// multiply the same rounded operands exactly and sum in f32: the f32 bound. relu moves nothing by more than its
// input moved. GELU (|GELU'| < 1.13) moves it by at most 1.2×, and cuBLASLt evaluates its own tanh, which may be
// the hardware's approximation (relative error about 2⁻¹¹): ½·|h|·|Δtanh| ≤ 2⁻¹⁰·|h| more, in f32 (in f64 our kernel
// runs GELU after the bias epilogue: 1e-12·|h|).
// A residual adds one rounding of a value ≤ 4 + |sum|, inside the product's bound. The bias gradient is a sum of R
// rows |dy| ≤ 4: 1e-5 · R · 4 in f32 and bf16/fp16 (where sum_rows runs), 1e-13 · R · 4 in f64, and R · 4 · 2⁻¹⁰
// under tf32, in case cuBLASLt sums the operand it rounded.
#include "config/config.h"
#include "cuda_helpers.h"
#include "graph/model.h"
#include "ops/cuda/half_scratch.h"
#include "ops/epilogue.h"
#include "ops/half_storage.h"
#include "ops/matmul.h"
#include "ops/precision.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

template <class T>
constexpr DType kDType = std::is_same_v<T, float> ? DType::f32 : DType::f64;

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

template <class T>
void check_linear_act(const Dims& d, Activation act, bool keep_h, bool with_bias, std::optional<Precision> p,
                      uint64_t seed) {
  INFO("linear_forward_act " << (act == Activation::relu ? "relu" : "gelu_tanh") << (keep_h ? " keeping h" : "")
                             << " rows " << d.rows << " in " << d.in << " out " << d.out
                             << (with_bias ? " bias" : " no bias") << " "
                             << (std::is_same_v<T, double> ? "f64" : precision_name(p).c_str()));
  const Tensor x = as<T>(seeded(Shape{d.rows, d.in}, seed)), w = as<T>(seeded(Shape{d.out, d.in}, seed + 1));
  const Tensor bias = with_bias ? as<T>(seeded(Shape{d.out}, seed + 2)) : Tensor();
  const Shape ys{d.rows, d.out};
  Tensor cpu_y = Tensor::empty(ys, kDType<T>), cpu_h = Tensor::empty(ys, kDType<T>);
  GuardedT<T> y(ys, kNaN), h(ys, kNaN);
  {
    const MaybeScope scope(p);
    ops::linear_forward_act(x, w, bias, act, cpu_h, cpu_y);  // (the CPU's h is its sum either way)
    Tensor hd = keep_h ? h.inner : Tensor();
    ops::linear_forward_act(to_cuda(x), to_cuda(w), with_bias ? to_cuda(bias) : Tensor(), act, hd, y.inner);
  }
  const double tol = product_tol<T>(d.in, p);
  if (keep_h) check_close(h.host_checked(), cpu_h, tol, 0);  // GELU's input: the product and bias
  const Tensor got = y.host_checked();
  const double act_rel = act == Activation::relu ? 0 : std::is_same_v<T, double> ? 1e-12 : 0x1p-10;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.data<T>()[i], b = cpu_y.data<T>()[i], hi = cpu_h.data<T>()[i];
    INFO("element " << i << ": cuda " << a << " cpu " << b << " h " << hi);
    REQUIRE(std::abs(a - b) <= (act == Activation::relu ? 1.0 : 1.2) * tol + act_rel * std::abs(hi));
  }
}

template <class T>
void check_linear_add(const Dims& d, bool with_bias, std::optional<Precision> p, uint64_t seed) {
  INFO("linear_forward_add rows " << d.rows << " in " << d.in << " out " << d.out << (with_bias ? " bias" : " no bias")
                                  << " " << (std::is_same_v<T, double> ? "f64" : precision_name(p).c_str()));
  const Tensor x = as<T>(seeded(Shape{d.rows, d.in}, seed)), w = as<T>(seeded(Shape{d.out, d.in}, seed + 1));
  const Tensor bias = with_bias ? as<T>(seeded(Shape{d.out}, seed + 2)) : Tensor();
  const Tensor r = as<T>(seeded(Shape{d.rows, d.out}, seed + 3));
  Tensor cpu = Tensor::empty(r.shape(), kDType<T>);
  GuardedT<T> y(r.shape(), kNaN), rd(r.shape());
  rd.inner.copy_from(r);
  {
    const MaybeScope scope(p);
    ops::linear_forward_add(x, w, bias, r, cpu);
    ops::linear_forward_add(to_cuda(x), to_cuda(w), with_bias ? to_cuda(bias) : Tensor(), rd.inner, y.inner);
  }
  check_close(y.host_checked(), cpu, product_tol<T>(d.in, p), 0);
  check_close(rd.host_checked(), r, 0, 0);  // r is read, never written
}

template <class T>
void check_backward_weight(const Dims& d, bool with_bias, double beta, std::optional<Precision> p, uint64_t seed) {
  INFO("linear_backward_weight rows " << d.rows << " in " << d.in << " out " << d.out
                                      << (with_bias ? " bias" : " no bias") << " beta " << beta << " "
                                      << (std::is_same_v<T, double> ? "f64" : precision_name(p).c_str()));
  const Tensor dy = as<T>(seeded(Shape{d.rows, d.out}, seed)), x = as<T>(seeded(Shape{d.rows, d.in}, seed + 1));
  const Tensor dw0 = as<T>(seeded(Shape{d.out, d.in}, seed + 2)), db0 = as<T>(seeded(Shape{d.out}, seed + 3));
  Tensor cpu_dw = dw0.clone(), cpu_db = db0.clone();
  // With beta 0 the old gradients must not be read: they start as NaN.
  GuardedT<T> dw(dw0.shape(), kNaN), db(db0.shape(), kNaN), db_apart(db0.shape(), kNaN);
  if (beta != 0) {
    dw.inner.copy_from(dw0);
    db.inner.copy_from(db0);
    db_apart.inner.copy_from(db0);
  }
  const Tensor dyd = to_cuda(dy);
  {
    const MaybeScope scope(p);
    Tensor cpu_db_or_none = with_bias ? cpu_db : Tensor(), db_or_none = with_bias ? db.inner : Tensor();
    ops::linear_backward_weight(dy, x, cpu_dw, cpu_db_or_none, beta);
    ops::linear_backward_weight(dyd, to_cuda(x), dw.inner, db_or_none, beta);
    ops::sum_rows(dyd, db_apart.inner, beta);  // the kernel the epilogue replaces
  }
  check_close(dw.host_checked(), cpu_dw, product_tol<T>(d.rows, p), 0);
  if (!with_bias) {  // no bias gradient asked for: db untouched (NaN, or db0 when accumulating)
    const Tensor untouched = db.host_checked(true);
    for (int64_t i = 0; i < untouched.numel(); ++i)
      CHECK((beta == 0 ? std::isnan(untouched.data<T>()[i]) : untouched.data<T>()[i] == db0.data<T>()[i]));
    return;
  }
  const double r4 = static_cast<double>(d.rows) * 4;
  const double tol = std::is_same_v<T, double> ? 1e-13 * r4 : p == Precision::tf32 ? 0x1p-10 * r4 : 1e-5 * r4;
  const Tensor got = db.host_checked();
  check_close(got, cpu_db, tol, 0);
  check_close(got, db_apart.host_checked(), tol, 0);
}

const std::optional<Precision> kPrecisions[] = {std::nullopt, Precision::tf32, Precision::bf16, Precision::fp16};

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

TEST_CASE("CUDA linear_forward_act (relu, GELU, GELU keeping its input h) matches the CPU, epilogue and fallback",
          "[cuda]") {
  require_gpu();
  uint64_t seed = 7100;
  for (const Dims& d : kDims)
    for (const Activation act : {Activation::relu, Activation::gelu_tanh})
      for (const bool keep_h : {true, false})
        for (const bool with_bias : {true, false}) {
          for (const std::optional<Precision> p : kPrecisions)
            check_linear_act<float>(d, act, keep_h, with_bias, p, seed += 3);
          check_linear_act<double>(d, act, keep_h, with_bias, std::nullopt, seed += 3);
        }
}

TEST_CASE("CUDA linear_forward_add adds the residual r as cuBLASLt's C into y and matches the CPU", "[cuda]") {
  require_gpu();
  uint64_t seed = 7300;
  for (const Dims& d : kDims)
    for (const bool with_bias : {true, false}) {
      for (const std::optional<Precision> p : kPrecisions) check_linear_add<float>(d, with_bias, p, seed += 4);
      check_linear_add<double>(d, with_bias, std::nullopt, seed += 4);
    }
}

TEST_CASE("CUDA linear_backward_weight sums db in cuBLASLt's BGRADB epilogue to sum_rows' and the CPU's numbers",
          "[cuda]") {
  require_gpu();
  uint64_t seed = 7500;
  for (const Dims& d : kDims)
    for (const bool with_bias : {true, false})
      for (const double beta : {0.0, 1.0}) {  // beta 1 (accumulating micro-batches) keeps sum_rows
        for (const std::optional<Precision> p : kPrecisions)
          check_backward_weight<float>(d, with_bias, beta, p, seed += 4);
        check_backward_weight<double>(d, with_bias, beta, std::nullopt, seed += 4);
      }
}

namespace {

// A GPT-like stack over [8, 16] inputs: p → the residual s0 with the model's input; layer norm and attention → s1
// (attention's residual stays apart on a GPU); fc → GELU (40 wide: GELU_AUX_BIAS); proj → the residual s2; fc2 → relu
// (20 wide); out. Nodes 0 p, 1 s0, 2 ln, 3 attn, 4 s1, 5 fc, 6 g, 7 proj, 8 s2, 9 fc2, 10 r, 11 out.
const char* const kGptLike = R"(layers:
  - {type: linear, name: p, out_features: 16}
  - {type: add, name: s0, inputs: [input, p]}
  - {type: layernorm, name: ln}
  - {type: causal_self_attention, name: attn, heads: 2}
  - {type: add, name: s1, inputs: [s0, attn]}
  - {type: linear, name: fc, out_features: 40}
  - {type: gelu, name: g, approximate: tanh}
  - {type: linear, name: proj, out_features: 16}
  - {type: add, name: s2, inputs: [proj, s1]}
  - {type: linear, name: fc2, out_features: 20}
  - {type: relu, name: r}
  - {type: linear, name: out, out_features: 5}
)";

struct GptLikeRun {
  std::vector<double> losses;
  Model::Chains chains;
  int64_t planned = 0;  // buffer_plan's elements
};

// Five SGD steps (learning rate 0.2) of the model on the device on one batch of 6 samples, with the half mean
// squared error against a fixed target: the loss before each step.
GptLikeRun train_gpt_like(bool fuse) {
  const ConfigNode cfg = ConfigNode::load_string(kGptLike, "gpt_like.yaml");
  const Shape input{8, 16}, out{8, 5};
  const int64_t batch = 6;
  Model m = Model::build(parse_model_spec(cfg), input, DType::f32, Device::cuda(0), 11);
  m.set_fusion(fuse);
  GptLikeRun run;
  run.chains = m.chains();
  for (const Model::NodeBuffers& b : m.buffer_plan(batch)) run.planned += b.output + b.gradient + b.scratch;
  m.allocate(batch);
  const Tensor x = to_cuda(seeded(input.batched(batch), 41, -1, 1)), target = seeded(out.batched(batch), 42, -1, 1);
  const auto n = static_cast<double>(target.numel());
  for (int step = 0; step < 5; ++step) {
    const Tensor y = to_host(m.forward(x, {true, false}));
    Tensor dy = Tensor::empty(y.shape(), DType::f32);
    double loss = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      const double e = static_cast<double>(y.data<float>()[i]) - target.data<float>()[i];
      loss += 0.5 * e * e / n;
      dy.data<float>()[i] = static_cast<float>(e / n);
    }
    run.losses.push_back(loss);
    m.backward(to_cuda(dy), {true, false});
    for (Param* prm : m.params()) {
      Tensor v = to_host(prm->value);
      const Tensor g = to_host(prm->grad);
      for (int64_t k = 0; k < v.numel(); ++k) v.data<float>()[k] -= 0.2f * g.data<float>()[k];
      prm->value.copy_from(v);
    }
  }
  return run;
}

}  // namespace

TEST_CASE("a GPT-like model on CUDA forms the dense layers' chains and trains to the unfused model's losses",
          "[cuda]") {
  require_gpu();
  const GptLikeRun fused = train_gpt_like(true), apart = train_gpt_like(false);
  REQUIRE(fused.chains.any());
  CHECK_FALSE(apart.chains.any());
  const Model::Chains& c = fused.chains;
  CHECK(c.tail[0] == 1);
  CHECK(c.residual[0] == -1);
  CHECK(c.tail[3] == -1);  // attention's residual add is the CPU's alone
  CHECK(c.tail[5] == 6);
  CHECK(c.epilogue[5] == ops::Epilogue{.gelu_tanh = true});
  CHECK(c.tail[7] == 8);
  CHECK(c.residual[7] == 4);
  CHECK(c.tail[9] == 10);
  CHECK(c.epilogue[9] == ops::Epilogue{.relu = true});
  CHECK(fused.planned < apart.planned);
  // The fused products may take other cuBLASLt kernels (other orders of the f32 sums, ≈ 1e-6 relative) and
  // cuBLASLt's own GELU (its tanh possibly the hardware's approximation, up to 2⁻¹¹ relative in each activation):
  // each loss within 1e-3 of the unfused one, relative. A missing bias, residual or activation changes outputs of
  // order 1 and the loss far more than that; a wrong gradient shows in the steps after the first.
  REQUIRE(fused.losses.size() == apart.losses.size());
  for (size_t i = 0; i < fused.losses.size(); ++i) {
    INFO("step " << i << ": fused " << fused.losses[i] << " apart " << apart.losses[i]);
    CHECK(std::abs(fused.losses[i] - apart.losses[i]) <= 1e-3 * apart.losses[i]);
  }
  CHECK(apart.losses.back() < apart.losses.front());  // the steps train
}

TEST_CASE("CUDA linear_backward rounds dy to 16 bits once for both products, with the bits of its ops apart",
          "[cuda]") {
  require_gpu();
  const int64_t rows = 64, in = 32, out = 48;
  const Tensor dy = to_cuda(seeded(Shape{rows, out}, 91)), x = to_cuda(seeded(Shape{rows, in}, 92));
  const Tensor w = to_cuda(seeded(Shape{out, in}, 93)), db0 = to_cuda(seeded(Shape{out}, 94));
  for (const Precision p : {Precision::fp32, Precision::tf32, Precision::bf16, Precision::fp16}) {
    INFO(to_string(p));
    const ProductPrecisionScope scope(p);
    Tensor dw_apart = Tensor::empty(w.shape(), DType::f32, w.device()), db_apart = to_cuda(to_host(db0));
    Tensor dx_apart = Tensor::empty(x.shape(), DType::f32, x.device());
    const int64_t before = cuda::half_operand_copies();
    ops::linear_backward_weight(dy, x, dw_apart, db_apart, 1.0);
    ops::matmul(dy, false, w, false, dx_apart, 0.0);
    const int64_t apart_copies = cuda::half_operand_copies() - before;
    Tensor dw = Tensor::empty(w.shape(), DType::f32, w.device()), db = to_cuda(to_host(db0));
    Tensor dx = Tensor::empty(x.shape(), DType::f32, x.device());
    const int64_t start = cuda::half_operand_copies();
    ops::linear_backward(dy, x, nullptr, w, dw, db, dx, 1.0);
    const int64_t copies = cuda::half_operand_copies() - start;
    // dy, x and w each once (no forward made w's copy in this scope), where the ops apart round dy twice.
    CHECK(copies == (half_format(p) ? 3 : 0));
    CHECK(apart_copies == (half_format(p) ? 4 : 0));
    for (const auto& [mine, theirs] : {std::pair{&dw, &dw_apart}, {&db, &db_apart}, {&dx, &dx_apart}}) {
      const Tensor a = to_host(*mine), b = to_host(*theirs);
      CHECK(std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.bytes())) == 0);
    }
  }
}

TEST_CASE("CUDA matmul_half_b reads a 16-bit matrix as the product's operand, with the bits of matmul on it widened",
          "[cuda]") {
  require_gpu();
  const int64_t rows = 64, in = 32, out = 48;  // dW (out, in) = dyᵀ (out, rows) · x (rows, in)
  const Tensor dy = to_cuda(seeded(Shape{rows, out}, 95)), x = to_cuda(seeded(Shape{rows, in}, 96));
  for (const HalfFormat format : {HalfFormat::bf16, HalfFormat::fp16}) {
    const auto storage = allocate_storage(static_cast<size_t>(x.numel()) * 2, x.device());
    ops::pack_activation(format, x, storage->ptr);
    Tensor widened = Tensor::empty(x.shape(), DType::f32, x.device());
    ops::unpack_activation(format, storage->ptr, widened);
    // The precision of the copy's format (its elements are the operand as they are), and fp32 (widened first).
    for (const Precision p : {format == HalfFormat::bf16 ? Precision::bf16 : Precision::fp16, Precision::fp32}) {
      INFO((format == HalfFormat::bf16 ? "bf16" : "fp16") << " copy under " << to_string(p));
      const ProductPrecisionScope scope(p);
      for (const double beta : {0.0, 1.0}) {
        Tensor apart = to_cuda(seeded(Shape{out, in}, 97)), mine = to_cuda(to_host(apart));
        ops::matmul(dy, true, widened, false, apart, beta);
        ops::matmul_half_b(dy, true, {storage->ptr, format, rows, in}, mine, beta);
        const Tensor a = to_host(apart), b = to_host(mine);
        CHECK(std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.bytes())) == 0);
      }
    }
  }
}

TEST_CASE("a CUDA dense stack under bf16 reads its inputs' 16-bit copies in backward, to the widened gradients' bits",
          "[cuda]") {
  require_gpu();
  // Deep enough that 16-bit copies pay for the working buffers (Model::half_plan keeps them: `gputrain check` of the
  // same layers at batch 16 says bf16).
  const char* layers = R"(layers:
  - {type: linear, out_features: 128}
  - {type: gelu, approximate: tanh}
  - {type: linear, out_features: 128}
  - {type: linear, out_features: 128}
  - {type: linear, out_features: 128}
  - {type: linear, out_features: 128}
  - {type: linear, out_features: 8}
)";
  const Shape input{32};
  const int64_t batch = 16;
  const Tensor x = to_cuda(seeded(input.batched(batch), 51, -1, 1));
  const Tensor dy = to_cuda(seeded(Shape{batch, 8}, 52, -1, 1));
  struct Run {
    std::vector<Tensor> grads;
    int64_t widened = 0;
  };
  const auto run = [&](bool widen_everything) {
    Model m = Model::build(parse_model_spec(ConfigNode::load_string(layers, "m.yaml")), input, DType::f32,
                           Device::cuda(0), 5);
    m.set_activation_storage(HalfFormat::bf16);
    REQUIRE(m.activation_storage() == HalfFormat::bf16);
    m.set_widen_everything(widen_everything);
    m.allocate(batch);
    const ProductPrecisionScope scope(Precision::bf16);
    LayerContext ctx;
    ctx.training = true;
    m.forward(x, ctx);
    m.backward(dy, ctx);
    Run r;
    for (Param* q : m.params()) r.grads.push_back(to_host(q->grad));
    r.widened = m.widened_elements();
    return r;
  };
  const Run widened = run(true), direct = run(false);
  REQUIRE(widened.grads.size() == direct.grads.size());
  for (size_t k = 0; k < direct.grads.size(); ++k) {
    INFO("parameter " << k);
    CHECK(std::memcmp(direct.grads[k].raw(), widened.grads[k].raw(), static_cast<size_t>(direct.grads[k].bytes())) ==
          0);
  }
  // The dense layers after the first read their inputs' copies as they are: only GELU's input is widened.
  CHECK(direct.widened < widened.widened);
}
