// Data-parallel training: launcher detection from environment variables, and 2-rank runs under mpirun and over TCP
// (torchrun's variables, set by the test or by torchrun itself) that must match one process with the same global
// batch.
#include "core/error.h"
#include "core/rng.h"
#include "dist_helpers.h"
#include "graph/model.h"
#include "helpers.h"
#include "io/safetensors.h"
#include "ops/batchnorm.h"
#include "optim/optimizer.h"
#include "parallel/comm.h"
#include "parallel/launch.h"
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

using namespace gt::test;
namespace fs = std::filesystem;

namespace {

gt::LaunchInfo detect(const std::map<std::string, std::string>& vars) {
  return gt::detect_launch([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string dp_config(const std::string& optimizer, int64_t batch, int64_t accumulate) {
  return fmt::format(R"(name: dp
seed: 9
device: cpu
data: {{format: synthetic, samples: 2048, test_samples: 256, input_shape: [1, 6, 6], targets: {{classes: 3}},
        batch_size: {}, augment: {{random_crop: {{padding: 1}}, hflip: true}}}}
model:
  layers:
    - {{type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}}
    - relu
    - flatten
    - {{type: linear, out_features: 16}}
    - tanh
    - {{type: linear, out_features: 3}}
optimizer: {}
train: {{epochs: 2, log_every: 8, accumulate: {}}}
)",
                     batch, optimizer, accumulate);
}

// Starts `mpirun -np 2 gputrain train CONFIG --threads 1 --out OUT` in the background, output to LOG; its pid is
// mpirun's own (exec), so signals sent to it reach mpirun.
pid_t start_two_ranks(const std::string& config, const std::string& out, const std::string& log) {
  const std::string cmd =
      "exec " + mpirun(2) + GT_BINARY + " train " + config + " --threads 1 --out " + out + " > " + log + " 2>&1";
  const pid_t job = fork();
  if (job == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return job;
}

// The pid of rank `rank` of an mpirun job whose command line mentions `marker`.
int find_rank_pid(int rank, const std::string& marker) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(e.path() / "cmdline"), env(e.path() / "environ");
    std::stringstream c, v;
    c << cmd.rdbuf();
    v << env.rdbuf();
    if (c.str().find(marker) == std::string::npos || c.str().find("mpirun") != std::string::npos) continue;
    const std::string want = fmt::format("OMPI_COMM_WORLD_RANK={}", rank);
    const std::string vars = v.str();
    for (size_t pos = 0; (pos = vars.find(want, pos)) != std::string::npos; pos += want.size())
      if ((pos == 0 || vars[pos - 1] == '\0') && (pos + want.size() == vars.size() || vars[pos + want.size()] == '\0'))
        return std::stoi(name);
  }
  return -1;
}

// The pid of rank `rank` of the job whose command line holds `marker`, looked for until `seconds` have passed (a
// loaded machine may take seconds to show a process's environment); -1 when it never shows. On -1 the job's log is
// part of the failure, so that a rank that ended early says why.
int wait_for_rank_pid(int rank, const std::string& marker, const std::string& log, double seconds = 60) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    if (const int pid = find_rank_pid(rank, marker); pid > 0) return pid;
    usleep(10000);
  }
  UNSCOPED_INFO("rank " << rank << " not found; the job's log:\n" << read_text(log));
  return -1;
}

bool have_torchrun() { return std::system("command -v torchrun > /dev/null 2>&1") == 0; }

}  // namespace

TEST_CASE("launchers are recognised from their environment variables alone", "[cpu][dist]") {
  CHECK(detect({}).launcher == "none");
  CHECK(detect({}).world == 1);
  auto ompi =
      detect({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  CHECK(ompi.launcher == "openmpi");
  CHECK((ompi.rank == 3 && ompi.world == 8 && ompi.local_rank == 1));
  auto pmi = detect({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}});
  CHECK((pmi.launcher == "pmi" && pmi.rank == 2 && pmi.world == 4 && pmi.local_rank == 0));
  auto slurm = detect({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"}, {"SLURM_STEP_ID", "0"}});
  CHECK((slurm.launcher == "slurm" && slurm.rank == 5 && slurm.world == 16 && slurm.local_rank == 1));
  // A batch script (no job step) runs once even when the allocation has 16 tasks.
  CHECK(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}}).world == 1);
  auto torchrun = detect(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}});
  CHECK((torchrun.launcher == "torchrun" && torchrun.rank == 1 && torchrun.master_addr == "node7" &&
         torchrun.master_port == 29500));
  // mpirun inside a Slurm step: both agree, and the launcher that started the process directly wins.
  CHECK(detect({{"OMPI_COMM_WORLD_RANK", "1"},
                {"OMPI_COMM_WORLD_SIZE", "2"},
                {"SLURM_PROCID", "1"},
                {"SLURM_NTASKS", "2"},
                {"SLURM_STEP_ID", "3"}})
            .launcher == "openmpi");

  auto refused = [](const std::map<std::string, std::string>& vars, const std::string& message) {
    CHECK_THROWS_WITH(detect(vars), Catch::Contains(message));
  };
  refused({{"RANK", "0"}}, "RANK is set but WORLD_SIZE is not");
  refused({{"WORLD_SIZE", "4"}}, "WORLD_SIZE is set but RANK is not");
  refused({{"RANK", "1"}, {"WORLD_SIZE", "2"}}, "MASTER_ADDR");
  refused({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK=2 is not below");
  refused({{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}}, "PMI_RANK=x is not an integer");
  // A number past int is out of range, not "not an integer"; the message gives the range.
  refused({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}},
          "WORLD_SIZE=99999999999 is out of range: expected an integer in [1, 2147483647]");
  refused({{"PMI_RANK", "-1"}, {"PMI_SIZE", "2"}},
          "PMI_RANK=-1 is out of range: expected an integer in [0, 2147483647]");
  refused({{"OMPI_COMM_WORLD_RANK", "0"},
           {"OMPI_COMM_WORLD_SIZE", "2"},
           {"RANK", "1"},
           {"WORLD_SIZE", "2"},
           {"MASTER_ADDR", "a"},
           {"MASTER_PORT", "1"}},
          "openmpi (OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=2) and torchrun (RANK=1, WORLD_SIZE=2) disagree");
}

