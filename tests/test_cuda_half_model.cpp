// A GPT with its activations in 16 bits between layers (Model::set_activation_dtype) on a GPU: its step against the
// CPU's with the same layout, and against the GPU's f32-activation step, and the same bits on a second run.
#include "cuda_helpers.h"
#include "graph/model.h"
#include "helpers.h"
#include "ops/loss.h"
#include "ops/optim.h"
#include "ops/precision.h"
#include "ops/wide.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

struct GpuHalfStep {
  std::vector<float> out;                 // the model's output, on the host
  std::vector<std::vector<float>> grads;  // every parameter's gradient, on the host
};

// One training forward and backward of a 2-block GPT (heads of 64 channels, which cuDNN's flash attention takes;
// T = 40, not a multiple of its tiles) on `device` with activations in `act`, under `products`.
GpuHalfStep gpu_half_step(Device device, DType act, Precision products) {
  const ConfigNode cfg = ConfigNode::load_string(gpt_layers(96, 128, 40, 2, 2, 512), "m.yaml");
  Model m = Model::build(parse_model_spec(cfg), Shape{40}, DType::f32, device, 5);
  m.set_activation_dtype(act);
  m.allocate(3);
  Tensor tokens = Tensor::empty(Shape{3, 40}, DType::f32);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<float>()[i] = static_cast<float>((i * 11 + 5) % 96);
  Tensor dy_host = Tensor::empty(Shape{3, 40, 96}, DType::f32);
  Rng rng(9, 0);
  for (int64_t i = 0; i < dy_host.numel(); ++i) dy_host.data<float>()[i] = 0.01f * static_cast<float>(rng.normal());
  const Tensor x = device.is_cpu() ? tokens : to_cuda(tokens), dy = device.is_cpu() ? dy_host : to_cuda(dy_host);
  const ProductPrecisionScope scope(products);
  LayerContext ctx;
  ctx.step = 1;
  const Tensor& y = m.forward(x, ctx);
  GpuHalfStep s;
  Tensor y32 = Tensor::empty(y.shape(), DType::f32, device);
  ops::convert(y, y32);  // (the logits are 16-bit with 16-bit activations)
  const Tensor yh = device.is_cpu() ? y32 : to_host(y32);
  s.out.assign(yh.data<float>(), yh.data<float>() + yh.numel());
  m.backward(dy, ctx);
  for (Param* q : m.params()) {
    const Tensor g = device.is_cpu() ? q->grad.clone() : to_host(q->grad);
    s.grads.emplace_back(g.data<float>(), g.data<float>() + g.numel());
  }
  return s;
}

// max |a − b| / max |b| over the output, and over each gradient tensor (the worst of them).
double worst_apart(const GpuHalfStep& a, const GpuHalfStep& b) {
  auto apart = [](const std::vector<float>& u, const std::vector<float>& v) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(u[i]) - v[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(v[i])));
    }
    return scale > 0 ? diff / scale : diff;
  };
  double worst = apart(a.out, b.out);
  for (size_t k = 0; k < a.grads.size(); ++k) worst = std::max(worst, apart(a.grads[k], b.grads[k]));
  return worst;
}

}  // namespace

TEST_CASE("a GPT with 16-bit activations on CUDA is the CPU's within 16 roundings, and repeats its bits", "[cuda]") {
  require_gpu();
  struct Case {
    DType act;
    Precision products;
    double tolerance;  // 16 roundings of the format (2^-9 bf16, 2^-12 fp16), relative to each tensor's largest value
  };
  for (const Case& c : {Case{DType::bf16, Precision::bf16, 16 * std::ldexp(1.0, -9)},
                        Case{DType::f16, Precision::fp16, 16 * std::ldexp(1.0, -12)}}) {
    INFO(dtype_name(c.act));
    const GpuHalfStep gpu = gpu_half_step(Device::cuda(0), c.act, c.products);
    const GpuHalfStep cpu = gpu_half_step(Device::cpu(), c.act, c.products);
    const GpuHalfStep gpu_wide = gpu_half_step(Device::cuda(0), DType::f32, c.products);
    const double vs_cpu = worst_apart(gpu, cpu), vs_wide = worst_apart(gpu, gpu_wide);
    INFO("against the CPU " << vs_cpu << ", against f32 activations on the GPU " << vs_wide);
    CHECK(vs_cpu < c.tolerance);
    CHECK(vs_wide < c.tolerance);
    CHECK(worst_apart(gpu_half_step(Device::cuda(0), c.act, c.products), gpu) == 0);
  }
}

