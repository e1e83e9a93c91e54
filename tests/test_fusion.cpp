// The CPU's fused chains (graph/model.h's Model::chains, ops/epilogue.h): batch norm with a 2×2 max pool and relu
// as its epilogue, and a 2×2 max pool with relu, against the separate ops bit for bit (every output, statistic and
// gradient) over odd sides, batches past the sums' chunk count, training and evaluation, f32 and f64, each
// instruction-set path this CPU runs and 1 and 2 threads; and the model's side: which chains it forms, that a fused
// model trains to the same bits as an unfused one, and that it stores fewer outputs.
#include "config/config.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "graph/model.h"
#include "helpers.h"
#include "ops/activation.h"
#include "ops/batchnorm.h"
#include "ops/cpu/bf16_gemm.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/sgemm.h"
#include "ops/elementwise.h"
#include "ops/epilogue.h"
#include "ops/matmul.h"
#include "ops/pool2d.h"
#include "ops/precision.h"

#include <catch2/catch.hpp>

#include <array>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

// Values on a grid of quarters, so that pools see ties (the first maximum takes the gradient) and relu sees zeros.
Tensor fusion_grid(const Shape& s, DType dtype, Rng& rng) {
  Tensor t = Tensor::empty(s, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = static_cast<double>(static_cast<int>(rng.uniform(-8, 8))) * 0.25;
    if (dtype == DType::f32)
      t.data<float>()[i] = static_cast<float>(v);
    else
      t.data<double>()[i] = v;
  }
  return t;
}

// A tensor of `v` everywhere: garbage that every element of an output must overwrite.
Tensor fusion_fill(const Shape& s, double v, DType dtype) {
  Tensor t = Tensor::empty(s, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::f32)
      t.data<float>()[i] = static_cast<float>(v);
    else
      t.data<double>()[i] = v;
  }
  return t;
}

std::string fusion_bytes(const Tensor& t) { return std::string(static_cast<const char*>(t.raw()), t.bytes()); }

struct BnState {
  Tensor gamma, beta, running_mean, running_var, save_mean, save_invstd, y, dx, dgamma, dbeta;
};

// Batch norm's parameters and buffers for C channels: γ, β and running statistics away from 1 and 0.
BnState bn_state(int64_t c, DType dtype, Rng& rng) {
  BnState s;
  s.gamma = fusion_grid(Shape{c}, dtype, rng);
  s.beta = fusion_grid(Shape{c}, dtype, rng);
  s.running_mean = fusion_grid(Shape{c}, dtype, rng);
  s.running_var = Tensor::empty(Shape{c}, dtype);
  for (int64_t i = 0; i < c; ++i) {
    if (dtype == DType::f32)
      s.running_var.data<float>()[i] = 0.5f + static_cast<float>(i);
    else
      s.running_var.data<double>()[i] = 0.5 + static_cast<double>(i);
  }
  s.save_mean = Tensor::zeros(Shape{c}, dtype);
  s.save_invstd = Tensor::zeros(Shape{c}, dtype);
  s.dgamma = fusion_grid(Shape{c}, dtype, rng);  // accumulated onto when beta is 1
  s.dbeta = fusion_grid(Shape{c}, dtype, rng);
  return s;
}

// A copy with storage of its own (the ops update the running statistics and accumulate gradients in place).
BnState bn_copy(const BnState& s) {
  return {s.gamma.clone(),
          s.beta.clone(),
          s.running_mean.clone(),
          s.running_var.clone(),
          s.save_mean.clone(),
          s.save_invstd.clone(),
          Tensor(),
          Tensor(),
          s.dgamma.clone(),
          s.dbeta.clone()};
}

std::vector<std::string> bn_results(const BnState& s) {
  std::vector<std::string> out;
  for (const Tensor* t :
       {&s.running_mean, &s.running_var, &s.save_mean, &s.save_invstd, &s.y, &s.dx, &s.dgamma, &s.dbeta})
    out.push_back(t->defined() ? fusion_bytes(*t) : "");
  return out;
}

