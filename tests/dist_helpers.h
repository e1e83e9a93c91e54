// What the data-parallel tests share: starting ranks under mpirun and over TCP, and comparing their weights.
#pragma once

#include "helpers.h"

#include <string>

namespace gt::test {

/// mpirun as CI runs it: as root (allowed explicitly), never more slots than cores asked. Ends with a space.
std::string mpirun(int ranks);
/// ‖a − b‖ / ‖a‖ over each tensor of two safetensors files: the largest.
double max_relative_difference(const std::string& a_path, const std::string& b_path);
/// A MASTER_PORT for this test process (`slot` 0, 1, …): ranks of concurrent test processes must not meet on one port.
int tcp_test_port(int slot);
/// Starts rank `rank` of `world` with torchrun's variables, as torchrun would, without torchrun.
Background start_tcp_rank(int rank, int world, int port, const std::string& args, const std::string& log);

}  // namespace gt::test