TEST_CASE("an MPI world that is not the launcher's is explained: whose variables, what is missing, what to run",
          "[cpu][dist]") {
  const auto env_of = [](std::map<std::string, std::string> vars) {
    return [vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  const gt::LaunchInfo ompi = detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  CHECK(gt::mpi_launch_problem(ompi, 0, 1, env_of({})) ==
        "Open MPI's variables (OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=2) say rank 0 of 2, but MPI_Init made a "
        "world of 1: no process manager to join (PMIX_NAMESPACE, PMI_FD and PMI_PORT are unset); start the ranks "
        "with mpirun -np 2");
  const gt::LaunchInfo slurm =
      detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_STEP_ID", "0"}});
  CHECK_THAT(gt::mpi_launch_problem(slurm, 0, 1, env_of({})),
             Catch::StartsWith("Slurm's step variables (SLURM_PROCID=1, SLURM_NTASKS=4) say rank 1 of 4, but MPI_Init "
                               "made a world of 1: no process manager") &&
                 Catch::EndsWith("launch with srun --mpi=pmix (srun --mpi=list shows what this Slurm offers), or "
                                 "with mpirun inside the allocation"));
  // A process manager was there, but the library did not join it: another MPI than the launcher's.
  const gt::LaunchInfo pmi = detect({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  CHECK_THAT(gt::mpi_launch_problem(pmi, 0, 2, env_of({{"PMI_FD", "5"}})),
             Catch::Contains("say rank 1 of 2, but MPI_Init made this process rank 0 of 2: the MPI library did not "
                             "join the job PMI_FD names"));
}

TEST_CASE("launcher variables without the launcher that sets them end with exit 3, naming them and what is missing",
          "[e2e][dist]") {
  // OMPI_COMM_WORLD_* copied into an environment by hand (no mpirun), or srun's step variables where srun gave MPI
  // no process manager: MPI_Init makes a world of 1 (or there is no MPI in the build), and the run cannot work.
  TempDir dir;
  write_text(dir / "c.yaml", dp_config("{type: sgd, lr: 0.05}", 16, 1));
  struct Case {
    const char* env;
    const char* variables;
  };
  for (const Case& c :
       {Case{"OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_RANK=0",
             "Open MPI's variables (OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=2) say rank 0 of 2, but "},
        Case{"SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 SLURM_STEP_ID=0",
             "Slurm's step variables (SLURM_PROCID=1, SLURM_NTASKS=2) say rank 1 of 2, but "}}) {
    INFO(c.env);
    const auto r = run_gputrain("train " + (dir / "c.yaml") + " --threads 1 --max-steps 1 --out " + (dir / "run"),
                                std::string("env -u PMIX_NAMESPACE -u PMI_FD -u PMI_PORT ") + c.env);
    INFO(r.output);
    CHECK(r.exit_code == 3);
    const std::vector<std::string> lines = lines_of(r.output);
    REQUIRE(!lines.empty());
    CHECK_THAT(lines.back(), Catch::Contains(c.variables));
    CHECK_FALSE(fs::exists(dir / "run"));
  }
}

TEST_CASE("mpirun -np 2 with batch B per rank trains to the parameters of one process with batch 2B", "[e2e][dist]") {
  TempDir dir;
  struct Case {
    const char* name;
    std::string optimizer;
    int64_t accumulate;
    const char* dist = "";
  };
  for (const Case& c :
       {Case{"sgd", "{type: sgd, lr: 0.05, momentum: 0.9}", 1}, Case{"adam", "{type: adam, lr: 0.003}", 1},
        Case{"sgd, accumulating 2", "{type: sgd, lr: 0.05, momentum: 0.9, nesterov: true}", 2},
        Case{"adam, all-reduce after backward, small buckets", "{type: adam, lr: 0.003}", 1,
             "dist: {overlap: false, bucket_mb: 0.001}\n"}}) {
    DYNAMIC_SECTION(c.name) {
      write_text(dir / "two.yaml", dp_config(c.optimizer, 16, c.accumulate) + c.dist);
      write_text(dir / "one.yaml", dp_config(c.optimizer, 32, c.accumulate));
      const auto two = std::system((mpirun(2) + GT_BINARY + " train " + (dir / "two.yaml") + " --threads 1 --out " +
                                    (dir / "two") + " > " + (dir / "two.log") + " 2>&1")
                                       .c_str());
      const std::string log = read_text(dir / "two.log");
      INFO(log);
      REQUIRE(two == 0);
      const auto one = run_gputrain("train " + (dir / "one.yaml") + " --quiet --threads 1 --out " + (dir / "one"));
      REQUIRE(one.exit_code == 0);
      // The same global batches in the same order, averaged gradients: equal up to float summation order.
      CHECK(max_relative_difference(dir / "one/model.safetensors", dir / "two/model.safetensors") < 1e-5);
      const std::string s2 = read_text(dir / "two/summary.json"), s1 = read_text(dir / "one/summary.json");
      CHECK(json_number(s2, "world_size") == 2);
      CHECK(json_number(s2, "steps") == json_number(s1, "steps"));
      CHECK(*json_number(s2, "test_accuracy") == Approx(*json_number(s1, "test_accuracy")).margin(2.0 / 256));
      // Rank 0 alone logs at info level and writes the run directory; rank 1 is silent unless something is wrong.
      CHECK_THAT(log, Catch::Contains("rank 0 of 2 (local rank 0, mpi)") &&
                          Catch::Contains(fmt::format("batch 16 per rank{} = global batch {}",
                                                      c.accumulate > 1 ? " × 2 accumulated" : "", 32 * c.accumulate)));
      CHECK(log.find("[rank 1]") == std::string::npos);
      // Rank 1's sampler readings reach rank 0's train rows (the last one has a sample on every rank).
      const auto rows = lines_of(read_text(dir / "two/metrics.jsonl"));
      std::string last_train;
      for (const auto& row : rows)
        if (row.find("\"type\": \"train\"") != std::string::npos) last_train = row;
      CHECK(json_number(last_train, "rank1_host_rss_mib").value_or(0) > 1);
      CHECK(json_number(last_train, "rank1_host_threads").value_or(0) >= 1);
      fs::remove_all(dir / "one");
      fs::remove_all(dir / "two");
    }
  }
}

TEST_CASE("SIGTERM to one rank stops all at one step with a checkpoint, and a stuck or dead rank ends the others",
          "[e2e][dist]") {
  TempDir dir;
  std::string cfg = dp_config("{type: sgd, lr: 0.05}", 16, 1);
  cfg = std::regex_replace(cfg, std::regex("samples: 2048"), "samples: 200000");
  write_text(dir / "c.yaml", cfg + "dist: {timeout_s: 3}\ncheckpoint: {every_steps: 50}\n");

  SECTION("a stopped rank") {
    const pid_t job = start_two_ranks(dir / "c.yaml", dir / "stuck", dir / "log");
    REQUIRE(wait_for_file(dir / "stuck/metrics.jsonl", 60));
    const int victim = wait_for_rank_pid(1, dir / "c.yaml", dir / "log");
    REQUIRE(victim > 0);
    const auto t0 = std::chrono::steady_clock::now();
    kill(victim, SIGSTOP);  // alive but not answering
    int status = 0;
    waitpid(job, &status, 0);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    kill(victim, SIGKILL);
    const std::string log = read_text(dir / "log");
    INFO(log);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) != 0);
    CHECK(waited < 30);
    CHECK_THAT(log, Catch::Contains("rank 0: no answer for 3 s in ") &&
                        Catch::Contains("rank 1 failed or stopped responding"));
  }
  SECTION("a rank that dies") {
    const pid_t job = start_two_ranks(dir / "c.yaml", dir / "dead", dir / "log");
    REQUIRE(wait_for_file(dir / "dead/metrics.jsonl", 60));
    const int victim = wait_for_rank_pid(1, dir / "c.yaml", dir / "log");
    REQUIRE(victim > 0);
    const auto t0 = std::chrono::steady_clock::now();
    kill(victim, SIGKILL);
    int status = 0;
    waitpid(job, &status, 0);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string log = read_text(dir / "log");
    INFO(log);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) != 0);
    CHECK(waited < 30);
    CHECK_THAT(log, Catch::Contains("rank 1"));  // mpirun names the rank that died
  }
  SECTION("Ctrl-C to mpirun ends the job with a checkpoint to resume from") {
    // Open MPI 4.1's mpirun, on SIGINT, sends SIGCONT, waits odls_base_sigkill_timeout (1 s), sends SIGTERM, waits
    // again and kills. The ranks then stop together at one step (the flag travels with the step's sums) — unless
    // mpirun's teardown of the job has already stalled their collectives (seen here, at random, a few hundred ms in:
    // one rank in the step's sums, the other in the gradients' all-reduce), in which case the kill ends them. Either
    // way the job ends at once and the newest checkpoint is whole: a run resumes from it.
    const pid_t job = start_two_ranks(dir / "c.yaml", dir / "int", dir / "log");
    REQUIRE(wait_for_file(dir / "int/checkpoints/latest", 60));
    const auto t0 = std::chrono::steady_clock::now();
    kill(job, SIGINT);  // what a terminal sends mpirun
    int status = 0;
    waitpid(job, &status, 0);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string log = read_text(dir / "log");
    INFO(log);
    CHECK(WIFEXITED(status));
    CHECK(waited < 30);
    // The clean stop ends with summary.json; a rank that logged its stop can still be killed before writing it
    // (seen in CI: "stopping after step" in the log, no summary), which is the kill case below.
    if (fs::exists(dir / "int/summary.json")) {  // the clean stop
      const std::string summary = read_text(dir / "int/summary.json");
      CHECK(json_string(summary, "exit_reason") == "interrupted");
      const auto steps = json_number(summary, "steps");
      REQUIRE(steps.has_value());
      CHECK(fs::exists(dir / fmt::format("int/checkpoints/step-{}", static_cast<int64_t>(*steps))));
    } else {
      WARN("mpirun killed the ranks before their coordinated stop (Open MPI's teardown stalled them)");
    }
    // One process resumes from the newest checkpoint and takes two more steps.
    const std::string latest = read_text(dir / "int/checkpoints/latest");
    const int64_t at = std::stoll(latest.substr(latest.find('-') + 1));
    const int resumed = std::system(fmt::format("{} train {} --threads 1 --quiet --resume auto --max-steps {} --out {} "
                                                "> {} 2>&1",
                                                GT_BINARY, dir / "c.yaml", at + 2, dir / "int", dir / "resume.log")
                                        .c_str());
    INFO(read_text(dir / "resume.log"));
    CHECK(WEXITSTATUS(resumed) == 0);
    CHECK(json_number(read_text(dir / "int/summary.json"), "steps").value_or(0) == at + 2);
  }
  SECTION("SIGTERM to one rank stops both at the same step") {
    const pid_t job = start_two_ranks(dir / "c.yaml", dir / "term", dir / "log");
    REQUIRE(wait_for_file(dir / "term/checkpoints/latest", 60));
    const int victim = wait_for_rank_pid(1, dir / "c.yaml", dir / "log");
    REQUIRE(victim > 0);
    kill(victim, SIGTERM);  // the stop flag travels with the step's all-reduce: rank 0 stops at the same step
    int status = 0;
    waitpid(job, &status, 0);
    const std::string log = read_text(dir / "log");
    INFO(log);
    const std::string summary = read_text(dir / "term/summary.json");
    CHECK(json_string(summary, "exit_reason") == "interrupted");
    const auto steps = json_number(summary, "steps");
    REQUIRE(steps.has_value());
    CHECK(fs::exists(dir / fmt::format("term/checkpoints/step-{}", static_cast<int64_t>(*steps))));
    CHECK_THAT(log, Catch::Contains("a stop on another rank received: stopping after step"));
  }
}

