// The table of layer cases the gradient checks (and the CUDA-vs-CPU layer tests) walk: at least one per registered
// layer type, so a new layer without a case fails the suite.
#pragma once

#include "core/shape.h"

#include <map>
#include <string>
#include <vector>

namespace gt::test {

struct GradCase {
  std::string yaml;               ///< the layer as it would appear in model.layers
  Shape input;                    ///< per sample
  std::vector<Shape> extra = {};  ///< further inputs, for layers that join branches
  int64_t index_range = 0;        ///< > 0: inputs are integers in [0, index_range) (embedding)
};

const std::multimap<std::string, GradCase>& layer_cases();

}  // namespace gt::test
