// Checkpoint cost of a config's model: save and load speed (MB/s) against a plain write + fsync of the same number
// of bytes measured in the same run, and the share of training time a checkpoint takes at the default interval
// (one per epoch). Prints one JSON line.
// Usage: bench_checkpoint_cost CONFIG DIR [ROUNDS] [THREADS]
#include "bench_main.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "graph/model.h"
#include "optim/optimizer.h"
#include "timing.h"
#include "train/checkpoint.h"
#include "train/experiment.h"
#include "train/loss.h"
#include "train/setup.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace {

using gt::bench::Clock;
using gt::bench::median;
using gt::bench::since;

// The reference: one file of `bytes` written and fsync'ed, as fast as the disk takes it.
double raw_write_seconds(const std::string& path, size_t bytes) {
  std::vector<char> buf(bytes, 'x');
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  size_t done = 0;
  while (fd >= 0 && done < bytes) {
    const ssize_t w = ::write(fd, buf.data() + done, bytes - done);
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  const double s = since(t0);
  ::unlink(path.c_str());
  return s;
}

}  // namespace

static int run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CONFIG DIR [ROUNDS] [THREADS]\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  const std::string dir = argv[2];
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  gt::set_num_threads(argc > 4 ? std::atoi(argv[4]) : 2);
  const gt::Experiment exp = gt::parse_experiment(gt::load_config(argv[1], {}));
  const gt::LoadedData data = gt::load_data(exp);
  gt::Model model = gt::Model::build(exp.model, data.train.input_shape(), gt::DType::f32, gt::Device::cpu(), exp.seed);
  const int64_t batch = exp.data.batch_size;
  model.allocate(batch);
  auto optimizer = gt::make_optimizer(exp.optimizer, model.params());

  // Step time: forward, loss, backward and update on a real batch.
  gt::Tensor x = gt::Tensor::empty(data.train.input_shape().batched(batch), gt::DType::f32);
  gt::Tensor y = gt::Tensor::empty(data.train.target_shape().batched(batch), data.train.targets.dtype());
  gt::Tensor dout = gt::Tensor::empty(model.output_shape().batched(batch), gt::DType::f32);
  gt::Tensor stats = gt::Tensor::zeros(gt::Shape{2}, gt::DType::f64);
  gt::Loader loader(data.train, batch, true, 1);
  loader.start_epoch(0);
  std::vector<double> step_s;
  for (int i = 0; i < 8; ++i) {
    const auto t0 = Clock::now();
    loader.next(x, y);
    const gt::LayerContext ctx{true, false, static_cast<uint64_t>(i)};
    const gt::Tensor& out = model.forward(x, ctx);
    gt::compute_loss(exp.loss, out, y, 1.0 / static_cast<double>(batch), dout, stats);
    model.backward(dout, ctx);
    optimizer->step(exp.optimizer.lr);
    if (i >= 2) step_s.push_back(since(t0));  // the first steps touch fresh memory
  }

  fs::remove_all(dir);
  gt::CheckpointConfig cfg;
  cfg.keep = 2;
  gt::CheckpointStore store(dir, cfg);
  gt::TrainProgress p;
  std::vector<double> save_s, load_s, raw_s;
  uint64_t bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    p.step = r + 1;
    auto t0 = Clock::now();
    const std::string where = store.save(model, *optimizer, exp.optimizer.type, p, "config");
    save_s.push_back(since(t0));
    bytes = 0;
    for (const auto& e : fs::directory_iterator(where)) bytes += fs::file_size(e.path());
    t0 = Clock::now();
    const gt::CheckpointInfo info = gt::read_checkpoint(where);
    gt::load_checkpoint(info, model, *optimizer);
    load_s.push_back(since(t0));
    raw_s.push_back(raw_write_seconds(dir + "/raw.bin", bytes));
  }
  const double mb = static_cast<double>(bytes) / 1e6;
  const int64_t steps_per_epoch = (data.train.size() + batch - 1) / batch;
  const double save = median(save_s), load = median(load_s), raw = median(raw_s), step = median(step_s);
  std::printf(
      "{\"checkpoint_mb\": %.2f, \"save_ms\": %.1f, \"save_mb_per_s\": %.0f, \"load_ms\": %.1f, "
      "\"load_mb_per_s\": %.0f, \"raw_write_fsync_mb_per_s\": %.0f, \"save_vs_raw_write\": %.2f, "
      "\"step_ms\": %.1f, \"steps_per_checkpoint\": %lld, \"share_of_training_time\": %.5f}\n",
      mb, 1e3 * save, mb / save, 1e3 * load, mb / load, mb / raw, raw / save, 1e3 * step,
      static_cast<long long>(steps_per_epoch), save / (save + static_cast<double>(steps_per_epoch) * step));
  fs::remove_all(dir);
  return 0;
}

int main(int argc, char** argv) {
  return gt::bench::guarded_main("bench_checkpoint_cost", [&] { return run(argc, argv); });
}