TEST_CASE("a checkpoint written by 2 ranks resumes on 1, saying that the data order differs from there",
          "[e2e][dist]") {
  TempDir dir;
  write_text(dir / "c.yaml", dp_config("{type: adam, lr: 0.003}", 16, 1));
  const int two =
      std::system((mpirun(2) + GT_BINARY + " train " + (dir / "c.yaml") + " --quiet --threads 1 --max-steps 40 --out " +
                   (dir / "run") + " > " + (dir / "log") + " 2>&1")
                      .c_str());
  INFO(read_text(dir / "log"));
  REQUIRE(two == 0);
  CHECK(gt::read_checkpoint(dir / "run/checkpoints/step-40").world_size == 2);
  const auto one = run_gputrain("train " + (dir / "c.yaml") + " --threads 1 --resume auto --out " + (dir / "run"));
  INFO(one.output);
  CHECK(one.exit_code == 0);
  CHECK_THAT(one.output, Catch::Contains("written by 2 rank(s) and this run has 1: the data order differs") &&
                             Catch::Contains("resuming from"));
  CHECK_THAT(one.output, Catch::Contains("step 40, epoch 1, 1280 samples into it"));  // 40 × 32 samples
  CHECK(json_number(read_text(dir / "run/summary.json"), "world_size") == 1);

  // A failure on rank 0 alone (this folder already holds a run) ends rank 1 at once instead of leaving it waiting.
  const auto t0 = std::chrono::steady_clock::now();
  const int clash = std::system((mpirun(2) + GT_BINARY + " train " + (dir / "c.yaml") + " --out " + (dir / "run") +
                                 " > " + (dir / "clash.log") + " 2>&1")
                                    .c_str());
  INFO(read_text(dir / "clash.log"));
  CHECK(clash != 0);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 20);
  CHECK_THAT(read_text(dir / "clash.log"), Catch::Contains("holds a finished run (summary.json) already"));
}

