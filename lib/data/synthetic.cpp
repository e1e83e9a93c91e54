// format: synthetic — seeded random data sets for tests, examples and benchmarks.
#include "core/rng.h"
#include "data/dataset.h"

namespace gt {

Dataset make_synthetic(const SyntheticSpec& spec, uint64_t seed, int split) {
  const int64_t n = split == 0 ? spec.samples : spec.test_samples;
  const Shape in_shape(spec.input_shape);
  const int64_t d = in_shape.numel();
  Dataset ds;
  ds.source = fmt::format("synthetic ({} split)", split == 0 ? "train" : "test");
  ds.inputs = Tensor::empty(in_shape.batched(n), DType::f32);
  Rng rng(seed, 0x5EED0000 + static_cast<uint64_t>(split));
  float* x = ds.inputs.data<float>();
  for (int64_t i = 0; i < n * d; ++i) x[i] = static_cast<float>(rng.normal());

  if (spec.classes > 0) {
    // The labelling rule is shared by both splits: its own stream, independent of the split.
    Rng teacher_rng(seed, 0x7EAC);
    std::vector<double> w(static_cast<size_t>(spec.classes * d));
    for (double& v : w) v = teacher_rng.normal();
    ds.targets = Tensor::empty(Shape{n}, DType::i32);
    int32_t* y = ds.targets.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      int32_t best = 0;
      double best_v = -1e300;
      for (int64_t k = 0; k < spec.classes; ++k) {
        double s = 0;
        for (int64_t j = 0; j < d; ++j) s += w[static_cast<size_t>(k * d + j)] * x[i * d + j];
        if (s > best_v) best_v = s, best = static_cast<int32_t>(k);
      }
      y[i] = best;
    }
    ds.num_classes = spec.classes;
  } else {
    const Shape t_shape(spec.target_shape);
    ds.targets = Tensor::empty(t_shape.batched(n), DType::f32);
    float* t = ds.targets.data<float>();
    for (int64_t i = 0; i < ds.targets.numel(); ++i) t[i] = static_cast<float>(rng.normal());
  }
  return ds;
}

}  // namespace gt
