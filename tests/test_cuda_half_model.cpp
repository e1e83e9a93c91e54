// A GPT with its activations in 16 bits between layers (Model::set_activation_dtype) on a GPU: its step against the
// CPU's with the same layout, and against the GPU's f32-activation step, and the same bits on a second run.
#include "cuda_helpers.h"
#include "graph/model.h"
#include "helpers.h"
#include "ops/precision.h"

#include <catch2/catch.hpp>

#include <cmath>
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
  const Tensor yh = device.is_cpu() ? y.clone() : to_host(y);
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