TEST_CASE(
    "2 ranks over TCP (torchrun's variables, no MPI) with batch B train to the parameters of 1 process with "
    "batch 2B",
    "[e2e][dist]") {
  TempDir dir;
  struct Case {
    const char* name;
    std::string optimizer;
    const char* dist = "";
    int slot;
  };
  for (const Case& c : {Case{"sgd", "{type: sgd, lr: 0.05, momentum: 0.9}", "", 0},
                        Case{"adam, all-reduce after backward, small buckets", "{type: adam, lr: 0.003}",
                             "dist: {overlap: false, bucket_mb: 0.001}\n", 1}}) {
    DYNAMIC_SECTION(c.name) {
      write_text(dir / "two.yaml", dp_config(c.optimizer, 16, 1) + c.dist);
      write_text(dir / "one.yaml", dp_config(c.optimizer, 32, 1));
      const std::string args = "train " + (dir / "two.yaml") + " --threads 1 --out " + (dir / "two");
      const auto r0 = start_tcp_rank(0, 2, tcp_test_port(c.slot), args, dir / "log0");
      const auto r1 = start_tcp_rank(1, 2, tcp_test_port(c.slot), args, dir / "log1");
      const int e0 = wait_exit(r0), e1 = wait_exit(r1);
      const std::string log = read_text(dir / "log0");
      INFO(log + read_text(dir / "log1"));
      REQUIRE(e0 == 0);
      REQUIRE(e1 == 0);
      const auto one = run_gputrain("train " + (dir / "one.yaml") + " --quiet --threads 1 --out " + (dir / "one"));
      REQUIRE(one.exit_code == 0);
      CHECK(max_relative_difference(dir / "one/model.safetensors", dir / "two/model.safetensors") < 1e-5);
      const std::string s2 = read_text(dir / "two/summary.json"), s1 = read_text(dir / "one/summary.json");
      CHECK(json_number(s2, "world_size") == 2);
      CHECK(json_number(s2, "steps") == json_number(s1, "steps"));
      CHECK_THAT(log, Catch::Contains("rank 0 of 2 (local rank 0, tcp)") &&
                          Catch::Contains("batch 16 per rank = global batch 32"));
      CHECK(read_text(dir / "log1").find("[rank 1]") == std::string::npos);
      fs::remove_all(dir / "one");
      fs::remove_all(dir / "two");
    }
  }
}

TEST_CASE("a Slurm step without PMI meets over TCP at its first node, with a port from the job and step",
          "[cpu][dist]") {
  CHECK(gt::first_slurm_host("node07") == "node07");
  CHECK(gt::first_slurm_host("node[07-12,15],gpu3") == "node07");
  CHECK(gt::first_slurm_host("gpu3,node[07-12]") == "gpu3");
  CHECK(gt::first_slurm_host("rack[2-3]-n[001-004]") == "rack2-n[001-004]");  // (Slurm puts one range per name)
  const auto step = [](const std::map<std::string, std::string>& extra) {
    std::map<std::string, std::string> v{{"SLURM_PROCID", "1"},      {"SLURM_NTASKS", "4"},
                                         {"SLURM_LOCALID", "1"},     {"SLURM_STEP_ID", "2"},
                                         {"SLURM_JOB_ID", "123456"}, {"SLURM_STEP_NODELIST", "n[03-04]"}};
    v.insert(extra.begin(), extra.end());
    return v;
  };
  const gt::LaunchInfo plain = detect(step({}));
  CHECK(plain.launcher == "slurm");
  CHECK(plain.tcp);
  CHECK(plain.master_addr == "n03");
  CHECK(plain.master_port == 15000 + (123456 + 7919 * 2) % 20000 * 2);
  // srun --mpi=pmix (or pmi2) gives MPI its process manager: MPI_Init joins the job as before.
  CHECK_FALSE(detect(step({{"PMIX_NAMESPACE", "slurm.pmix.123456.2"}})).tcp);
  CHECK_FALSE(detect(step({{"PMI_FD", "7"}})).tcp);
}

TEST_CASE("2 ranks that plain srun starts (no PMI) train over TCP like 1 process with batch 2B", "[e2e][dist]") {
  TempDir dir;
  write_text(dir / "two.yaml", dp_config("{type: sgd, lr: 0.05, momentum: 0.9}", 16, 1));
  write_text(dir / "one.yaml", dp_config("{type: sgd, lr: 0.05, momentum: 0.9}", 32, 1));
  const std::string args = "train " + (dir / "two.yaml") + " --threads 1 --out " + (dir / "two");
  // What plain `srun -n 2` (MpiDefault=none) puts in each task's environment, and no PMI variable.
  const int job = 3000 + static_cast<int>(getpid() % 5000) * 3;
  auto rank = [&](int r) {
    return start_gputrain(args, dir / fmt::format("log{}", r),
                          fmt::format("SLURM_JOB_ID={} SLURM_STEP_ID=0 SLURM_PROCID={} SLURM_NTASKS=2 SLURM_LOCALID={} "
                                      "SLURM_STEP_NODELIST=localhost",
                                      job, r, r));
  };
  const auto r0 = rank(0), r1 = rank(1);
  const int e0 = wait_exit(r0), e1 = wait_exit(r1);
  const std::string log = read_text(dir / "log0");
  INFO(log + read_text(dir / "log1"));
  REQUIRE(e0 == 0);
  REQUIRE(e1 == 0);
  CHECK_THAT(log, Catch::Contains("rank 0 of 2 (local rank 0, tcp)"));
  REQUIRE(run_gputrain("train " + (dir / "one.yaml") + " --quiet --threads 1 --out " + (dir / "one")).exit_code == 0);
  CHECK(max_relative_difference(dir / "one/model.safetensors", dir / "two/model.safetensors") < 1e-5);
}

