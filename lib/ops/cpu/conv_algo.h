// How the CPU multiplies a convolution (ops/cpu/conv2d.cpp): im2col + GEMM, or Winograd's F(2×2, 3×3) for the 3×3
// stride-1 windows of most CNNs.
//
// im2col copies each image's patches into a (C·9) × (oh·ow) matrix and runs one GEMM per image: 2·O·C·9 FLOPs per
// output pixel, and nine copies of the input through memory. F(2×2, 3×3) (Lavin and Gray, 2015) computes each 2×2
// output tile from its 4×4 input patch with 16 products per (output, input) channel pair instead of 36: the input's
// and the weights' tiles are transformed (additions only, and halves for the weights), 16 GEMMs multiply them over a
// group of images at once, and the products are transformed back. Its backward pass is the same transforms'
// adjoints: dx through 16 GEMMs with the weights' tiles transposed, dw through 16 GEMMs summing over the tiles.
// The rounding differs from im2col's (each output is a sum of 16 transformed products, not of C·9 direct ones); tests
// bound the difference (tests/test_conv_algos.cpp).
#pragma once

#include "core/tensor.h"
#include "ops/math.h"

#include <optional>
#include <string>

namespace gt::cpu {

enum class CpuConvAlgo { im2col, winograd };
std::string to_string(CpuConvAlgo algo);

/// What GPUTRAIN_CPU_CONV asks for: nullopt for auto (or unset), im2col or winograd; anything else is an Error naming
/// the variable. Read once; the CLI reads it on its main thread before any kernel runs.
std::optional<CpuConvAlgo> env_cpu_conv_algo();

/// Tests and benchmarks: take `algo` wherever it applies from now on (nullopt: the environment's choice again).
/// Process-wide: call it where no convolution runs.
void force_cpu_conv_algo(std::optional<CpuConvAlgo> algo);

/// Whether Winograd's F(2×2, 3×3) can compute this convolution: f32, a 3×3 window at stride 1 without dilation, one
/// group (any padding, any size).
bool winograd_applies(DType dtype, const Shape& w, const Window2d& win, int64_t groups);

/// The algorithm a conv2d with input x and weights w runs on the CPU now, under the calling thread's product
/// precision: winograd where it applies and is forced or asked for, or (auto) where both channel counts are at least
/// kWinogradMinChannels, an image has at most kWinogradMaxTiles output tiles and the products are f32 (fp32 or tf32:
/// half precisions keep im2col, whose bf16 kernels round the operands); im2col otherwise.
CpuConvAlgo cpu_conv_algo(DType dtype, const Shape& x, const Shape& w, const Window2d& win, int64_t groups);

/// Below this many input or output channels auto keeps im2col: a first layer's 1 or 3 input channels make the 16
/// GEMMs' inner dimension too short to pay for the transforms (bench/conv_rate.cpp, 1 and 2 threads: 2-4× slower at
/// one input channel, 0.96-1.35× at 8, 1.14-1.54× faster from 16 up).
inline constexpr int64_t kWinogradMinChannels = 16;
/// Above this many 2×2 output tiles per image (outputs larger than 64 × 64) auto keeps im2col: a group of the 16
/// GEMMs holds at least one whole image, so its scratch (16·(C + O) floats per tile) and the products' width grow
/// with the image, and no such layer has been measured (bench/conv_rate.cpp's are 7×7 to 28×28).
inline constexpr int64_t kWinogradMaxTiles = 1024;

}  // namespace gt::cpu
