// What the data-parallel tests share (dist_helpers.h).
#include "dist_helpers.h"

#include "io/safetensors.h"

#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

namespace gt::test {

std::string mpirun(int ranks) {
  return fmt::format(
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
      "mpirun -np {} ",
      ranks);
}

double max_relative_difference(const std::string& a_path, const std::string& b_path) {
  const auto a = gt::read_safetensors(a_path), b = gt::read_safetensors(b_path);
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].first == b[i].first);
    double diff = 0, norm = 0;
    for (int64_t k = 0; k < a[i].second.numel(); ++k) {
      const double x = a[i].second.data<float>()[k], y = b[i].second.data<float>()[k];
      diff += (x - y) * (x - y);
      norm += x * x;
    }
    worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
  }
  return worst;
}

// gputrain listens on MASTER_PORT + 1 (torchrun's agent holds MASTER_PORT), so slots are two ports apart; all stay
// below Linux's ephemeral range (32768 on), where an outgoing connection could hold the port.
int tcp_test_port(int slot) { return 20000 + static_cast<int>(getpid() % 1500) * 8 + slot * 2; }

Background start_tcp_rank(int rank, int world, int port, const std::string& args, const std::string& log) {
  return start_gputrain(
      args, log,
      fmt::format("RANK={} WORLD_SIZE={} LOCAL_RANK={} MASTER_ADDR=127.0.0.1 MASTER_PORT={}", rank, world, rank, port));
}

}  // namespace gt::test