TEST_CASE("cross-entropy reads 16-bit logits on CUDA and writes their gradient over them, as the CPU does", "[cuda]") {
  require_gpu();
  // 37 rows over 50257 classes (GPT-2's vocabulary: columns past every warp's multiple of 32), labels spread out.
  const int64_t rows = 37, k = 50257;
  Tensor host = Tensor::empty(Shape{rows, k}, DType::f32);
  Rng rng(3, 0);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = 4.0f * static_cast<float>(rng.normal());
  Tensor labels = Tensor::empty(Shape{rows}, DType::i32);
  for (int64_t i = 0; i < rows; ++i) labels.data<int32_t>()[i] = static_cast<int32_t>(i * 1361 % k);
  for (const DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    Tensor cpu16 = Tensor::empty(host.shape(), dt);
    ops::convert(host, cpu16);
    Tensor cpu_stats = Tensor::zeros(Shape{2}, DType::f64);
    Tensor gpu16 = Tensor::empty(host.shape(), dt, Device::cuda(0));
    gpu16.copy_from(cpu16);
    Tensor gpu_stats = Tensor::zeros(Shape{2}, DType::f64, Device::cuda(0));
    const Tensor gpu_labels = to_cuda(labels);
    ops::cross_entropy(cpu16, labels, 0.0, 1.0 / rows, cpu16, cpu_stats, {});      // in place, through f32
    ops::cross_entropy(gpu16, gpu_labels, 0.0, 1.0 / rows, gpu16, gpu_stats, {});  // in place, 16 bits
    Tensor back = Tensor::empty(host.shape(), dt);
    back.copy_from(gpu16);
    Tensor a = Tensor::empty(host.shape(), DType::f32), b = Tensor::empty(host.shape(), DType::f32);
    ops::convert(back, a);
    ops::convert(cpu16, b);
    // The same f32 math on the same 16-bit values; the sums' order differs, so a gradient may round to the
    // neighbouring 16-bit value: at most one ulp of the format apart, relative to the element.
    const double ulp = dt == DType::bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
    int64_t far = 0;
    for (int64_t i = 0; i < a.numel(); ++i)
      far += std::fabs(a.data<float>()[i] - b.data<float>()[i]) > ulp * std::fabs(b.data<float>()[i]) + 1e-30;
    CHECK(far == 0);
    const Tensor stats = to_host(gpu_stats);
    CHECK(std::fabs(stats.data<double>()[0] - cpu_stats.data<double>()[0]) < 1e-9 * rows * 12);
    CHECK(stats.data<double>()[1] == cpu_stats.data<double>()[1]);
  }
}

TEST_CASE("the loss scale multiplies a 16-bit gradient on CUDA with the CPU's bits", "[cuda]") {
  require_gpu();
  Tensor host = Tensor::empty(Shape{1000, 37}, DType::f32);
  Rng rng(5, 0);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = 1e-3f * static_cast<float>(rng.normal());
  Tensor scale = Tensor::empty(Shape{1}, DType::f64);
  scale.data<double>()[0] = 65536.0;  // fp16's first loss scale
  for (const DType dt : {DType::f16, DType::bf16}) {
    INFO(dtype_name(dt));
    Tensor cpu = Tensor::empty(host.shape(), dt);
    ops::convert(host, cpu);
    Tensor gpu = Tensor::empty(host.shape(), dt, Device::cuda(0));
    gpu.copy_from(cpu);
    ops::scale_by(cpu, scale);  // through f32
    const Tensor gpu_scale = to_cuda(scale);
    ops::scale_by(gpu, gpu_scale);  // 16 bits in, 16 bits out
    Tensor back = Tensor::empty(host.shape(), dt);
    back.copy_from(gpu);
    // The same f32 product rounded once to the format on both sides: the same bits.
    CHECK(std::memcmp(back.raw(), cpu.raw(), cpu.bytes()) == 0);
  }
}