// batch norm, then a 2×2 max pool and relu as `ep` says, one op after another (the unfused layers' ops).
BnState bn_separate(const Tensor& x, const BnState& start, const ops::Epilogue& ep, bool training, const Tensor& dy,
                    bool want_dx, double beta) {
  BnState s = bn_copy(start);
  const DType dtype = x.dtype();
  Tensor z = Tensor::empty(x.shape(), dtype);
  ops::batchnorm_forward(x, s.gamma, s.beta, s.running_mean, s.running_var, 0.1, 1e-5, training, s.save_mean,
                         s.save_invstd, z);
  const Window2d win{2, 2, 2, 2, 0, 0};
  Tensor m = z;
  if (ep.max_pool_2x2) {
    m = Tensor::empty(Shape{x.dim(0), x.dim(1), x.dim(2) / 2, x.dim(3) / 2}, dtype);
    ops::pool2d_forward(PoolKind::max, z, win, m);
  }
  s.y = m;
  if (ep.relu) {
    s.y = Tensor::empty(m.shape(), dtype);
    ops::activation_forward(Activation::relu, m, s.y);
  }
  Tensor dm = dy;
  if (ep.relu) {
    dm = Tensor::empty(m.shape(), dtype);
    ops::activation_backward(Activation::relu, m, s.y, dy, dm);
  }
  Tensor dz = dm;
  if (ep.max_pool_2x2) {
    dz = Tensor::empty(x.shape(), dtype);
    ops::pool2d_backward(PoolKind::max, z, dm, win, dz);
  }
  s.dx = want_dx ? Tensor::empty(x.shape(), dtype) : Tensor();
  ops::batchnorm_backward(x, s.gamma, s.save_mean, s.save_invstd, dz, training, s.dx, s.dgamma, s.dbeta, beta);
  return s;
}

BnState bn_fused(const Tensor& x, const BnState& start, const ops::Epilogue& ep, bool training, const Tensor& dy,
                 bool want_dx, double beta) {
  BnState s = bn_copy(start);
  const DType dtype = x.dtype();
  Tensor scale = Tensor::zeros(Shape{x.dim(1)}, dtype), shift = Tensor::zeros(Shape{x.dim(1)}, dtype);
  s.y = fusion_fill(dy.shape(), 7.0, dtype);
  ops::batchnorm_epilogue_forward(x, s.gamma, s.beta, s.running_mean, s.running_var, 0.1, 1e-5, training, s.save_mean,
                                  s.save_invstd, scale, shift, ep, s.y);
  s.dx = want_dx ? fusion_fill(x.shape(), 7.0, dtype) : Tensor();
  ops::batchnorm_epilogue_backward(x, s.gamma, s.save_mean, s.save_invstd, scale, shift, ep, s.y, dy, training, s.dx,
                                   s.dgamma, s.dbeta, beta);
  return s;
}

// Calls f(threads, isa) on 1 and 2 threads and on every instruction-set path this CPU runs, then leaves 2 threads
// and the environment's path.
template <class F>
void on_every_path(F&& f) {
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    for (const cpu::CpuIsa isa : {cpu::CpuIsa::avx512, cpu::CpuIsa::avx2, cpu::CpuIsa::baseline}) {
      const ForcedCpuIsa forced(isa);
      if (!forced.ok()) continue;
      CAPTURE(threads, cpu::to_string(isa));
      f(isa);
    }
  }
  set_num_threads(2);
}

}  // namespace

