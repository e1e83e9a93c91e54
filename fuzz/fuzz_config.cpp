// Fuzz target: an experiment file through the loader and the validator (gt::load_config, gt::parse_experiment).
// A rejected config must be a gt::Error, and an accepted one must have no size product that overflows
// (size_property.h); anything else (another exception, a crash, a sanitizer report) is a bug.
#include "fuzz_input.h"
#include "size_property.h"
#include "train/experiment.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gt::fuzz::ScratchFile file("config.yaml");
  const std::string& path = file.write({reinterpret_cast<const char*>(data), size});
  try {
    const gt::ConfigNode root = gt::load_config(path, {});
    gt::fuzz::check_size_products(gt::parse_experiment(root));
  } catch (const gt::Error&) {
  }
  return 0;
}
