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
  /// The ranks meet over TCP at master_addr:master_port (torchrun; a Slurm step that gives Open MPI no PMI/PMIx:
  /// srun without --mpi=pmix where the cluster's MpiDefault is none) instead of through MPI_Init.
  bool tcp = false;
};

/// The first host of a Slurm hostlist ("node[07-12,15],gpu3" → "node07").
std::string first_slurm_host(const std::string& hostlist);

/// Looks variables up through `env` (nullptr when unset). Throws ConfigError naming the variables when they are
/// partial (RANK without WORLD_SIZE), malformed, out of range (the message gives the range), or when two launchers'
/// variables disagree.
LaunchInfo detect_launch(const std::function<const char*(const char*)>& env);
/// The same, from the process environment.
LaunchInfo detect_launch();

/// "Open MPI's variables (OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=2) say rank 0 of 2": how a message about a
/// launch that cannot work starts.
std::string launch_claim(const LaunchInfo& launch);
/// The message (exit 3) for an MPI_Init that put this process at `mpi_rank` of `mpi_world` where the launcher's
/// variables say otherwise: what is missing (no PMIx or PMI variables to join a job by, looked up through `env`, or
/// a job the library did not join) and how this launcher starts ranks that MPI sees.
std::string mpi_launch_problem(const LaunchInfo& launch, int mpi_rank, int mpi_world,
                               const std::function<const char*(const char*)>& env);

}  // namespace gt