TEST_CASE("batch norm with a pool and relu as its epilogue gives the separate ops' bits, on every path", "[cpu]") {
  const Shape shapes[] = {
      Shape{3, 4, 6, 6},   // even sides
      Shape{2, 3, 5, 7},   // odd sides: a last row and column in no window
      Shape{11, 2, 4, 4},  // more samples than the sums' 8 chunks
      Shape{1, 5, 3, 2},   // one sample, one window row
  };
  const ops::Epilogue epilogues[] = {{.max_pool_2x2 = true}, {.relu = true}, {.max_pool_2x2 = true, .relu = true}};
  for (const DType dtype : {DType::f32, DType::f64})
    for (const Shape& shape : shapes)
      for (const ops::Epilogue& ep : epilogues)
        for (const bool training : {true, false}) {
          CAPTURE(std::string(dtype_name(dtype)), shape.str(), ep.max_pool_2x2, ep.relu, training);
          Rng rng(static_cast<uint64_t>(shape.numel()), 3);
          const Tensor x = fusion_grid(shape, dtype, rng);
          const BnState state = bn_state(shape[1], dtype, rng);
          const Shape out = ep.max_pool_2x2 ? Shape{shape[0], shape[1], shape[2] / 2, shape[3] / 2} : shape;
          const Tensor dy = fusion_grid(out, dtype, rng);
          for (const bool want_dx : {true, false})
            for (const double beta : {0.0, 1.0}) {
              CAPTURE(want_dx, beta);
              const std::vector<std::string> want = bn_results(bn_separate(x, state, ep, training, dy, want_dx, beta));
              on_every_path([&](cpu::CpuIsa isa) {
                // The reference on the same path: the normalisation may fuse a multiply-add where FMA is there.
                const std::vector<std::string> same_path =
                    bn_results(bn_separate(x, state, ep, training, dy, want_dx, beta));
                const std::vector<std::string> got = bn_results(bn_fused(x, state, ep, training, dy, want_dx, beta));
                REQUIRE(got.size() == same_path.size());
                for (size_t k = 0; k < got.size(); ++k) {
                  CAPTURE(k);  // running mean, running var, mean, 1/σ, y, dx, dγ, dβ
                  CHECK(got[k] == same_path[k]);
                }
                if (isa == cpu::best_cpu_isa()) CHECK(got == want);
              });
            }
        }
}

TEST_CASE("a 2x2 max pool with relu as its epilogue gives the separate ops' bits", "[cpu]") {
  for (const DType dtype : {DType::f32, DType::f64})
    for (const Shape& shape : {Shape{2, 3, 6, 8}, Shape{3, 2, 5, 7}, Shape{1, 1, 2, 2}, Shape{4, 8, 29, 29}}) {
      CAPTURE(std::string(dtype_name(dtype)), shape.str());
      Rng rng(static_cast<uint64_t>(shape.numel()), 4);
      const Tensor x = fusion_grid(shape, dtype, rng);
      const Shape out{shape[0], shape[1], shape[2] / 2, shape[3] / 2};
      const Tensor dy = fusion_grid(out, dtype, rng);
      const Window2d win{2, 2, 2, 2, 0, 0};
      on_every_path([&](cpu::CpuIsa) {
        Tensor m = Tensor::empty(out, dtype), y = Tensor::empty(out, dtype), dm = Tensor::empty(out, dtype);
        Tensor dx = Tensor::empty(shape, dtype);
        ops::pool2d_forward(PoolKind::max, x, win, m);
        ops::activation_forward(Activation::relu, m, y);
        ops::activation_backward(Activation::relu, m, y, dy, dm);
        ops::pool2d_backward(PoolKind::max, x, dm, win, dx);
        Tensor fy = fusion_fill(out, 7.0, dtype), fdx = fusion_fill(shape, 7.0, dtype);
        ops::max_pool_relu_forward(x, fy);
        ops::max_pool_relu_backward(x, fy, dy, fdx);
        CHECK(fusion_bytes(fy) == fusion_bytes(y));
        CHECK(fusion_bytes(fdx) == fusion_bytes(dx));
      });
    }
}

namespace {

// Both kinds of chain, a chain that stops at a member with a second reader, a pool that is no 2×2 step, and layers
// that take no part.
const char* const kChainLayers = R"(layers:
  - {type: conv2d, out_channels: 4, kernel_size: 3, padding: 1, bias: false}
  - batchnorm2d
  - relu
  - {type: maxpool2d, kernel_size: 2, name: pooled}
  - {type: conv2d, name: c2, out_channels: 4, kernel_size: 3, padding: 1}
  - {type: maxpool2d, name: s1, kernel_size: 2, stride: 1}
  - {type: relu, name: r1}
  - {type: batchnorm2d, name: bn2}
  - {type: maxpool2d, kernel_size: 2, name: p2}
  - {type: relu, name: r2}
  - {type: conv2d, name: c3, out_channels: 4, kernel_size: 1, inputs: p2}
  - {type: add, inputs: [r2, c3]}
  - {type: maxpool2d, kernel_size: 2}
  - relu
  - flatten
  - {type: linear, out_features: 3}
)";