TEST_CASE("over TCP, a stuck, dead or failing rank ends the other with exit 3 naming it", "[e2e][dist]") {
  TempDir dir;
  std::string cfg = dp_config("{type: sgd, lr: 0.05}", 16, 1);
  cfg = std::regex_replace(cfg, std::regex("samples: 2048"), "samples: 200000");
  write_text(dir / "c.yaml", cfg + "dist: {timeout_s: 3}\n");
  const std::string args = "train " + (dir / "c.yaml") + " --threads 1 --out " + (dir / "run");

  // `victim` is stopped or killed once rank 0 trains; the other rank must end, naming it, within the timeout.
  auto survivor_of = [&](int victim, int signal, int slot) {
    const auto r0 = start_tcp_rank(0, 2, tcp_test_port(slot), args, dir / "log0");
    const auto r1 = start_tcp_rank(1, 2, tcp_test_port(slot), args, dir / "log1");
    const Background& dead = victim == 0 ? r0 : r1;
    const Background& alive = victim == 0 ? r1 : r0;
    REQUIRE(wait_for_file(dir / "run/metrics.jsonl", 60));
    const auto t0 = std::chrono::steady_clock::now();
    kill(dead.pid, signal);
    const int code = wait_exit(alive);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    kill(dead.pid, SIGKILL);
    wait_exit(dead);
    const std::string log = read_text(alive.log);
    INFO(log);
    CHECK(code == 3);
    CHECK(waited < 30);
    return log;
  };
  SECTION("rank 1 stopped") {
    const std::string log = survivor_of(1, SIGSTOP, 0);
    CHECK_THAT(log, Catch::Contains("rank 0: no answer for 3 s in ") &&
                        Catch::Contains("rank 1 failed or stopped responding (dist.timeout_s)"));
  }
  SECTION("rank 0 stopped") {
    const std::string log = survivor_of(0, SIGSTOP, 1);
    CHECK_THAT(log, Catch::Contains("rank 1: no answer for 3 s in ") &&
                        Catch::Contains("rank 0 failed or stopped responding (dist.timeout_s)"));
  }
  SECTION("rank 1 killed") {
    const std::string log = survivor_of(1, SIGKILL, 2);
    CHECK_THAT(log, Catch::Contains("rank 0: the connection to rank 1 ended in ") &&
                        Catch::Contains("rank 1 failed or was stopped"));
  }
  SECTION("rank 0 fails before training: rank 1 ends at once") {
    // A first run leaves checkpoints in the folder: rank 0 alone refuses to start over them.
    const std::string first = args + " --max-steps 5 --quiet";
    const auto f0 = start_tcp_rank(0, 2, tcp_test_port(3), first, dir / "log0");
    const auto f1 = start_tcp_rank(1, 2, tcp_test_port(3), first, dir / "log1");
    REQUIRE(wait_exit(f0) == 0);
    REQUIRE(wait_exit(f1) == 0);
    const auto t0 = std::chrono::steady_clock::now();
    const auto r0 = start_tcp_rank(0, 2, tcp_test_port(3), args, dir / "log0");
    const auto r1 = start_tcp_rank(1, 2, tcp_test_port(3), args, dir / "log1");
    const int e0 = wait_exit(r0), e1 = wait_exit(r1);
    INFO(read_text(dir / "log0") + read_text(dir / "log1"));
    CHECK(e0 != 0);
    CHECK(e1 == 3);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 20);
    CHECK_THAT(read_text(dir / "log0"), Catch::Contains("run (summary.json) already"));
    CHECK_THAT(read_text(dir / "log1"), Catch::Contains("rank 1: the connection to rank 0 ended"));
  }
  SECTION("a rank that never arrives") {
    const auto t0 = std::chrono::steady_clock::now();
    const auto r0 = start_tcp_rank(0, 2, tcp_test_port(0), args, dir / "log0");
    const int e0 = wait_exit(r0);
    INFO(read_text(dir / "log0"));
    CHECK(e0 == 3);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 30);
    CHECK_THAT(read_text(dir / "log0"), Catch::Contains("rank 0: rank(s) 1 did not connect to TCP port"));
  }
}

TEST_CASE("torchrun --no_python --nproc_per_node 2 trains to the parameters of 1 process with batch 2B",
          "[e2e][dist]") {
  if (!have_torchrun()) {
    WARN("torchrun is not installed: the same runs over TCP with torchrun's variables are tested above");
    return;
  }
  TempDir dir;
  write_text(dir / "two.yaml", dp_config("{type: adam, lr: 0.003}", 16, 1));
  write_text(dir / "one.yaml", dp_config("{type: adam, lr: 0.003}", 32, 1));
  // --redirects 1 --tee 1: Debian's torch 1.13 fails on Python 3.11 with its default (no redirection).
  const int two = std::system(fmt::format("torchrun --no_python --nproc_per_node 2 --master_port {} --redirects 1 "
                                          "--tee 1 {} train {} --threads 1 --out {} > {} 2>&1",
                                          tcp_test_port(0), GT_BINARY, dir / "two.yaml", dir / "two", dir / "log")
                                  .c_str());
  const std::string log = read_text(dir / "log");
  INFO(log);
  REQUIRE(two == 0);
  const auto one = run_gputrain("train " + (dir / "one.yaml") + " --quiet --threads 1 --out " + (dir / "one"));
  REQUIRE(one.exit_code == 0);
  CHECK(max_relative_difference(dir / "one/model.safetensors", dir / "two/model.safetensors") < 1e-5);
  CHECK(json_number(read_text(dir / "two/summary.json"), "world_size") == 2);
  CHECK_THAT(log, Catch::Contains("rank 0 of 2 (local rank 0, tcp)"));
}

