// Inference throughput of a config's model on the CPU: forward passes in evaluation mode over random inputs (uniform
// in [0, 1), or token ids uniform over the vocabulary for token data). Prints one JSON line. Usage: bench_infer_rate
// CONFIG BATCH THREADS SECONDS
#include "bench_main.h"
#include "core/parallel.h"
#include "graph/model.h"
#include "train/experiment.h"
#include "train/setup.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

static int run(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s CONFIG BATCH THREADS SECONDS\n", argv[0]);
    return 2;
  }
  const int64_t batch = std::atoll(argv[2]);
  gt::set_num_threads(std::atoi(argv[3]));
  const double seconds = std::atof(argv[4]);
  const gt::Experiment exp = gt::parse_experiment(gt::load_config(argv[1], {}));
  const gt::LoadedData data = gt::load_data(exp);
  gt::Model model = gt::Model::build(exp.model, data.train.input_shape(), gt::DType::f32, gt::Device::cpu(), 1);
  model.allocate(batch);
  gt::Tensor x = gt::Tensor::empty(data.train.input_shape().batched(batch), gt::DType::f32);
  gt::Rng rng(1, 1);
  const int64_t vocab = data.train.tokens ? data.train.tokens->vocab_size() : 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] =
        vocab > 0 ? static_cast<float>(std::min<int64_t>(static_cast<int64_t>(rng.uniform() * vocab), vocab - 1))
                  : static_cast<float>(rng.uniform());
  const gt::LayerContext ctx{false, false, 0};
  model.forward(x, ctx);  // warm-up: page faults and scratch buffers
  int64_t passes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double dt = 0;
  while (dt < seconds) {
    model.forward(x, ctx);
    ++passes;
    dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::printf("{\"samples_per_sec\": %.1f, \"forward_flops\": %lld}\n", static_cast<double>(passes * batch) / dt,
              static_cast<long long>(model.forward_flops()));
  return 0;
}

int main(int argc, char** argv) {
  return gt::bench::guarded_main("bench_infer_rate", [&] { return run(argc, argv); });
}