struct ChainRun {
  std::vector<std::string> states;  // outputs, gradients, parameters and buffers after the passes, as bytes
  int64_t planned = 0;              // buffer_plan's elements
  Model::Chains chains;
};

// Two training passes of `layers` with an SGD step between, then an evaluation forward, over a batch of `batch`
// inputs of `input` and output gradients of `out` (per sample) drawn from `seed`; with the model's state tensors
// when `states` is set.
ChainRun model_run(const char* layers, const Shape& input, const Shape& out, int64_t batch, uint64_t seed, bool fuse,
                   DType dtype, bool states) {
  const ConfigNode cfg = ConfigNode::load_string(layers, "chains.yaml");
  Model m = Model::build(parse_model_spec(cfg), input, dtype, Device::cpu(), 5);
  m.set_fusion(fuse);
  ChainRun r;
  r.chains = m.chains();
  for (const Model::NodeBuffers& b : m.buffer_plan(batch)) r.planned += b.output + b.gradient + b.scratch;
  m.allocate(batch);
  Rng rng(seed, 9);
  const Tensor x = fusion_grid(input.batched(batch), dtype, rng);
  const Tensor dy = fusion_grid(out.batched(batch), dtype, rng);
  for (int pass = 0; pass < 2; ++pass) {
    r.states.push_back(fusion_bytes(m.forward(x, {true, false})));
    m.backward(dy, {true, false});
    for (Param* p : m.params()) {
      r.states.push_back(fusion_bytes(p->grad));
      for (int64_t k = 0; k < p->value.numel(); ++k) {
        if (dtype == DType::f32)
          p->value.data<float>()[k] -= 0.1f * p->grad.data<float>()[k];
        else
          p->value.data<double>()[k] -= 0.1 * p->grad.data<double>()[k];
      }
    }
  }
  r.states.push_back(fusion_bytes(m.forward(x, {false, false})));
  if (states)
    for (const auto& [name, t] : m.state_tensors()) r.states.push_back(fusion_bytes(*t));
  return r;
}

// The fused run's states against the unfused run's, each bit for bit.
void check_same_states(const ChainRun& fused, const ChainRun& apart) {
  REQUIRE(fused.states.size() == apart.states.size());
  for (size_t k = 0; k < fused.states.size(); ++k) {
    CAPTURE(k);
    CHECK(fused.states[k] == apart.states[k]);
  }
}

// kChainLayers over 6 images of 16 × 18 (odd sides after the stride-1 pool).
ChainRun chain_run(bool fuse, DType dtype) {
  return model_run(kChainLayers, Shape{2, 16, 18}, Shape{3}, 6, 9, fuse, dtype, true);
}

}  // namespace

TEST_CASE("a model's fused chains train to the unfused model's bits and store fewer outputs", "[cpu]") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(std::string(dtype_name(dtype)));
    const ChainRun fused = chain_run(true, dtype), apart = chain_run(false, dtype);
    CHECK_FALSE(apart.chains.any());
    REQUIRE(fused.chains.any());
    // Execution order is the list's, with the first relu moved after the max pool that reads it (Model::build):
    // 0 conv, 1 bn, 2 pool, 3 relu, 4 c2, 5 s1, 6 r1, 7 bn2, 8 p2, 9 r2, 10 c3, 11 add, 12 pool, 13 relu, 14 flatten.
    const std::vector<int> tail = fused.chains.tail, head = fused.chains.head;
    CHECK(tail[1] == 3);  // batch norm runs the pool and the relu
    CHECK(head[2] == 1);
    CHECK(head[3] == 1);
    CHECK(tail[5] == -1);  // a stride-1 pool is no 2×2 step: its relu runs alone
    CHECK(head[6] == -1);
    CHECK(tail[7] == 8);  // bn2 runs its pool, whose second reader (c3) keeps the relu out
    CHECK(head[9] == -1);
    CHECK(tail[12] == 13);  // a 2×2 max pool runs its relu
    CHECK(fused.chains.epilogue[1] == ops::Epilogue{.max_pool_2x2 = true, .relu = true});
    CHECK(fused.chains.epilogue[7] == ops::Epilogue{.max_pool_2x2 = true});
    CHECK(fused.chains.epilogue[12] == ops::Epilogue{.relu = true});
    // Unstored, with their gradients: batch norm's and the first pool's outputs, bn2's, the last pool's.
    CHECK(apart.planned - fused.planned == 2 * 6 * 4 * (16 * 18 + 8 * 9 + 7 * 8 + 1 * 2));
    check_same_states(fused, apart);
  }
}

