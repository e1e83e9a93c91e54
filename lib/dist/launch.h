// Which launcher started this process, and where it sits: rank, world size, local rank — from environment
// variables alone (Open MPI's mpirun, MPICH/PMI, Slurm's srun, torchrun), no flags needed.
#pragma once

#include <functional>
#include <string>

namespace gt {

struct LaunchInfo {
  std::string launcher = "none";  ///< none | openmpi | pmi | slurm | torchrun
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr;  ///< torchrun
  int master_port = 0;
  std::string source;  ///< the variables it was read from, for the log
};

/// Looks variables up through `env` (nullptr when unset). Throws ConfigError naming the variables when they are
/// partial (RANK without WORLD_SIZE), malformed, out of range, or when two launchers' variables disagree.
LaunchInfo detect_launch(const std::function<const char*(const char*)>& env);
/// The same, from the process environment.
LaunchInfo detect_launch();

}  // namespace gt
