// The fused classifier's in-place gradient: the losses write ∂L/∂output over the output itself with the same bits as
// into a tensor of its own, and a training step does so where the model's last layer never reads its output again
// (Model::loss_writes_over_output), which `gputrain check` counts.
#include "core/rng.h"
#include "data/dataset.h"
#include "graph/model.h"
#include "helpers.h"
#include "ops/loss.h"
#include "ops/math.h"
#include "train/experiment.h"
#include "train/footprint.h"
#include "train/setup.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

using namespace gt;
using namespace gt::test;
using gt::OnlineSoftmax;

namespace {

Tensor in_place_logits(const Shape& shape, uint64_t seed, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  Rng rng(seed, 0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = rng.uniform(-6, 6);
    dtype == DType::f64 ? (void)(t.data<double>()[i] = v) : (void)(t.data<float>()[i] = static_cast<float>(v));
  }
  return t;
}

bool bytes_equal_in_place(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.bytes())) == 0;
}

}  // namespace

TEST_CASE("cross_entropy and mse write their gradient over their input with the bits of a separate buffer", "[cpu]") {
  for (const DType dtype : {DType::f32, DType::f64})
    for (const double eps : {0.0, 0.1})
      for (const int64_t ignore : {ops::kNoIgnore, int64_t{3}}) {
        INFO(dtype_name(dtype) << ", label smoothing " << eps << ", ignore_index " << ignore);
        // 24 rows of 3 samples over 517 classes (several of the f32 kernel's vector blocks and a tail); label 3 is
        // frequent, so ignore_index 3 drops rows.
        const Tensor logits = in_place_logits(Shape{24, 517}, 7, dtype);
        Tensor labels = Tensor::empty(Shape{24}, DType::i32);
        for (int64_t i = 0; i < 24; ++i)
          labels.data<int32_t>()[i] = static_cast<int32_t>(i % 4 == 0 ? 3 : i * 37 % 517);
        const ops::CrossEntropyRows rows{.group = 8, .ignore_index = ignore};
        Tensor apart = Tensor::empty(logits.shape(), dtype), stats_apart = Tensor::zeros(Shape{2}, DType::f64);
        ops::cross_entropy(logits, labels, eps, 1.0 / 3, apart, stats_apart, rows);
        Tensor over = logits.clone(), stats_over = Tensor::zeros(Shape{2}, DType::f64);
        ops::cross_entropy(over, labels, eps, 1.0 / 3, over, stats_over, rows);
        CHECK(bytes_equal_in_place(over, apart));
        CHECK(bytes_equal_in_place(stats_over, stats_apart));
        CHECK_FALSE(bytes_equal_in_place(over, logits));  // it did write
      }
  const Tensor pred = in_place_logits(Shape{6, 33}, 9, DType::f32),
               target = in_place_logits(Shape{6, 33}, 10, DType::f32);
  Tensor apart = Tensor::empty(pred.shape(), DType::f32), stats_apart = Tensor::zeros(Shape{2}, DType::f64);
  ops::mse(pred, target, 0.5, apart, stats_apart);
  Tensor over = pred.clone(), stats_over = Tensor::zeros(Shape{2}, DType::f64);
  ops::mse(over, target, 0.5, over, stats_over);
  CHECK(bytes_equal_in_place(over, apart));
  CHECK(bytes_equal_in_place(stats_over, stats_apart));
}

namespace {

// A synthetic classifier whose last layers are `tail` (after a dense layer of 16).
std::string in_place_config(const std::string& tail) {
  return R"(name: in_place
device: cpu
data:
  format: synthetic
  samples: 32
  input_shape: [12]
  targets: {classes: 5}
  batch_size: 8
model:
  layers:
    - {type: linear, out_features: 16}
)" + tail +
         R"(
loss: cross_entropy
optimizer: {type: sgd, lr: 0.1}
)";
}

struct InPlaceCase {
  std::string tail;
  bool in_place;
};

}  // namespace

TEST_CASE("a step writes the loss's gradient over the output only where the last layer never reads it again", "[cpu]") {
  const std::vector<InPlaceCase> cases{
      {"    - {type: relu}\n    - {type: linear, out_features: 5}", true},      // a dense head reads x and W
      {"    - {type: linear, out_features: 5}\n    - {type: sigmoid}", false},  // sigmoid's backward reads y
      {"    - {type: linear, out_features: 5}\n    - {type: tanh}", false},
      {"    - {type: linear, out_features: 5}\n    - {type: relu}", false},     // relu ends the dense layer's chain
      {"    - {type: linear, out_features: 5}\n    - {type: flatten}", false},  // a view: its source's buffer
  };
  for (const InPlaceCase& c : cases) {
    INFO(c.tail);
    const Experiment exp = parse_experiment(ConfigNode::load_string(in_place_config(c.tail), "in_place.yaml"));
    const LoadedData data = load_data(exp);
    Model model = Model::build(exp.model, data.train.input_shape(), DType::f32, Device::cpu(), 1);
    CHECK(model.loss_writes_over_output() == c.in_place);
    const Footprint f = training_footprint(exp, model, data.train);
    CHECK(f.loss_in_place == c.in_place);
    const size_t step_tensors = 8 * 12 * 4 + 8 * 4;  // x (f32) and the labels (i32)
    CHECK(f.batch_bytes == step_tensors + (c.in_place ? 0 : 8 * 5 * 4));
    model.allocate(8);
    const Tensor buffer = model.output_buffer();
    CHECK(buffer.defined() == c.in_place);
    if (!c.in_place) continue;
    const Tensor x = Tensor::zeros(Shape{8, 12}, DType::f32);
    const Tensor& out = model.forward(x, {.training = true});
    CHECK(out.raw() == buffer.raw());  // the forward pass writes the buffer the loss overwrites
  }
}

