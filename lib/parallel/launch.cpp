// Launcher detection. Each launcher's variables are read as a group; a group that is partly set is an error, and
// when several groups are set (mpirun inside a Slurm allocation, say) they must agree on rank and world size.
#include "parallel/launch.h"

#include "core/error.h"

#include <charconv>
#include <cstdlib>
#include <limits>
#include <vector>

namespace gt {
namespace {

struct Group {
  const char* launcher;
  const char* rank;
  const char* world;
  const char* local;  ///< may be unset
};

// In precedence order: the launcher that started the process directly comes first.
constexpr Group kGroups[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

int parse_int(const char* name, const char* value, int min) {
  int v = 0;
  const char* end = value + std::char_traits<char>::length(value);
  const auto [p, ec] = std::from_chars(value, end, v);
  // from_chars reads the digits of 99999999999 and says they do not fit an int: that is a range, not a syntax error.
  if ((ec == std::errc() || ec == std::errc::result_out_of_range) && p == end && (ec != std::errc() || v < min))
    throw ConfigError(fmt::format("launcher environment: {}={} is out of range: expected an integer in [{}, {}]", name,
                                  value, min, std::numeric_limits<int>::max()));
  if (ec != std::errc() || p != end)
    throw ConfigError(fmt::format("launcher environment: {}={} is not an integer", name, value));
  return v;
}

// The launcher's variables as a message names them.
std::string variables_of(const std::string& launcher) {
  if (launcher == "openmpi") return "Open MPI's variables";
  if (launcher == "pmi") return "PMI's variables";
  if (launcher == "slurm") return "Slurm's step variables";
  if (launcher == "torchrun") return "torchrun's variables";
  return launcher + "'s variables";
}

}  // namespace

LaunchInfo detect_launch(const std::function<const char*(const char*)>& env) {
  std::vector<LaunchInfo> found;
  for (const Group& g : kGroups) {
    const char* r = env(g.rank);
    const char* w = env(g.world);
    // srun sets SLURM_STEP_ID; a batch script alone has SLURM_PROCID=0 and SLURM_NTASKS=N but runs once, so the
    // Slurm group counts only inside a job step.
    if (std::string(g.launcher) == "slurm" && !env("SLURM_STEP_ID")) continue;
    if (!r && !w) continue;
    if (!r || !w)
      throw ConfigError(
          fmt::format("launcher environment: {} is set but {} is not", r ? g.rank : g.world, r ? g.world : g.rank));
    LaunchInfo info;
    info.launcher = g.launcher;
    info.world = parse_int(g.world, w, 1);
    info.rank = parse_int(g.rank, r, 0);
    if (info.rank >= info.world)
      throw ConfigError(fmt::format("launcher environment: {}={} is not below {}={}", g.rank, r, g.world, w));
    info.local_rank = env(g.local) ? parse_int(g.local, env(g.local), 0) : info.rank;
    info.source = fmt::format("{}={}, {}={}", g.rank, r, g.world, w);
    if (info.launcher == "slurm" && info.world > 1 && !env("PMIX_NAMESPACE") && !env("PMI_FD") && !env("PMI_PORT")) {
      // srun gave no process manager that Open MPI's MPI_Init could join (--mpi=none, a cluster's default): meet
      // over TCP instead, as Lightning does under Slurm. Rank 0 runs on the step's first node; the port comes from
      // the job and step ids, so concurrent steps of one node differ.
      // (Without the node list or the job id, which srun always sets, MPI is tried, and its failure says what to
      // add.)
      const char* nodes = env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_NODELIST");
      const char* job = env("SLURM_JOB_ID");
      if (nodes && job) info.tcp = true;
    }
    if (info.tcp && info.launcher == "slurm") {
      const char* nodes = env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_NODELIST");
      const char* job = env("SLURM_JOB_ID");
      info.master_addr = first_slurm_host(nodes);
      const int64_t id =
          parse_int("SLURM_JOB_ID", job, 0) + 7919LL * parse_int("SLURM_STEP_ID", env("SLURM_STEP_ID"), 0);
      info.master_port = 15000 + static_cast<int>(id % 20000) * 2;  // rank 0 listens one above it
    }
    if (info.launcher == "torchrun") {
      info.tcp = true;
      const char* addr = env("MASTER_ADDR");
      const char* port = env("MASTER_PORT");
      if (info.world > 1 && (!addr || !port))
        throw ConfigError(fmt::format("launcher environment: RANK and WORLD_SIZE are set but {} is not",
                                      addr ? "MASTER_PORT" : "MASTER_ADDR"));
      if (addr) info.master_addr = addr;
      if (port) info.master_port = parse_int("MASTER_PORT", port, 1);
    }
    found.push_back(info);
  }
  if (found.empty()) return {};
  for (size_t i = 1; i < found.size(); ++i)
    if (found[i].rank != found[0].rank || found[i].world != found[0].world)
      throw ConfigError(
          fmt::format("launcher environment: {} ({}) and {} ({}) disagree on this process's rank or "
                      "the world size",
                      found[0].launcher, found[0].source, found[i].launcher, found[i].source));
  return found[0];
}

std::string first_slurm_host(const std::string& hostlist) {
  // The first entry (commas inside brackets do not separate entries), then its first bracketed value.
  size_t end = 0;
  for (int depth = 0; end < hostlist.size(); ++end) {
    if (hostlist[end] == '[') ++depth;
    if (hostlist[end] == ']') --depth;
    if (hostlist[end] == ',' && depth == 0) break;
  }
  const std::string first = hostlist.substr(0, end);
  const size_t open = first.find('['), close = first.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return first;
  const std::string range = first.substr(open + 1, close - open - 1);
  const std::string value = range.substr(0, range.find_first_of(",-"));
  return first.substr(0, open) + value + first.substr(close + 1);
}

LaunchInfo detect_launch() {
  return detect_launch([](const char* name) { return std::getenv(name); });
}

std::string launch_claim(const LaunchInfo& launch) {
  return fmt::format("{} ({}) say rank {} of {}", variables_of(launch.launcher), launch.source, launch.rank,
                     launch.world);
}

std::string mpi_launch_problem(const LaunchInfo& launch, int mpi_rank, int mpi_world,
                               const std::function<const char*(const char*)>& env) {
  // An MPI library joins its job through the process manager the launcher runs: PMIx (Open MPI's mpirun, srun
  // --mpi=pmix) or PMI-1/2 (MPICH's hydra, srun --mpi=pmi2). Without one, MPI_Init makes a world of this process.
  std::string joined;
  for (const char* name : {"PMIX_NAMESPACE", "PMI_FD", "PMI_PORT"})
    if (env(name) && joined.empty()) joined = name;
  const std::string made = mpi_world == launch.world
                               ? fmt::format("MPI_Init made this process rank {} of {}", mpi_rank, mpi_world)
                               : fmt::format("MPI_Init made a world of {}", mpi_world);
  const std::string missing =
      joined.empty() ? "no process manager to join (PMIX_NAMESPACE, PMI_FD and PMI_PORT are unset)"
                     : fmt::format(
                           "the MPI library did not join the job {} names (is gputrain built against another "
                           "MPI than the launcher's?)",
                           joined);
  std::string fix;
  if (launch.launcher == "openmpi")
    fix = fmt::format("start the ranks with mpirun -np {}", launch.world);
  else if (launch.launcher == "slurm")
    fix =
        "launch with srun --mpi=pmix (srun --mpi=list shows what this Slurm offers), or with mpirun inside the "
        "allocation";
  else
    fix = "start the ranks with the mpirun of the MPI gputrain was built with";
  return fmt::format("{}, but {}: {}; {}", launch_claim(launch), made, missing, fix);
}

}  // namespace gt
