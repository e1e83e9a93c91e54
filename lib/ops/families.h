// The op families, listed once. A family is the contract ops/<family>.h, its checks and dispatch ops/<family>.cpp,
// its CPU kernels ops/cpu/<family>.cpp and its CUDA ones ops/cuda/<family>.cu (or .cpp when it only calls
// cuBLASLt/cuDNN). lib/CMakeLists.txt reads the X(...) lines below to build each family's files, and fails naming a
// missing one; tests/test_ops.cpp checks that every family has its files and that every header declaring backend
// entry points is listed here. A new family is one line here (docs/CONTRIBUTING.md, "Adding an op").
#pragma once

#include <array>
#include <string_view>

// X(family, "what it holds"), one per line, in name order (the build reads these lines: keep their form).
#define GT_OP_FAMILIES(X)                                                                       \
  X(activation, "element-wise activations (relu, tanh, sigmoid, gelu) and their derivatives")   \
  X(attention, "causal multi-head attention over a packed qkv, its backward pass and decoding") \
  X(batchnorm, "batch normalisation, plain and synchronised over the ranks")                    \
  X(conv2d, "2-D convolution (cross-correlation), groups and dilation included")                \
  X(dropout, "dropout with a mask regenerated from a Philox draw")                              \
  X(elementwise, "add, scale, the concat block copies")                                         \
  X(embedding, "embedding lookups: rows of a table picked by index values")                     \
  X(gather, "rows by an index list: device-resident batches")                                   \
  X(half_storage, "the 16-bit copies of activations kept for backward under bf16/fp16")         \
  X(layernorm, "layer normalisation over the last dimension")                                   \
  X(loss, "cross-entropy, MSE")                                                                 \
  X(matmul, "matmul, the dense layer's forward and its bias ops")                               \
  X(optim, "gradient norms, scaling, the fused SGD/Adam group steps, the step gate")            \
  X(pool2d, "2-D max and average pooling")                                                      \
  X(softmax, "softmax over rows")

namespace gt::ops {

/// One op family: its name (the base name of its files) and what it holds.
struct OpFamily {
  std::string_view name;
  std::string_view about;
};

#define GT_OP_FAMILY_ROW_(family, about) OpFamily{#family, about},
/// Every op family, in name order.
inline constexpr std::array kOpFamilies{GT_OP_FAMILIES(GT_OP_FAMILY_ROW_)};
#undef GT_OP_FAMILY_ROW_

}  // namespace gt::ops