TEST_CASE("thread communicators sum in rank order, time out naming the missing rank, and stop on a peer's failure",
          "[cpu][dist]") {
  SECTION("allreduce and broadcast between 3 threads") {
    auto comms = gt::make_thread_comms(3, 10.0);
    std::vector<std::vector<float>> data(3);
    std::vector<std::vector<double>> bcast(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r)
      threads.emplace_back([&, r] {
        const float order[3] = {1.0f, 1e8f, -1e8f};  // (1 + 1e8) − 1e8 = 0 in float; (1e8 − 1e8) + 1 = 1
        data[static_cast<size_t>(r)] = {1.0f + static_cast<float>(r), order[r], 0.5f};
        comms[static_cast<size_t>(r)]->allreduce_sum(data[static_cast<size_t>(r)].data(), 3, "test values");
        bcast[static_cast<size_t>(r)] = {static_cast<double>(r), static_cast<double>(10 * r)};
        comms[static_cast<size_t>(r)]->broadcast(bcast[static_cast<size_t>(r)].data(), 2 * sizeof(double), 2, "test");
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 3; ++r) {
      CHECK(data[static_cast<size_t>(r)][0] == 6.0f);
      CHECK(data[static_cast<size_t>(r)][1] == 0.0f);  // summed in rank order, on every rank
      CHECK(data[static_cast<size_t>(r)][2] == 1.5f);
      CHECK(bcast[static_cast<size_t>(r)] == std::vector<double>{2.0, 20.0});
    }
  }
  SECTION("allgather and reduce-scatter between 3 threads: rank order, and the bits of allreduce") {
    auto comms = gt::make_thread_comms(3, 10.0);
    constexpr size_t kChunk = 2, kAll = 3 * kChunk;
    std::vector<std::vector<float>> gathered(3, std::vector<float>(kAll, -1.0f)), scattered(3), reduced(3);
    std::vector<std::vector<double>> gathered_d(3, std::vector<double>(kAll, -1.0)), scattered_d(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r)
      threads.emplace_back([&, r] {
        const auto ur = static_cast<size_t>(r);
        const float mine[kChunk] = {10.0f * static_cast<float>(r), 10.0f * static_cast<float>(r) + 1};
        comms[ur]->allgather(mine, gathered[ur].data(), kChunk, "test chunks");
        const double mine_d[kChunk] = {0.5 * r, -0.5 * r};
        comms[ur]->allgather(mine_d, gathered_d[ur].data(), kChunk, "test chunks");
        // Element 1 of every chunk sums 1, 1e8, −1e8 in rank order (0 in float; 1 in any other order).
        const float order[3] = {1.0f, 1e8f, -1e8f};
        std::vector<float> full(kAll);
        for (size_t k = 0; k < kAll; ++k) full[k] = k % 2 == 1 ? order[r] : static_cast<float>(k + ur);
        scattered[ur].assign(kChunk, -1.0f);
        comms[ur]->reduce_scatter_sum(full.data(), scattered[ur].data(), kChunk, "test sums");
        reduced[ur] = full;
        comms[ur]->allreduce_sum(reduced[ur].data(), kAll, "test sums");
        std::vector<double> full_d(kAll, static_cast<double>(r + 1));
        scattered_d[ur].assign(kChunk, -1.0);
        comms[ur]->reduce_scatter_sum(full_d.data(), scattered_d[ur].data(), kChunk, "test sums");
      });
    for (auto& t : threads) t.join();
    for (size_t r = 0; r < 3; ++r) {
      CHECK(gathered[r] == std::vector<float>{0, 1, 10, 11, 20, 21});
      CHECK(gathered_d[r] == std::vector<double>{0, -0.0, 0.5, -0.5, 1, -1});
      // Rank r holds chunk r of the sum: element 2r is Σ_q (2r + q) = 6r + 3, element 2r + 1 is (1 + 1e8) − 1e8.
      CHECK(scattered[r] == std::vector<float>{static_cast<float>(6 * r + 3), 0.0f});
      CHECK(std::equal(scattered[r].begin(), scattered[r].end(), reduced[r].begin() + static_cast<long>(kChunk * r)));
      CHECK(scattered_d[r] == std::vector<double>{6.0, 6.0});
    }
  }
  SECTION("a rank that never arrives in an allgather or a reduce-scatter") {
    auto comms = gt::make_thread_comms(2, 0.3);
    float v = 1, out[2] = {0, 0};
    CHECK_THROWS_WITH(comms[0]->allgather(&v, out, 1, "the new weights"),
                      Catch::Contains("rank 0: no answer for 0 s in allgather of the new weights: rank 1 failed"));
    auto again = gt::make_thread_comms(2, 0.3);
    CHECK_THROWS_WITH(again[0]->reduce_scatter_sum(out, &v, 1, "the gradients"),
                      Catch::Contains("rank 0: no answer for 0 s in reduce-scatter of the gradients: rank 1"));
  }
  SECTION("a rank that never arrives") {
    auto comms = gt::make_thread_comms(2, 0.3);
    float v = 1;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comms[0]->allreduce_sum(&v, 1, "the gradients");
      FAIL("the collective returned without rank 1");
    } catch (const gt::Error& e) {
      CHECK(e.kind() == gt::ErrorKind::distributed);
      CHECK_THAT(e.what(), Catch::Contains("rank 0: no answer for 0 s in allreduce of the gradients: rank 1 failed"));
    }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  }
  SECTION("a rank that failed") {
    auto comms = gt::make_thread_comms(2, 60.0);
    std::thread failing([&] { comms[1]->abort(1); });
    failing.join();
    double v = 1;
    CHECK_THROWS_AS(comms[0]->allreduce_sum(&v, 1, "the step's loss"), gt::PeerFailure);
  }
}

TEST_CASE("synchronised batch norm over 2 ranks computes what one process computes over their concatenated batch",
          "[cpu][dist]") {
  // x (B, C, H, W) in f64; rank r takes samples [r·B/2, (r+1)·B/2). Values offset from zero (mean ≈ 2, spread ≈ 1)
  // so a mean or variance taken over one rank alone is visibly wrong.
  const int64_t batch = 6, ch = 3, sp = 4 * 5, half = batch / 2;
  const gt::Shape xs{batch, ch, 4, 5}, hs{half, ch, 4, 5}, cs{ch};
  const double momentum = 0.1, eps = 1e-5;
  gt::Rng rng(5, 0);
  auto filled = [&](const gt::Shape& shape, double lo, double hi) {
    gt::Tensor t = gt::Tensor::empty(shape, gt::DType::f64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = rng.uniform(lo, hi);
    return t;
  };
  const gt::Tensor x = filled(xs, 0.3, 3.7), dy = filled(xs, -1, 1), gamma = filled(cs, 0.5, 1.5),
                   beta = filled(cs, -1, 1), rm0 = filled(cs, -0.5, 0.5), rv0 = filled(cs, 0.5, 1.5);
  auto part = [&](const gt::Tensor& whole, int r) {  // rank r's samples
    gt::Tensor t = gt::Tensor::empty(hs, gt::DType::f64);
    std::copy_n(whole.data<double>() + r * half * ch * sp, t.numel(), t.data<double>());
    return t;
  };

  // One process over the whole batch.
  gt::Tensor rm = rm0.clone(), rv = rv0.clone(), sm = gt::Tensor::empty(cs, gt::DType::f64),
             si = gt::Tensor::empty(cs, gt::DType::f64), y = gt::Tensor::empty(xs, gt::DType::f64),
             dx = gt::Tensor::empty(xs, gt::DType::f64), dg = gt::Tensor::empty(cs, gt::DType::f64),
             db = gt::Tensor::empty(cs, gt::DType::f64);
  gt::ops::batchnorm_forward(x, gamma, beta, rm, rv, momentum, eps, true, sm, si, y);
  gt::ops::batchnorm_backward(x, gamma, sm, si, dy, true, dx, dg, db, 0.0);

  // Two ranks on threads, each with its half.
  struct Rank {
    gt::Tensor rm, rv, sm, si, y, dx, dg, db;
    int64_t count = 0;
    int calls = 0;
  };
  std::vector<Rank> ranks(2);
  auto comms = gt::make_thread_comms(2, 30.0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Rank& k = ranks[static_cast<size_t>(r)];
      k.rm = rm0.clone();
      k.rv = rv0.clone();
      k.sm = gt::Tensor::empty(cs, gt::DType::f64);
      k.si = gt::Tensor::empty(cs, gt::DType::f64);
      k.y = gt::Tensor::empty(hs, gt::DType::f64);
      k.dx = gt::Tensor::empty(hs, gt::DType::f64);
      k.dg = gt::Tensor::empty(cs, gt::DType::f64);
      k.db = gt::Tensor::empty(cs, gt::DType::f64);
      const gt::ops::SumOverRanks sum = [&](double* data, size_t n) {
        ++k.calls;
        comms[static_cast<size_t>(r)]->allreduce_sum(data, n, "batch norm");
      };
      const gt::Tensor xr = part(x, r), dyr = part(dy, r);
      k.count = gt::ops::batchnorm_forward_sync(xr, gamma, beta, k.rm, k.rv, momentum, eps, k.sm, k.si, k.y, sum);
      gt::ops::batchnorm_backward_sync(xr, gamma, k.sm, k.si, dyr, k.count, k.dx, k.dg, k.db, 0.0, sum);
    });
  for (auto& t : threads) t.join();

  auto max_diff = [](const gt::Tensor& a, const double* b) {
    double worst = 0;
    for (int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::abs(a.data<double>()[i] - b[i]));
    return worst;
  };
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const Rank& k = ranks[static_cast<size_t>(r)];
    CHECK(k.count == batch * sp);
    CHECK(k.calls == 2);  // one all-reduce forward, one backward
    CHECK(max_diff(k.sm, sm.data<double>()) < 1e-12);
    CHECK(max_diff(k.si, si.data<double>()) < 1e-10);
    CHECK(max_diff(k.rm, rm.data<double>()) < 1e-12);
    CHECK(max_diff(k.rv, rv.data<double>()) < 1e-12);  // unbiased over the global count
    CHECK(max_diff(k.y, y.data<double>() + r * half * ch * sp) < 1e-10);
    CHECK(max_diff(k.dx, dx.data<double>() + r * half * ch * sp) < 1e-10);
  }
  // γ and β gradients are each rank's own sums; together they are the whole batch's.
  for (int64_t c = 0; c < ch; ++c) {
    CHECK(std::abs(ranks[0].dg.data<double>()[c] + ranks[1].dg.data<double>()[c] - dg.data<double>()[c]) < 1e-10);
    CHECK(std::abs(ranks[0].db.data<double>()[c] + ranks[1].db.data<double>()[c] - db.data<double>()[c]) < 1e-10);
  }
  // Per rank without the sync, the statistics differ (what the comparison above would catch).
  gt::Tensor rm1 = rm0.clone(), rv1 = rv0.clone(), y1 = gt::Tensor::empty(hs, gt::DType::f64);
  gt::ops::batchnorm_forward(part(x, 0), gamma, beta, rm1, rv1, momentum, eps, true, sm, si, y1);
  CHECK(max_diff(y1, y.data<double>()) > 1e-3);
}

