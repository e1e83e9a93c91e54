// GPUTRAIN_CPU_FUSE (ops/epilogue.h).
#include "ops/epilogue.h"

#include "core/env.h"

namespace gt::cpu {

bool env_cpu_fusion() {
  static const std::optional<size_t> choice = env_choice("GPUTRAIN_CPU_FUSE", {"on", "off"});
  return choice != size_t{1};
}

}  // namespace gt::cpu