TEST_CASE("fused chains stay off where the model keeps every layer apart", "[cpu]") {
  const ConfigNode cfg = ConfigNode::load_string(R"(layers:
  - {type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}
  - batchnorm2d
  - relu
  - repeat: 2
    layers:
      - {type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}
      - batchnorm2d
      - relu
  - flatten
  - {type: linear, out_features: 3}
)",
                                                 "m.yaml");
  {
    Model m = Model::build(parse_model_spec(cfg), Shape{1, 6, 6}, DType::f32, Device::cpu(), 1);
    CHECK(m.chains().any());
    REQUIRE(m.set_recompute(Recompute::blocks).empty());
    CHECK_FALSE(m.chains().any());
  }
  {
    Model m = Model::build(parse_model_spec(cfg), Shape{1, 6, 6}, DType::f32, Device::cpu(), 1);
    m.set_activation_storage(HalfFormat::bf16);
    CHECK_FALSE(m.chains().any());
  }
  {
    Model m = Model::build(parse_model_spec(cfg), Shape{1, 6, 6}, DType::f32, Device::cpu(), 1);
    m.set_sync([](double*, size_t) {});
    CHECK_FALSE(m.chains().any());
  }
}

TEST_CASE("a dense layer with relu, GELU or a residual add as its epilogue gives the separate ops' bits", "[cpu]") {
  // Rows enough for the f32 kernels' shared B on two threads (320 ≥ 2 · 2 · 64) and few (7); columns past a panel;
  // k past one block (300). Every product path: OpenBLAS's, our AVX-512 and AVX2 kernels, and under bf16 the native
  // and the conversion paths, on 1 and 2 threads; f64 through OpenBLAS. y in place of x·Wᵀ + b, or h kept apart.
  struct Case {
    int64_t rows, in, out;
  };
  const Case cases[] = {{320, 40, 72}, {7, 300, 33}, {64, 16, 130}};
  Rng rng(41, 3);
  for (const DType dtype : {DType::f32, DType::f64})
    for (const Case& c : cases) {
      const Tensor x = fusion_grid(Shape{c.rows, c.in}, dtype, rng), w = fusion_grid(Shape{c.out, c.in}, dtype, rng),
                   b = fusion_grid(Shape{c.out}, dtype, rng);
      auto check = [&](const std::string& where) {
        for (const Activation act : {Activation::relu, Activation::gelu_tanh})
          for (const bool keep_h : {false, true}) {
            CAPTURE(where, std::string(dtype_name(dtype)), c.rows, c.in, c.out, act == Activation::relu, keep_h);
            Tensor want_h = Tensor::empty(Shape{c.rows, c.out}, dtype),
                   want = Tensor::empty(Shape{c.rows, c.out}, dtype);
            ops::linear_forward(x, w, b, want_h);
            ops::activation_forward(act, want_h, want);
            Tensor h = keep_h ? Tensor::empty(Shape{c.rows, c.out}, dtype) : Tensor();
            Tensor y = Tensor::empty(Shape{c.rows, c.out}, dtype);
            ops::linear_forward_act(x, w, b, act, h, y);
            CHECK(fusion_bytes(y) == fusion_bytes(want));
            if (keep_h) CHECK(fusion_bytes(h) == fusion_bytes(want_h));
          }
        // The residual add: linear_forward then add (the residual first, as a residual stream's add lists it).
        CAPTURE(where, std::string(dtype_name(dtype)), c.rows, c.in, c.out);
        const Tensor r = fusion_grid(Shape{c.rows, c.out}, dtype, rng);
        Tensor lin = Tensor::empty(Shape{c.rows, c.out}, dtype), want = Tensor::empty(Shape{c.rows, c.out}, dtype);
        ops::linear_forward(x, w, b, lin);
        ops::add(r, lin, want);
        Tensor y = fusion_fill(Shape{c.rows, c.out}, 7.0, dtype);
        ops::linear_forward_add(x, w, b, r, y);
        CHECK(fusion_bytes(y) == fusion_bytes(want));
        Tensor y_nobias = fusion_fill(Shape{c.rows, c.out}, 7.0, dtype);
        ops::linear_forward(x, w, Tensor(), lin);
        ops::add(r, lin, want);
        ops::linear_forward_add(x, w, Tensor(), r, y_nobias);
        CHECK(fusion_bytes(y_nobias) == fusion_bytes(want));
      };
      for (const int threads : {1, 2}) {
        set_num_threads(threads);
        if (dtype == DType::f64) {
          check("f64, " + std::to_string(threads) + " threads");
          continue;
        }
        for (const cpu::CpuSgemmPath path :
             {cpu::CpuSgemmPath::openblas, cpu::CpuSgemmPath::avx512, cpu::CpuSgemmPath::avx2}) {
          if (!cpu::cpu_sgemm_supported(path)) continue;
          const ForcedSgemmPath forced(path);
          check(cpu::describe(path) + ", " + std::to_string(threads) + " threads");
          const ProductPrecisionScope bf16(Precision::bf16);
          for (const cpu::CpuBf16Path bp : {cpu::CpuBf16Path::native, cpu::CpuBf16Path::conversion}) {
            if (bp == cpu::CpuBf16Path::native && !cpu::cpu_has_native_bf16()) continue;
            const ForcedBf16Path forced_bf16(bp);
            check(cpu::describe(path) + ", bf16 " + cpu::describe(bp) + ", " + std::to_string(threads) + " threads");
          }
        }
      }
      set_num_threads(2);
    }
}

