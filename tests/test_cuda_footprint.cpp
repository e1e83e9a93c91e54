// A model on a GPU allocates what `gputrain check` counts for it (train/footprint.cpp, sized with the GPU's chains
// and 16-bit weight copies: Model::plan_for): the parameters, gradients, buffers, activations and, under bf16, the
// weights' 16-bit copies, measured by the caching allocator's bytes in use.
#include "cuda_helpers.h"
#include "data/dataset.h"
#include "graph/model.h"
#include "helpers.h"
#include "ops/cuda/context.h"
#include "ops/device_memory.h"
#include "ops/precision.h"
#include "train/experiment.h"
#include "train/footprint.h"
#include "train/setup.h"

#include <catch2/catch.hpp>

using namespace gt;
using namespace gt::test;

TEST_CASE("a CUDA GPT allocates what check counts for it, in fp32 and under bf16 (with 16-bit activations too)",
          "[cuda]") {
  require_gpu();
  // Two blocks of 128 channels over T = 32, vocabulary 128, batch 4: every tensor is a multiple of the allocator's
  // 512-byte size class (biases of 128, layer norm's statistics of 4 · 32 per value, 16-bit copies of 4 · 32 · 128),
  // so the bytes in use are the footprint's to the byte; the bound leaves 512 bytes for each of 64 tensors in case
  // one is not.
  const std::string yaml = gpt_config("cuda", 128, 128, 32, 2, 2, 512, 4);
  // The library workspace is the device's, grow-only, shared by every call: grown first, so that the model's first
  // products do not count it.
  cuda::workspace(0, size_t{256} << 20);
  struct Run {
    std::string precision;
    const char* half_activations;  // GPUTRAIN_HALF_ACTIVATIONS
  };
  for (const Run& run : {Run{"fp32", "off"}, Run{"bf16", "off"}, Run{"bf16", "on"}}) {
    const std::string& precision = run.precision;
    INFO(precision << ", GPUTRAIN_HALF_ACTIVATIONS=" << run.half_activations);
    const ScopedEnvVar env("GPUTRAIN_HALF_ACTIVATIONS", run.half_activations);
    const Experiment exp = parse_experiment_without_data_files(
        apply_override(ConfigNode::load_string(yaml, "gpt.yaml"), "train.precision=" + precision));
    Dataset train;
    train.inputs = Tensor::empty(Shape{0, 32}, DType::f32);
    train.targets = Tensor::empty(Shape{0, 32}, DType::i32);
    train.num_classes = 128;
    Model sized = Model::build(exp.model, Shape{32}, DType::f32, Device::cpu(), exp.seed, /*init_params=*/false);
    sized.plan_for(planned_device(exp.device));
    apply_recompute(exp, sized);
    const Footprint f = training_footprint(exp, sized, train);
    REQUIRE(f.on_cuda);
    Tensor tokens = Tensor::zeros(Shape{4, 32}, DType::f32);
    for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<float>()[i] = static_cast<float>(i * 7 % 128);
    const Tensor x = to_cuda(tokens);
    const size_t start = device_memory_stats(Device::cuda(0)).in_use;
    {
      Model model = Model::build(exp.model, Shape{32}, DType::f32, Device::cuda(0), exp.seed);
      apply_recompute(exp, model);
      model.allocate(f.batch);
      const ProductPrecisionScope scope(exp.train.precision);
      model.forward(x, {.training = true});
      const size_t used = device_memory_stats(Device::cuda(0)).in_use - start;
      const size_t counted = f.param_bytes + f.grad_bytes + f.buffer_bytes + f.activation_bytes + f.half_weight_bytes;
      INFO("allocated " << used << " bytes, check counts " << counted << " (activations " << f.activation_bytes
                        << ", 16-bit weight copies " << f.half_weight_bytes << ")");
      CHECK(used >= counted);
      CHECK(used <= counted + 64 * 512);
      if (precision == "bf16") CHECK(f.half_weight_bytes > 0);
      CHECK(model.activation_dtype() == (std::string(run.half_activations) == "on" ? DType::bf16 : DType::f32));
      CHECK(f.activation_dtype == model.activation_dtype());
    }
  }
}
