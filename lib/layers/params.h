// Helpers shared by layer files: parameter creation as PyTorch initialises it, and window arguments.
#pragma once

#include "layers/layer.h"
#include "ops/math.h"

namespace gt {

/// A parameter drawn from U(−bound, bound) with a zeroed gradient.
Param uniform_param(const char* name, const Shape& shape, Rng& rng, double bound, DType dtype, Device device);
/// A parameter drawn from N(0, std²) with a zeroed gradient.
Param normal_param(const char* name, const Shape& shape, Rng& rng, double std, DType dtype, Device device);
/// A parameter filled with `value` (batch-norm scale 1, shift 0) with a zeroed gradient.
Param constant_param(const char* name, const Shape& shape, double value, DType dtype, Device device);
/// Where a backward writes `p`'s gradient: p.grad, or for a frozen parameter (train.freeze) `discard`, made once as
/// large as p, for the normalisations' ops, which compute the per-channel scale and shift gradients in the same pass
/// as the input's (a few elements per channel, thrown away).
Tensor& grad_or_discard(Param& p, Tensor& discard);
/// A tensor filled with `value` (running statistics).
Tensor constant_tensor(const Shape& shape, double value, DType dtype, Device device);

/// `key: 3` or `key: [3, 5]` → {3, 3} or {3, 5}; each ≥ min.
std::pair<int64_t, int64_t> read_pair(const ConfigNode& cfg, const char* key, std::pair<int64_t, int64_t> fallback,
                                      int64_t min);
YAML::Node pair_node(std::pair<int64_t, int64_t> p);

}  // namespace gt
