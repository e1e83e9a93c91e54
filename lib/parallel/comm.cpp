// What the communicators share: the words of a collective that timed out.
#include "parallel/comm.h"

#include <fmt/format.h>

namespace gt {

std::string no_answer_message(int rank, double seconds, const char* op, const std::string& what,
                              const std::string& silent) {
  return fmt::format("rank {}: no answer for {:.0f} s in {} of {}: {} failed or stopped responding (dist.timeout_s)",
                     rank, seconds, op, what, silent);
}

std::string silent_ranks(int rank, int size) {
  return size == 2 ? fmt::format("rank {}", 1 - rank) : fmt::format("one of the other {} ranks", size - 1);
}

}  // namespace gt