TEST_CASE("synchronised batch norm is refused for a model on a GPU, naming dist.sync_batchnorm", "[cpu][dist]") {
  const auto root =
      gt::ConfigNode::load_string("model: {layers: [batchnorm1d, {type: linear, out_features: 2}]}\n", "t.yaml");
  auto comm = gt::make_local_comm();
  // Shapes only: nothing is allocated on the device, so this runs without one.
  gt::Model gpu = gt::Model::build(gt::parse_model_spec(root["model"]), gt::Shape{4}, gt::DType::f32,
                                   gt::Device::cuda(0), 1, false);
  const gt::ops::SumOverRanks sum = [&comm](double* data, size_t n) { comm->allreduce_sum(data, n, "test"); };
  CHECK_THROWS_WITH(gpu.set_sync(sum),
                    Catch::Contains("dist.sync_batchnorm: synchronised batch norm on GPUs is not built"));
  gt::Model cpu =
      gt::Model::build(gt::parse_model_spec(root["model"]), gt::Shape{4}, gt::DType::f32, gt::Device::cpu(), 1);
  CHECK_NOTHROW(cpu.set_sync(sum));
}

TEST_CASE("device: [cpu, cpu] runs two workers in one process that train like one with batch 2B, and like mpirun",
          "[e2e][dist]") {
  TempDir dir;
  struct Case {
    const char* name;
    std::string optimizer;
    int64_t accumulate;
  };
  for (const Case& c :
       {Case{"sgd", "{type: sgd, lr: 0.05, momentum: 0.9}", 1}, Case{"adam", "{type: adam, lr: 0.003}", 1},
        Case{"sgd, accumulating 2", "{type: sgd, lr: 0.05, momentum: 0.9, nesterov: true}", 2}}) {
    DYNAMIC_SECTION(c.name) {
      write_text(dir / "two.yaml", dp_config(c.optimizer, 16, c.accumulate));
      write_text(dir / "one.yaml", dp_config(c.optimizer, 32, c.accumulate));
      const auto two =
          run_gputrain("train " + (dir / "two.yaml") + " --device '[cpu, cpu]' --threads 2 --out " + (dir / "two"));
      INFO(two.output);
      REQUIRE(two.exit_code == 0);
      const auto one = run_gputrain("train " + (dir / "one.yaml") + " --quiet --threads 1 --out " + (dir / "one"));
      REQUIRE(one.exit_code == 0);
      CHECK(max_relative_difference(dir / "one/model.safetensors", dir / "two/model.safetensors") < 1e-5);
      const std::string s2 = read_text(dir / "two/summary.json");
      CHECK(json_number(s2, "world_size") == 2);
      CHECK_THAT(two.output, Catch::Contains("rank 0 of 2 (local rank 0, threads), device cpu") &&
                                 Catch::Contains("1 CPU thread(s)") && Catch::Contains("per rank"));
      CHECK(two.output.find("[rank 1]") == std::string::npos);  // worker 1 only warns
      if (c.accumulate == 1 && c.optimizer.find("sgd") != std::string::npos) {
        // Two ranks sum a + b whether they are threads or processes: the same bits.
        const auto mpi = std::system((mpirun(2) + GT_BINARY + " train " + (dir / "two.yaml") +
                                      " --quiet --threads 1 --out " + (dir / "mpi") + " > /dev/null 2>&1")
                                         .c_str());
        REQUIRE(mpi == 0);
        CHECK(max_relative_difference(dir / "mpi/model.safetensors", dir / "two/model.safetensors") == 0);
      }
      for (const char* d : {"one", "two", "mpi"}) fs::remove_all(dir / d);
    }
  }
}

// conv → batchnorm2d → relu → flatten → linear on the data of dp_config, with the `dist` section given.
std::string bn_config(int64_t batch, const std::string& dist, int64_t accumulate = 1) {
  return fmt::format(R"(name: bn
seed: 9
device: cpu
data: {{format: synthetic, samples: 1024, test_samples: 128, input_shape: [1, 6, 6], targets: {{classes: 3}},
        batch_size: {}, augment: {{random_crop: {{padding: 1}}, hflip: true}}}}
model:
  layers:
    - {{type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}}
    - batchnorm2d
    - relu
    - flatten
    - {{type: linear, out_features: 3}}
optimizer: {{type: sgd, lr: 0.05, momentum: 0.9}}
train: {{epochs: 2, log_every: 8, accumulate: {}}}
dist: {}
)",
                     batch, accumulate, dist);
}

