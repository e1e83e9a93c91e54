// Fuzz target: `--set KEY=VALUE` overrides (gt::apply_override), then validation of the result.
// Input: the lines before the first empty line are assignments, applied in order; what follows the empty line is
// the base config (a small valid one when there is none).
#include "fuzz_input.h"
#include "size_property.h"
#include "train/experiment.h"

#include <string>
#include <vector>

namespace {

constexpr const char* kBase = R"(name: fuzz
seed: 1
data:
  format: synthetic
  samples: 8
  input_shape: [4]
  targets: {classes: 2}
  batch_size: 4
model:
  layers:
    - {type: linear, out_features: 8}
    - {type: relu}
    - {type: linear, out_features: 2}
loss: cross_entropy
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
scheduler: {type: multistep, milestones: [2, 4]}
train: {epochs: 2, log_every: 1}
)";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t blank = input.find("\n\n");
  const std::string head = input.substr(0, blank);
  const std::string base = blank == std::string::npos ? kBase : input.substr(blank + 2);
  std::vector<std::string> assignments;
  for (size_t pos = 0; pos <= head.size() && assignments.size() < 8;) {
    size_t eol = head.find('\n', pos);
    if (eol == std::string::npos) eol = head.size();
    assignments.push_back(head.substr(pos, eol - pos));
    pos = eol + 1;
  }
  try {
    gt::ConfigNode root = gt::ConfigNode::load_string(base, "fuzz.yaml");
    for (const auto& a : assignments) root = gt::apply_override(root, a);
    if (root.is_map()) gt::fuzz::check_size_products(gt::parse_experiment(root));
  } catch (const gt::Error&) {
  }
  return 0;
}