namespace {

// Dense layers chained with relu and GPT-2's GELU over [40, 10] inputs (320 rows at batch 8): a0 → relu, a → relu
// whose output two layers read (b and the add s), b → GELU, d → GELU read by an add, which passes its gradient on (a
// chain whose output gradient is the add's, shared with its other input's), and c → the residual add s; e is plain.
const char* const kDenseChainLayers = R"(layers:
  - {type: linear, name: a0, out_features: 16}
  - {type: relu, name: r0}
  - {type: linear, name: a, out_features: 24}
  - {type: relu, name: ra}
  - {type: linear, name: b, out_features: 72}
  - {type: gelu, name: gb, approximate: tanh}
  - {type: linear, name: c, out_features: 24}
  - {type: add, name: s, inputs: [ra, c]}
  - {type: linear, name: d, out_features: 24}
  - {type: gelu, name: gd, approximate: tanh}
  - {type: add, name: t, inputs: [gd, s]}
  - {type: linear, name: e, out_features: 3}
)";

ChainRun dense_chain_run(bool fuse, DType dtype) {
  return model_run(kDenseChainLayers, Shape{40, 10}, Shape{40, 3}, 8, 19, fuse, dtype, false);
}

}  // namespace

TEST_CASE("a model's dense layers with relu or GELU fused train to the unfused model's bits", "[cpu]") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(std::string(dtype_name(dtype)));
    const ChainRun fused = dense_chain_run(true, dtype), apart = dense_chain_run(false, dtype);
    CHECK_FALSE(apart.chains.any());
    REQUIRE(fused.chains.any());
    // 0 a0, 1 r0, 2 a, 3 ra, 4 b, 5 gb, 6 c, 7 s, 8 d, 9 gd, 10 t, 11 e.
    CHECK(fused.chains.tail[0] == 1);
    CHECK(fused.chains.tail[2] == 3);  // (the tail's output may have any readers)
    CHECK(fused.chains.tail[6] == 7);  // c runs the add s, whose other input is the tail of a's chain
    CHECK(fused.chains.residual[6] == 3);
    CHECK(fused.chains.tail[4] == 5);
    CHECK(fused.chains.tail[8] == 9);  // (no add after an activation: t runs alone)
    CHECK(fused.chains.tail[11] == -1);
    CHECK(fused.chains.epilogue[0] == ops::Epilogue{.relu = true});
    CHECK(fused.chains.epilogue[4] == ops::Epilogue{.gelu_tanh = true});
    CHECK(fused.chains.epilogue[6] == ops::Epilogue{.add = true});
    CHECK(fused.planned < apart.planned);
    check_same_states(fused, apart);
  }
}

