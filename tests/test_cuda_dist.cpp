// Gradient averaging on device buffers: GradSync's device buckets and side stream (through a stand-in communicator
// that plays a second rank), and the NCCL communicator of one rank. Skipped (exit 77) without a GPU.
#include "cuda_helpers.h"
#include "dist/comm.h"
#include "dist/grad_sync.h"
#include "ops/cuda_context.h"

#include <cuda_runtime.h>

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