TEST_CASE("a classifier trains to the same losses and weights with its gradient over the logits", "[e2e]") {
  // The same model with the in-place gradient and without it: a flatten after the head (a view of the same shape)
  // computes the same, but a model ending in a view keeps the loss's gradient in a buffer of its own.
  const std::string dir = "in_place_e2e";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string head = "    - {type: relu}\n    - {type: linear, out_features: 5}";
  write_text(dir + "/a.yaml", in_place_config(head));
  write_text(dir + "/b.yaml", in_place_config(head + "\n    - {type: flatten}"));
  for (const char* name : {"a", "b"}) {
    const CommandResult r =
        run_gputrain(fmt::format("train {0}/{1}.yaml --out {0}/run-{1} --max-steps 12 --quiet "
                                 "--set train.log_every=1",
                                 dir, name));
    REQUIRE(r.exit_code == 0);
  }
  const std::vector<double> a = train_losses(read_text(dir + "/run-a/metrics.jsonl"));
  const std::vector<double> b = train_losses(read_text(dir + "/run-b/metrics.jsonl"));
  REQUIRE(a.size() == 12);
  CHECK(a == b);
  std::filesystem::remove_all(dir);
}

namespace {

// A CUDA cross-entropy row's online softmax as a warp computes it: lane l adds columns l, l + 32, …, then five
// butterfly steps merge lane l with lane l ^ offset, every lane at once.
std::vector<OnlineSoftmax<float>> warp_softmax(const std::vector<float>& row) {
  std::vector<OnlineSoftmax<float>> lanes(32);
  for (size_t j = 0; j < row.size(); ++j) lanes[j % 32].add(row[j]);
  for (size_t offset = 16; offset > 0; offset /= 2) {
    std::vector<OnlineSoftmax<float>> next(32);
    for (size_t l = 0; l < 32; ++l) next[l] = OnlineSoftmax<float>::merged(lanes[l], lanes[l ^ offset]);
    lanes = next;
  }
  return lanes;
}

}  // namespace

TEST_CASE("the online softmax of a row split over a warp's lanes is the two-pass sum, NaN where the CPU's is",
          "[cpu]") {
  Rng rng(5, 0);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t k : {1, 5, 31, 32, 33, 517, 50257})
    for (int special = 0; special < 6; ++special) {
      std::vector<float> row(static_cast<size_t>(k));
      // Growing logits make each lane's maximum change often (every rescale is taken); random ones rarely.
      for (int64_t j = 0; j < k; ++j)
        row[static_cast<size_t>(j)] =
            special == 1 ? static_cast<float>(j) * 0.01f : static_cast<float>(rng.uniform(-20, 20));
      const size_t at = static_cast<size_t>(k / 2);
      if (special == 2) row[at] = -inf;                           // a −inf away from the maximum: e^(−inf) = 0
      if (special == 3) row[at] = inf;                            // e^(inf − inf): NaN
      if (special == 4) row[at] = nan;                            // NaN
      if (special == 5) std::fill(row.begin(), row.end(), -inf);  // a row of −inf: NaN
      INFO("k " << k << ", case " << special);
      const std::vector<OnlineSoftmax<float>> lanes = warp_softmax(row);
      for (const OnlineSoftmax<float>& l : lanes) {  // every lane ends with the same state, to the bit
        CHECK((l.max == lanes[0].max || (std::isnan(l.max) && std::isnan(lanes[0].max))));
        CHECK(std::memcmp(&l.total, &lanes[0].total, sizeof l.total) == 0);
        CHECK(l.nan == lanes[0].nan);
      }
      // The CPU's loss over the same row: NaN exactly where the online sum is.
      Tensor logits = Tensor::empty(Shape{1, k}, DType::f32), labels = Tensor::zeros(Shape{1}, DType::i32);
      std::copy(row.begin(), row.end(), logits.data<float>());
      Tensor stats = Tensor::zeros(Shape{2}, DType::f64), none;
      ops::cross_entropy(logits, labels, 0.0, 1.0, none, stats);
      const double online = lanes[0].sum();
      CHECK(std::isnan(online) == std::isnan(stats.data<double>()[0]));
      if (std::isnan(online)) continue;
      float mx = -inf;
      for (float v : row) mx = std::max(mx, v);
      CHECK(lanes[0].max == mx);
      double two_pass = 0;
      for (float v : row) two_pass += std::exp(static_cast<double>(v) - static_cast<double>(mx));
      CHECK(std::abs(online - two_pass) <= 1e-13 * two_pass);
      CHECK(std::abs(static_cast<double>(mx) + std::log(online) - row[0] - stats.data<double>()[0]) <=
            1e-5 * (1 + std::abs(stats.data<double>()[0])));
    }
}