namespace {

// Residual adds run by the layer before them, over [8, 16] inputs (64 rows at batch 8): p → s0 whose other input is
// the model's; attention → s1 (other input s0); fc → GELU, then proj → s2 (its inputs listed head last); q → s3
// cannot, as s3's other input (later) comes after q: later runs s3 instead, with q as its residual.
const char* const kResidualLayers = R"(layers:
  - {type: linear, name: p, out_features: 16}
  - {type: add, name: s0, inputs: [input, p]}
  - {type: layernorm, name: ln}
  - {type: causal_self_attention, name: attn, heads: 2}
  - {type: add, name: s1, inputs: [s0, attn]}
  - {type: linear, name: fc, out_features: 32}
  - {type: gelu, name: g, approximate: tanh}
  - {type: linear, name: proj, out_features: 16}
  - {type: add, name: s2, inputs: [proj, s1]}
  - {type: linear, name: q, out_features: 16}
  - {type: linear, name: later, out_features: 16, inputs: s2}
  - {type: add, name: s3, inputs: [q, later]}
  - {type: linear, name: out, out_features: 5}
)";

}  // namespace

TEST_CASE("residual adds run on the product before them train and decode to the unfused model's bits", "[cpu]") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(std::string(dtype_name(dtype)));
    const ChainRun fused = model_run(kResidualLayers, Shape{8, 16}, Shape{8, 5}, 8, 23, true, dtype, false),
                   apart = model_run(kResidualLayers, Shape{8, 16}, Shape{8, 5}, 8, 23, false, dtype, false);
    REQUIRE(fused.chains.any());
    // 0 p, 1 s0, 2 ln, 3 attn, 4 s1, 5 fc, 6 g, 7 proj, 8 s2, 9 q, 10 later, 11 s3, 12 out.
    const Model::Chains& c = fused.chains;
    CHECK(c.tail[0] == 1);
    CHECK(c.residual[0] == -1);
    CHECK(c.tail[3] == 4);
    CHECK(c.residual[3] == 1);
    CHECK(c.tail[5] == 6);
    CHECK(c.tail[7] == 8);
    CHECK(c.residual[7] == 4);
    CHECK(c.tail[9] == -1);
    CHECK(c.tail[10] == 11);
    CHECK(c.residual[10] == 9);
    for (const int head : {0, 3, 7, 10}) CHECK(c.epilogue[static_cast<size_t>(head)] == ops::Epilogue{.add = true});
    // The heads' outputs and gradients are not stored: 8 samples × 8 positions × 16 channels each.
    CHECK(apart.planned - fused.planned == 2 * 8 * 8 * (16 * 4 + 32));
    check_same_states(fused, apart);
  }
  // Decoding position by position runs the same chains, with the residuals' first positions.
  const ConfigNode cfg = ConfigNode::load_string(kResidualLayers, "residual.yaml");
  std::vector<std::string> outs[2];
  for (const bool fuse : {false, true}) {
    Model m = Model::build(parse_model_spec(cfg), Shape{8, 16}, DType::f32, Device::cpu(), 5);
    m.set_fusion(fuse);
    CHECK(m.chains().any() == fuse);
    m.allocate(1);
    Rng rng(29, 1);
    const Tensor x = fusion_grid(Shape{1, 8, 16}, DType::f32, rng);
    for (int64_t t = 0; t < 8; ++t) {
      Tensor xt = Tensor::empty(Shape{1, 1, 16}, DType::f32);
      std::copy_n(x.data<float>() + t * 16, 16, xt.data<float>());
      outs[fuse].push_back(fusion_bytes(m.forward_decode(xt, t)));
    }
  }
  CHECK(outs[0] == outs[1]);
}