TEST_CASE(
    "dist.sync_batchnorm: 2 ranks with batch B train batch norm to the parameters and running statistics of 1 "
    "process with batch 2B",
    "[e2e][dist]") {
  TempDir dir;
  write_text(dir / "one.yaml", bn_config(32, "{sync_batchnorm: true}"));  // one rank: the key changes nothing
  const auto one = run_gputrain("train " + (dir / "one.yaml") + " --quiet --threads 1 --out " + (dir / "one"));
  INFO(one.output);
  REQUIRE(one.exit_code == 0);
  write_text(dir / "one_plain.yaml", bn_config(32, "{sync_batchnorm: false}"));
  REQUIRE(run_gputrain("train " + (dir / "one_plain.yaml") + " --quiet --threads 1 --out " + (dir / "one_plain"))
              .exit_code == 0);
  CHECK(max_relative_difference(dir / "one/model.safetensors", dir / "one_plain/model.safetensors") == 0);
  // model.safetensors holds the running statistics too, so they are compared with the weights.
  bool has_running_var = false;
  for (const auto& [name, t] : gt::read_safetensors(dir / "one/model.safetensors"))
    has_running_var = has_running_var || name == "layers.1.running_var";
  REQUIRE(has_running_var);

  SECTION("worker threads") {
    write_text(dir / "two.yaml", bn_config(16, "{sync_batchnorm: true}"));
    const auto two =
        run_gputrain("train " + (dir / "two.yaml") + " --device '[cpu, cpu]' --threads 2 --out " + (dir / "two"));
    INFO(two.output);
    REQUIRE(two.exit_code == 0);
    CHECK_THAT(two.output, Catch::Contains("after backward (dist.overlap: false)"));
    CHECK(max_relative_difference(dir / "one/model.safetensors", dir / "two/model.safetensors") < 1e-5);
    // Without the sync each rank normalises its own 16 samples: visibly different (the check above can fail).
    write_text(dir / "two_plain.yaml", bn_config(16, "{sync_batchnorm: false}"));
    REQUIRE(run_gputrain("train " + (dir / "two_plain.yaml") + " --device '[cpu, cpu]' --threads 2 --quiet --out " +
                         (dir / "two_plain"))
                .exit_code == 0);
    CHECK(max_relative_difference(dir / "one/model.safetensors", dir / "two_plain/model.safetensors") > 1e-4);
  }
  SECTION("mpirun -np 2") {
    write_text(dir / "two.yaml", bn_config(16, "{sync_batchnorm: true}"));
    const auto mpi = std::system((mpirun(2) + GT_BINARY + " train " + (dir / "two.yaml") +
                                  " --quiet --threads 1 --out " + (dir / "mpi") + " > /dev/null 2>&1")
                                     .c_str());
    REQUIRE(mpi == 0);
    CHECK(max_relative_difference(dir / "one/model.safetensors", dir / "mpi/model.safetensors") < 1e-5);
  }
  SECTION("accumulating 2 micro-batches: each one's statistics are over its global micro-batch") {
    write_text(dir / "one_acc.yaml", bn_config(32, "{sync_batchnorm: true}", 2));
    REQUIRE(
        run_gputrain("train " + (dir / "one_acc.yaml") + " --quiet --threads 1 --out " + (dir / "one_acc")).exit_code ==
        0);
    write_text(dir / "two_acc.yaml", bn_config(16, "{sync_batchnorm: true}", 2));
    REQUIRE(run_gputrain("train " + (dir / "two_acc.yaml") + " --device '[cpu, cpu]' --threads 2 --quiet --out " +
                         (dir / "two_acc"))
                .exit_code == 0);
    CHECK(max_relative_difference(dir / "one_acc/model.safetensors", dir / "two_acc/model.safetensors") < 1e-5);
  }
  SECTION("dist.overlap: true cannot go with it") {
    write_text(dir / "bad.yaml", bn_config(16, "{sync_batchnorm: true, overlap: true}"));
    const auto bad = run_gputrain("train " + (dir / "bad.yaml") + " --device '[cpu, cpu]' --out " + (dir / "bad"));
    CHECK(bad.exit_code == 2);
    CHECK_THAT(bad.output, Catch::Contains("dist.overlap cannot be true with dist.sync_batchnorm"));
  }
}

TEST_CASE("a worker thread that fails ends the others at their next collective, and its error is the one reported",
          "[e2e][dist]") {
  TempDir dir;
  write_text(dir / "two.yaml", dp_config("{type: sgd, lr: 0.05}", 16, 1) + "checkpoint: {every_steps: 8}\n");
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 0 alone writes checkpoints: a full disk at the first one fails it while rank 1 waits for the next step.
  const auto r = run_gputrain("train " + (dir / "two.yaml") +
                                  " --device '[cpu, cpu]' --threads 2 --set "
                                  "dist.timeout_s=600 --out " +
                                  (dir / "run"),
                              std::string("LD_PRELOAD=") + GT_FAULT_LIB +
                                  " GT_FAULT_MATCH=tmp/model.safetensors GT_FAULT_ACTION=enospc");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("model.safetensors") && Catch::Contains("space"));
  CHECK(r.output.find("stopped waiting") == std::string::npos);  // the peer's echo is not what gets reported
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120));
}

TEST_CASE("ranks started with different models or configs exit 3 at once, naming the first difference", "[e2e][dist]") {
  TempDir dir;
  write_text(dir / "a.yaml", dp_config("{type: sgd, lr: 0.05}", 16, 1));
  // The same but for the hidden layer's width: the gradient buffers differ in size.
  std::string other = dp_config("{type: sgd, lr: 0.05}", 16, 1);
  other.replace(other.find("out_features: 16"), 16, "out_features: 12");
  write_text(dir / "b.yaml", other);
  SECTION("over TCP") {
    const auto r0 = start_tcp_rank(0, 2, tcp_test_port(0),
                                   "train " + (dir / "a.yaml") + " --threads 1 --out " + (dir / "run"), dir / "log0");
    const auto r1 = start_tcp_rank(1, 2, tcp_test_port(0),
                                   "train " + (dir / "b.yaml") + " --threads 1 --out " + (dir / "run"), dir / "log1");
    const int e0 = wait_exit(r0), e1 = wait_exit(r1);
    const std::string log0 = read_text(dir / "log0"), log1 = read_text(dir / "log1");
    INFO(log0 << "\n---\n" << log1);
    CHECK(e0 == 3);
    CHECK(e1 == 3);
    CHECK_THAT(log1,
               Catch::Contains("rank 1: started with another config than rank 0; the first difference, at line") &&
                   Catch::Contains("out_features: 16") && Catch::Contains("out_features: 12"));
    CHECK_THAT(log0, Catch::Contains("1 rank(s) were started with another config or model"));
    CHECK_FALSE(fs::exists(dir / "run"));  // found before the run directory was made
  }
  SECTION("under mpirun") {
    const std::string cmd = mpirun(1) + GT_BINARY + " train " + (dir / "a.yaml") + " --threads 1 --out " +
                            (dir / "run") + " : -np 1 " + GT_BINARY + " train " + (dir / "b.yaml") +
                            " --threads 1 --out " + (dir / "run") + " > " + (dir / "log") + " 2>&1";
    const int status = std::system(cmd.c_str());
    const std::string log = read_text(dir / "log");
    INFO(log);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 3);
    CHECK_THAT(log, Catch::Contains("rank 1: started with another config than rank 0; the first difference"));
    CHECK_THAT(log, !Catch::Contains("MPI_ERR_TRUNCATE"));
  }
}
