// Gradient averaging on device buffers: GradSync's device buckets and side stream (through a stand-in communicator
// that plays a second rank), the NCCL communicator of one rank, and ZeRO 1/2 on device parameters (two worker-thread
// ranks on one GPU, and NCCL of one rank with GradSync's reduce-scatter). Skipped (exit 77) without a GPU.
#include "cuda_helpers.h"
#include "ops/cuda_context.h"
#include "optim/offload.h"
#include "optim/optimizer.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"
#include "parallel/zero.h"
#include "train/checkpoint.h"

#include <cuda_runtime.h>

#include <cmath>
#include <filesystem>
#include <thread>

#include <unistd.h>

using namespace gt;
using namespace gt::test;

namespace {

// Rank 0 of 2 on device buffers; "rank 1" contributes 2x + 1 for each x of rank 0, so the sum is 3x + 1. It waits
// for its stream and works on the host: what it checks is GradSync's flattening, ordering and scaling.
class TwoRankStandIn final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "stand-in"; }
  bool device_buffers() const override { return true; }
  void set_stream(void* stream) override { m_stream = static_cast<cudaStream_t>(stream); }
  void allreduce_sum(float* data, size_t n, const char*) override {
    streams.push_back(m_stream);
    const auto compute = static_cast<cudaStream_t>(cuda::compute_stream(0));
    REQUIRE(cudaStreamSynchronize(m_stream ? m_stream : compute) == cudaSuccess);
    std::vector<float> h(n);
    REQUIRE(cudaMemcpy(h.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    for (float& x : h) x = x + (2 * x + 1);
    REQUIRE(cudaMemcpy(data, h.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  void allreduce_sum(double*, size_t, const char*) override { FAIL("GradSync all-reduces f32 gradients"); }
  void allgather(const float*, float*, size_t, const char*) override { FAIL("GradSync gathers nothing"); }
  void allgather(const double*, double*, size_t, const char*) override { FAIL("GradSync gathers nothing"); }
  void reduce_scatter_sum(const float*, float*, size_t, const char*) override {
    FAIL("zero 0 reduce-scatters nothing");
  }
  void reduce_scatter_sum(const double*, double*, size_t, const char*) override { FAIL("GradSync sums f32"); }
  void broadcast(void*, size_t, int, const char*) override { FAIL("GradSync broadcasts nothing"); }
  void abort(int) override {}

  std::vector<cudaStream_t> streams;  ///< the stream of each all-reduce

 private:
  cudaStream_t m_stream = nullptr;
};

}  // namespace

TEST_CASE("GradSync averages device gradients in device buckets on a side stream", "[cuda]") {
  require_gpu();
  // Sizes across the 1 MB cap of the first bucket and the 0.001 MB buckets after it: several buckets, one of them
  // holding two nodes' parameters.
  const std::vector<int64_t> sizes = {5, 300001, 7, 130};
  for (bool overlap : {true, false}) {
    std::vector<Param> params(sizes.size());
    std::vector<Tensor> original;
    std::vector<std::vector<Param*>> by_node;
    for (size_t i = 0; i < sizes.size(); ++i) {
      original.push_back(seeded(Shape{sizes[i]}, 10 + i));
      params[i].value = to_cuda(original.back());  // (buckets are cut by the values' sizes)
      params[i].grad = to_cuda(original.back());
      by_node.push_back({&params[i]});
    }
    by_node.insert(by_node.begin() + 1, std::vector<Param*>{});  // a node without parameters
    TwoRankStandIn comm;
    GradSync sync(comm, by_node, 0.001, overlap);
    CHECK(sync.buckets() >= 3);
    sync.arm();
    for (size_t i = by_node.size(); i-- > 0;) sync.node_done(i);
    sync.finish();
    for (size_t i = 0; i < sizes.size(); ++i) {
      const Tensor got = to_host(params[i].grad);
      for (int64_t k = 0; k < sizes[i]; ++k) {
        const float x = original[i].data<float>()[k];
        REQUIRE(got.data<float>()[k] == Approx((3 * x + 1) / 2).epsilon(1e-6).margin(1e-6));
      }
    }
    REQUIRE(comm.streams.size() == sync.buckets());
    for (cudaStream_t s : comm.streams) {
      CHECK(s != nullptr);  // not the compute stream (nullptr selects it)
      CHECK(s != cuda::compute_stream(0));
    }
  }
}

TEST_CASE("NCCL of one rank, bootstrapped through the local communicator, sums and broadcasts device buffers",
          "[cuda]") {
  require_gpu();
  auto local = make_local_comm();
  auto nccl = make_nccl_comm(*local, 0, 30);
  CHECK(nccl->device_buffers());
  CHECK(nccl->name() == "nccl");
  CHECK(nccl->size() == 1);
  const Tensor x = seeded(Shape{1000}, 3);
  Tensor d = to_cuda(x);
  nccl->allreduce_sum(d.data<float>(), 1000, "a test buffer");
  nccl->broadcast(d.raw(), d.bytes(), 0, "a test buffer");
  const Tensor back = to_host(d);  // ordered after both: they ran on the compute stream
  for (int64_t k = 0; k < 1000; ++k) REQUIRE(back.data<float>()[k] == x.data<float>()[k]);
  Tensor hd = Tensor::empty(Shape{3}, DType::f64);
  for (int k = 0; k < 3; ++k) hd.data<double>()[k] = k + 0.5;
  Tensor dd = to_cuda(hd);
  nccl->allreduce_sum(dd.data<double>(), 3, "a test buffer");
  CHECK(to_host(dd).data<double>()[2] == 2.5);
}

namespace {

// Three parameters on cuda:0 of 7, 300001 and 26 elements: with bucket_mb 1 they fill three buckets (the large one
// alone, past the first bucket's 1 MB cap), with 100 two (the large one and the small first one together), and at
// two ranks each cut lies inside a parameter or leaves padding.
std::vector<Param> device_params() {
  std::vector<Param> out;
  uint64_t seed = 40;
  for (int64_t n : {7, 300001, 26}) {
    const Tensor v = seeded(Shape{n}, seed++, -1, 1);
    out.push_back({"p" + std::to_string(out.size()), to_cuda(v), to_cuda(Tensor::zeros(Shape{n}, DType::f32))});
  }
  return out;
}

// The gradients a backward pass would give at the current weights (equal on every rank, as averaged gradients are):
// g = sin(3·w + step) + 0.1·w, on the host.
std::vector<Tensor> host_grads(const std::vector<Param>& params, int step) {
  std::vector<Tensor> out;
  for (const Param& p : params) {
    const Tensor w = to_host(p.value);
    Tensor g = Tensor::empty(w.shape(), DType::f32);
    for (int64_t k = 0; k < w.numel(); ++k) {
      const float x = w.data<float>()[k];
      g.data<float>()[k] = std::sin(3.0f * x + static_cast<float>(step)) + 0.1f * x;
    }
    out.push_back(g);
  }
  return out;
}

// host_grads, written into each grad.
std::vector<Tensor> set_grads(std::vector<Param>& params, int step) {
  std::vector<Tensor> out = host_grads(params, step);
  for (size_t i = 0; i < params.size(); ++i) params[i].grad.copy_from(out[i]);
  return out;
}

// Rank `rank`'s chunks of the averaged gradients `grads` (host, per parameter), cut as the optimizer's buckets are:
// what GradSync's reduce-scatter leaves in ZeroOptimizer::grad_chunks.
void fill_chunks(const ZeroOptimizer& zero, const std::vector<Tensor>& grads, int rank) {
  const auto params = zero.bucket_params();
  const auto chunks = zero.bucket_chunks();
  for (size_t b = 0; b < params.size(); ++b) {
    std::vector<float> flat(chunks[b] * 2, 0.0f);  // two ranks
    size_t at = 0;
    for (size_t i : params[b]) {
      std::copy(grads[i].data<float>(), grads[i].data<float>() + grads[i].numel(),
                flat.begin() + static_cast<long>(at));
      at += static_cast<size_t>(grads[i].numel());
    }
    Tensor host = Tensor::empty(Shape{static_cast<int64_t>(chunks[b])}, DType::f32);
    std::copy(flat.begin() + static_cast<long>(chunks[b] * static_cast<size_t>(rank)),
              flat.begin() + static_cast<long>(chunks[b] * static_cast<size_t>(rank + 1)), host.data<float>());
    Tensor chunk = zero.grad_chunks()[b];
    chunk.copy_from(host);
  }
}

OptimizerConfig adamw_amsgrad() {
  OptimizerConfig cfg;
  cfg.type = OptimizerType::adamw;
  cfg.lr = 0.01;
  cfg.weight_decay = 0.1;
  cfg.amsgrad = true;  // three state buffers per element
  return cfg;
}

// One gated, clipped step as the training loop queues it: the squared norm into fresh statistics, then the update.
double norm_and_step(Optimizer& opt, int64_t params) {
  Tensor stats = Tensor::zeros(Shape{kStepStats}, DType::f64, Device::cuda(0));
  Tensor per = Tensor::zeros(Shape{params}, DType::f64, Device::cuda(0));
  Tensor grad_sq = stats.slice0(kGradSq, 1);
  opt.grad_norm_sq(grad_sq, per);
  opt.step(0.01, stats, 0.5);  // the norm is far above 0.5: every step is clipped
  return to_host(stats).data<double>()[kGradSq];
}

// Element by element: equal bits (tolerance 0), or |a − b| ≤ tol·max(1, |b|).
void check_same(const Tensor& a_dev, const Tensor& b_dev, double tol) {
  const Tensor a = to_host(a_dev), b = to_host(b_dev);
  REQUIRE(a.numel() == b.numel());
  for (int64_t k = 0; k < a.numel(); ++k) {
    const float x = a.data<float>()[k], y = b.data<float>()[k];
    INFO("element " << k << ": " << x << " vs " << y);
    if (tol == 0)
      REQUIRE(x == y);
    else
      REQUIRE(std::abs(x - y) <= tol * std::max(1.0f, std::abs(y)));
  }
}

}  // namespace

TEST_CASE(
    "ZeRO 1, 2 and 3, with and without dist.offload, on device parameters of two worker-thread ranks on one GPU "
    "match the unsharded optimizer",
    "[cuda]") {
  require_gpu();
  // NCCL refuses two ranks on one device, so the two ranks here are worker threads over the thread communicator,
  // which the optimizer reaches through host copies of its device chunks (its staged path). What it checks is the
  // device side that NCCL ranks run too: the slices and chunks on the GPU, the device copies in and out of the
  // all-gather, the partial norms summed on the device, the state gathered for a checkpoint and its shard files.
  // Stage 1 must be bit for bit; stage 2's norm adds the ranks' partial sums in another order (relative 1e-12), and
  // the clipping coefficient it gives moves the weights by a few ulps at most (1e-6 relative). Stage 3 keeps its
  // shard of the weights alone (gathered here to compute the gradients and compare). dist.offload updates the shard
  // on the host with the CPU's kernels, whose rounding may differ from the GPU's by an ulp (1e-6 relative).
  const OptimizerConfig cfg = adamw_amsgrad();
  constexpr int kSteps = 3;
  for (int stage : {1, 2, 3})
    for (bool offload : {false, true})
      for (double bucket_mb : {1.0, 100.0}) {
        INFO("stage " << stage << ", bucket_mb " << bucket_mb << ", offload " << offload);
        const double tol = stage == 1 && !offload ? 0 : 1e-6;
        std::vector<Param> plain = device_params();
        std::vector<Param*> plain_ptrs;
        for (Param& p : plain) plain_ptrs.push_back(&p);
        auto ref = make_optimizer(cfg, plain_ptrs);
        std::vector<double> ref_norms;
        for (int step = 0; step < kSteps; ++step) {
          set_grads(plain, step);
          ref_norms.push_back(norm_and_step(*ref, 3));
        }
        auto comms = make_thread_comms(2, 60.0);
        std::vector<std::vector<Param>> replicas(2);
        std::vector<std::vector<double>> norms(2);
        std::vector<std::vector<Tensor>> state(2);
        std::vector<CheckpointInfo::File> device_file(2), host_file(2);
        std::vector<std::string> errors(2);
        const auto dir = std::filesystem::temp_directory_path() / ("gt_zero_cuda_" + std::to_string(::getpid()));
        std::filesystem::create_directories(dir);
        std::vector<std::thread> threads;
        for (int r = 0; r < 2; ++r)
          threads.emplace_back([&, r] {
            const auto ur = static_cast<size_t>(r);
            try {
              auto& mine = replicas[ur];
              mine = device_params();
              const std::vector<std::vector<Param*>> by_node = {{&mine[0]}, {&mine[1]}, {&mine[2]}};
              const BucketPlan plan =
                  stage >= 3 ? plan_units(by_node, {-1, -1, -1}, bucket_mb) : plan_buckets(by_node, bucket_mb);
              ZeroOptimizer zero(cfg, {&mine[0], &mine[1], &mine[2]}, plan, *comms[ur], stage, {},
                                 offload ? Offload::exact : Offload::none);
              zero.take_weights();  // stage 3: the shards; offload: the host masters
              for (int step = 0; step < kSteps; ++step) {
                zero.gather_values();  // (nothing below stage 3)
                if (stage >= 3 && !mine[1].value.device().is_cuda()) throw Error("a gathered weight is not on the GPU");
                const std::vector<Tensor> grads = set_grads(mine, step);
                zero.release_values();
                if (stage >= 3 && mine[1].value.defined()) throw Error("stage 3 kept a whole weight");
                if (stage >= 2) fill_chunks(zero, grads, r);
                norms[ur].push_back(norm_and_step(zero, 3));
              }
              zero.gather_values();
              for (Param& p : mine) p.value = to_cuda(to_host(p.value));  // kept past the optimizer's release
              // The shard file of device pieces equals the one of their host copies (offloaded: host pieces).
              std::vector<Tensor> copies;
              std::vector<const Tensor*> pieces = zero.shard_pieces(), host_pieces;
              for (const Tensor* t : pieces) {
                if (t->device().is_cuda() == offload)
                  throw Error("a shard piece is not where its optimizer keeps it");  // (Catch2 wants one thread)
                copies.push_back(to_host(*t));
              }
              for (const Tensor& t : copies) host_pieces.push_back(&t);
              const std::string name = "r" + std::to_string(r);
              device_file[ur] = write_shard_file((dir / (name + ".dev")).string(), name, pieces);
              host_file[ur] = write_shard_file((dir / (name + ".host")).string(), name, host_pieces);
              zero.gather_state();
              for (auto& [n, t] : zero.state()) state[ur].push_back(to_host(*t));
              zero.shard_state();
            } catch (const std::exception& e) {
              errors[ur] = e.what();
              comms[ur]->abort(3);
            }
          });
        for (auto& t : threads) t.join();
        std::filesystem::remove_all(dir);
        for (int r = 0; r < 2; ++r) {
          const auto ur = static_cast<size_t>(r);
          INFO("rank " << r);
          REQUIRE(errors[ur].empty());
          for (int step = 0; step < kSteps; ++step) {
            const double got = norms[ur][static_cast<size_t>(step)], want = ref_norms[static_cast<size_t>(step)];
            if (stage == 1)
              CHECK(got == want);
            else
              CHECK(std::abs(got - want) <= 1e-12 * want);
          }
          for (size_t i = 0; i < 3; ++i) check_same(replicas[ur][i].value, plain[i].value, tol);
          const auto ref_state = ref->state();
          REQUIRE(state[ur].size() == ref_state.size());
          for (size_t i = 0; i < ref_state.size(); ++i) check_same(to_cuda(state[ur][i]), *ref_state[i].second, tol);
          CHECK(device_file[ur].bytes > 0);
          CHECK(device_file[ur].bytes == host_file[ur].bytes);
          CHECK(device_file[ur].crc32 == host_file[ur].crc32);
        }
      }
}

TEST_CASE(
    "ZeRO over NCCL of one rank: GradSync reduce-scatters or all-reduces device buckets, the sharded step "
    "matches the unsharded one",
    "[cuda]") {
  require_gpu();
  // One rank is all NCCL takes on one GPU, but it runs every device collective of the sharded step for real:
  // the reduce-scatter of GradSync's device buckets into the optimizer's chunks (stage 2, gradients as views of the
  // buckets) or their all-reduce (stage 1), on the side stream; the f32 all-gather of the new weights and (stage 2)
  // the f64 all-reduce of the partial norms, on the compute stream. The weights match zero 0 bit for bit (one rank:
  // the sums are copies, the average a multiplication by 1); stage 2's norm sums the buckets' slices in another order
  // (relative 1e-12), so its clipped weights are held to 1e-6.
  auto local = make_local_comm();
  auto nccl = make_nccl_comm(*local, 0, 30);
  const OptimizerConfig cfg = adamw_amsgrad();
  for (int stage : {1, 2})
    for (bool overlap : {true, false}) {
      INFO("stage " << stage << (overlap ? ", overlapping backward" : ", after backward"));
      std::vector<Param> plain = device_params(), mine = device_params();
      std::vector<Param*> plain_ptrs;
      for (Param& p : plain) plain_ptrs.push_back(&p);
      auto ref = make_optimizer(cfg, plain_ptrs);
      // A node without parameters between the first two, as a model has.
      const std::vector<std::vector<Param*>> by_node = {{&mine[0]}, {}, {&mine[1]}, {&mine[2]}};
      ZeroOptimizer zero(cfg, {&mine[0], &mine[1], &mine[2]}, plan_buckets(by_node, 1.0), *nccl, stage);
      CHECK(zero.grad_chunks().size() == (stage >= 2 ? 3u : 0u));
      GradSync sync(*nccl, by_node, 1.0, overlap, zero.grad_chunks());
      REQUIRE(sync.buckets() == 3);
      for (int step = 0; step < 3; ++step) {
        set_grads(plain, step);
        // As a backward pass writes them: into the bucket node_begin hands out (with overlap at stage 2, a slot of
        // GradSync's ring, reused once its reduce-scatter has run; the gradients do not exist before).
        const std::vector<Tensor> grads = host_grads(mine, step);
        sync.arm();
        for (size_t i = by_node.size(); i-- > 0;) {
          sync.node_begin(i);
          for (Param* p : by_node[i]) p->grad.copy_from(grads[static_cast<size_t>(p - mine.data())]);
          sync.node_done(i);
        }
        sync.finish();
        const double want = norm_and_step(*ref, 3), got = norm_and_step(zero, 3);
        if (stage == 1)
          CHECK(got == want);
        else
          CHECK(std::abs(got - want) <= 1e-12 * want);
      }
      for (size_t i = 0; i < 3; ++i) check_same(mine[i].value, plain[i].value, stage == 1 ? 0 : 1e-6);
    }
}

TEST_CASE("dist.offload on one GPU: the weights stay on the device, the update runs on the host as the CPU's does",
          "[cuda]") {
  require_gpu();
  // The offloaded optimizer and a plain one on host copies of the same weights, fed the same gradients: the update
  // is the CPU's on the same values, so the same bits (unclipped: the norm is summed on the GPU and only gates).
  const OptimizerConfig cfg = adamw_amsgrad();
  std::vector<Param> dev = device_params(), host;
  for (const Param& p : dev) host.push_back({p.name, to_host(p.value), Tensor::zeros(p.value.shape(), DType::f32)});
  std::vector<Param*> dev_ptrs, host_ptrs;
  for (Param& p : dev) dev_ptrs.push_back(&p);
  for (Param& p : host) host_ptrs.push_back(&p);
  OffloadOptimizer offload(cfg, dev_ptrs);
  auto plain = make_optimizer(cfg, host_ptrs);
  for (const auto& [name, t] : offload.state()) CHECK(t->device().is_cpu());
  for (int step = 0; step < 3; ++step) {
    const std::vector<Tensor> grads = set_grads(dev, step);
    for (size_t i = 0; i < host.size(); ++i) host[i].grad.copy_from(grads[i]);
    Tensor stats = Tensor::zeros(Shape{kStepStats}, DType::f64, Device::cuda(0)), per;
    Tensor grad_sq = stats.slice0(kGradSq, 1);
    offload.grad_norm_sq(grad_sq, per);
    offload.step(0.01, stats, 0.0);
    plain->step(0.01, Tensor::zeros(Shape{kStepStats}, DType::f64), 0.0);
    CHECK(to_host(stats).data<double>()[kGradSq] > 0);
  }
  for (size_t i = 0; i < dev.size(); ++i) {
    CHECK(dev[i].value.device().is_cuda());
    check_same(dev[i].value, to_cuda(host[i].value), 0);
  }
}
