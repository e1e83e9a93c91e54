// Epilogues: what an op runs on its own output within the same pass over the data, so that its output never goes
// through memory. The CPU's fused chains (graph/model.h, Model::chains) give batch norm a 2×2 max pool and a relu to
// run this way, a 2×2 max pool a relu, a dense layer a relu or GPT-2's GELU (ops/matmul.h's linear_forward_act: on
// each block of the product as it is finished), and a dense layer or attention its residual sum (linear_forward_add).
// On a CUDA device a dense layer's run in cuBLASLt's epilogue; the others stay the CPU's.
#pragma once

namespace gt::ops {

/// A 2×2, stride-2, unpadded max pool, then relu: either, both or none; or GPT-2's GELU (gelu with approximate:
/// tanh) alone; or `add`: a two-input add of the output and a tensor computed before the head (a residual stream's
/// sum), alone.
struct Epilogue {
  bool max_pool_2x2 = false;
  bool relu = false;
  bool gelu_tanh = false;
  bool add = false;
  bool any() const { return max_pool_2x2 || relu || gelu_tanh || add; }
  bool activates() const { return relu || gelu_tanh; }
  bool operator==(const Epilogue&) const = default;
};

}  // namespace gt::ops

namespace gt::cpu {

/// GPUTRAIN_CPU_FUSE: whether the CPU runs the fused chains, and a CUDA device a dense layer's (`auto`, `on`, unset
/// or empty: yes; `off`: every layer alone, for comparisons); anything else is an Error naming the variable. Read once;
/// the CLI reads it on its main thread before any model is built.
bool env_cpu_fusion();

}  // namespace gt::cpu
