// The property fuzz_config and fuzz_set check of every config they accept: no size product the run computes
// overflows. Sizes are bounded one by one (core/limits.h) and their products checked where they are formed; this
// recomputes the products from the accepted experiment and traps when one does not fit, so a limit that is missing
// or too loose is a fuzzer finding, not a heap corruption in `train`.
#pragma once

#include "core/checked.h"
#include "core/limits.h"
#include "graph/model.h"
#include "train/experiment.h"

#include <optional>

namespace gt::fuzz {

inline void require_fits(std::optional<int64_t> n, int64_t limit = INT64_MAX) {
  if (!n || *n > limit) __builtin_trap();
}

/// Call with an experiment parse_experiment accepted.
inline void check_size_products(const Experiment& exp) {
  const DataConfig& d = exp.data;
  const TrainConfig& t = exp.train;
  // Steps: the most steps an epoch can have is one per sample; the global batch is batch × accumulate × ranks.
  require_fits(checked_mul(checked_mul(t.epochs, limits::kSamples.max), 1));
  require_fits(checked_mul(checked_mul(d.batch_size, t.accumulate), 1 << 20));
  if (d.augment.crop_padding >= 0) require_fits(checked_add(checked_mul(d.augment.crop_padding, 2), 1));
  if (d.format != DataFormat::synthetic) return;  // the shapes of file data are known only once the files are read
  const Shape input(d.synthetic.input_shape);
  require_fits(input.checked_numel(), limits::kElements.max);
  require_fits(checked_mul(input.checked_numel(), d.synthetic.samples), limits::kElements.max);
  require_fits(checked_mul(input.checked_numel(), d.synthetic.test_samples), limits::kElements.max);
  // The model as `gputrain check` builds it (shapes only); a config it accepts must count within 64 bits.
  try {
    const Model m = Model::build(exp.model, input, DType::f32, Device::cpu(), exp.seed, false);
    m.check_batch(d.batch_size, exp.at.batch_size);
    std::optional<int64_t> params = 0, flops = 0;
    for (const GraphNode& n : m.nodes()) {
      require_fits(checked_mul(n.out_shape.checked_numel(), d.batch_size), limits::kElements.max);
      params = checked_add(params, n.layer->param_numel());
      flops = checked_add(flops, checked_mul(checked_mul(n.layer->forward_flops(), d.batch_size), 3).value_or(-1));
    }
    require_fits(params);
    require_fits(checked_mul(params, 8));  // bytes of an f64 copy
    require_fits(flops);
  } catch (const SizeOverflow&) {
    __builtin_trap();  // a count that escaped the checks of the build
  } catch (const ConfigError&) {
  }
}

}  // namespace gt::fuzz