TEST_CASE("linear_backward_weight gives matmul's and sum_rows' bits, with and without a bias, beta 0 and 1", "[cpu]") {
  // Values off any grid, so that a sum in another order would show in the low bits.
  Rng rng(31, 2);
  auto values = [&](const Shape& shape, DType dtype) {
    Tensor t = Tensor::empty(shape, dtype);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double v = rng.uniform(-4, 4);
      if (dtype == DType::f32)
        t.data<float>()[i] = static_cast<float>(v);
      else
        t.data<double>()[i] = v;
    }
    return t;
  };
  for (const DType dtype : {DType::f32, DType::f64})
    for (const auto& [rows, in, out] : {std::array<int64_t, 3>{37, 29, 45}, {64, 32, 48}, {1, 3, 1}})
      for (const double beta : {0.0, 1.0})
        for (const bool with_bias : {true, false}) {
          CAPTURE(std::string(dtype_name(dtype)), rows, in, out, beta, with_bias);
          const Tensor dy = values(Shape{rows, out}, dtype), x = values(Shape{rows, in}, dtype);
          const Tensor dw0 = values(Shape{out, in}, dtype), db0 = values(Shape{out}, dtype);
          Tensor dw_apart = dw0.clone(), db_apart = db0.clone(), dw = dw0.clone();
          Tensor db = with_bias ? db0.clone() : Tensor();
          ops::matmul(dy, true, x, false, dw_apart, beta);
          if (with_bias) ops::sum_rows(dy, db_apart, beta);
          ops::linear_backward_weight(dy, x, dw, db, beta);
          CHECK(fusion_bytes(dw) == fusion_bytes(dw_apart));
          if (with_bias) CHECK(fusion_bytes(db) == fusion_bytes(db_apart));
        }
}

TEST_CASE("linear_backward gives the bits of its ops apart, with a frozen weight, no bias or no input gradient",
          "[cpu]") {
  Rng rng(33, 2);
  auto values = [&](const Shape& shape) {
    Tensor t = Tensor::empty(shape, DType::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng.uniform(-4, 4));
    return t;
  };
  const int64_t rows = 37, in = 29, out = 45;
  const Tensor dy = values(Shape{rows, out}), x = values(Shape{rows, in}), w = values(Shape{out, in});
  const Tensor dw0 = values(Shape{out, in}), db0 = values(Shape{out});
  for (const double beta : {0.0, 1.0})
    for (const bool weight : {true, false})
      for (const bool bias : {true, false})
        for (const bool input : {true, false}) {
          CAPTURE(beta, weight, bias, input);
          Tensor dw_apart = dw0.clone(), db_apart = db0.clone(), dx_apart = Tensor::empty(x.shape(), DType::f32);
          if (weight) ops::matmul(dy, true, x, false, dw_apart, beta);
          if (bias) ops::sum_rows(dy, db_apart, beta);
          ops::matmul(dy, false, w, false, dx_apart, 0.0);
          Tensor dw = weight ? dw0.clone() : Tensor(), db = bias ? db0.clone() : Tensor();
          Tensor dx = input ? Tensor::empty(x.shape(), DType::f32) : Tensor();
          ops::linear_backward(dy, x, nullptr, w, dw, db, dx, beta);
          if (weight) CHECK(fusion_bytes(dw) == fusion_bytes(dw_apart));
          if (bias) CHECK(fusion_bytes(db) == fusion_bytes(db_apart));
          if (input) CHECK(fusion_bytes(dx) == fusion_bytes(dx_apart));
        }
}
