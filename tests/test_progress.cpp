// The live progress bar: its formatting at a given width, and `gputrain train` on a pseudo-terminal and on a pipe.
#include "helpers.h"
#include "log/gpu_monitor.h"
#include "log/progress.h"

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

using gt::format_hms;
using gt::format_progress;
using gt::ProgressState;
using namespace gt::test;

namespace {

// Columns on a terminal: every character the bar uses is one column wide, so its code points.
int columns(const std::string& s) {
  int n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

ProgressState running() {
  ProgressState s;
  s.epoch = 2;
  s.epochs = 5;
  s.step = 212;
  s.steps = 469;
  s.loss = 0.51234;
  s.samples_per_sec = 23456.4;
  s.gpu = "gpu0 97% 3.2/80.0 GiB";
  s.elapsed_s = 12;
  s.eta_s = 65;
  return s;
}

const std::string kBarConfig =
    "name: bar\nseed: 3\ndevice: cpu\n" +
    synthetic_mlp({.samples = 4000, .test_samples = 500, .features = 20, .classes = 4, .batch = 32, .hidden = 32}) +
    R"(optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 2, log_every: 20, eval_every: 50}
)";

// gputrain with stdout and stderr on a pseudo-terminal, as in an interactive shell: python3's pty module copies
// what the terminal shows into our pipe byte for byte (its line discipline turns "\n" into "\r\n"). The terminal
// reports no size, so $COLUMNS gives the width.
// `launcher` ("mpirun -np 2 ") goes before the binary.
CommandResult run_on_terminal(const std::string& args, const std::string& env, const std::string& launcher = "") {
  const std::string cmd = env +
                          " python3 -c 'import pty, sys; s = pty.spawn(sys.argv[1:]); "
                          "sys.exit(s >> 8 if s & 0x7f == 0 else 128 + (s & 0x7f))' " +
                          launcher + gputrain_binary() + " " + args + " < /dev/null 2>&1";
  return run_shell(cmd);
}

// What the terminal showed as separate draws: the text between carriage returns and newlines, escapes removed.
std::vector<std::string> draws_of(const std::string& out) {
  std::vector<std::string> draws;
  std::string cur;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out.compare(i, 3, "\x1b[K") == 0) {
      i += 2;
    } else if (out[i] == '\r' || out[i] == '\n') {
      if (!cur.empty()) draws.push_back(cur);
      cur.clear();
    } else {
      cur += out[i];
    }
  }
  if (!cur.empty()) draws.push_back(cur);
  return draws;
}

}  // namespace

TEST_CASE("the progress line never exceeds the width and keeps the most useful fields", "[cpu]") {
  for (const bool done : {false, true})
    for (const int width : {0, 5, 20, 39, 40, 60, 79, 80, 120, 200}) {
      ProgressState s = running();
      s.done = done;
      if (done) s.step = s.steps;
      const std::string line = format_progress(s, width);
      INFO(width << (done ? " done: " : ": ") << line);
      CHECK(columns(line) <= width);
      if (width >= 40) {
        CHECK_THAT(line, Catch::StartsWith(done ? "epoch 2/5 100%" : "epoch 2/5  45%"));
        CHECK_THAT(line, Catch::Contains(done ? " 469/469 | loss 0.5123" : " 212/469 | loss 0.5123"));
      }
    }
  const std::string wide = format_progress(running(), 200);
  INFO(wide);
  // 212/469 of 40 cells is 18.08: 18 full cells; the bar stops at 40 cells however wide the terminal.
  CHECK(wide == "epoch 2/5  45%|" + repeat("█", 18) + std::string(22, ' ') +
                    "| 212/469 | loss 0.5123 | 23456 samples/s | gpu0 97% 3.2/80.0 GiB | elapsed 0:00:12 | "
                    "eta 0:01:05");
  ProgressState more = running();
  more.step = 214;  // 18.25 cells: a quarter-cell block after the full ones
  CHECK_THAT(format_progress(more, 200), Catch::Contains("|" + repeat("█", 18) + "▎" + std::string(21, ' ') + "|"));

  // At 80 columns the elapsed time and the GPU go first.
  const std::string at80 = format_progress(running(), 80);
  INFO(at80);
  CHECK_THAT(at80, Catch::Contains("%|") && Catch::Contains("| loss 0.5123 | 23456 samples/s | eta 0:01:05"));
  CHECK_THAT(at80, !Catch::Contains("elapsed") && !Catch::Contains("gpu0"));
  // At 60 the bar gives way to the loss and the eta; at 40 the eta goes too.
  CHECK(format_progress(running(), 60) == "epoch 2/5  45% 212/469 | loss 0.5123 | eta 0:01:05");
  CHECK(format_progress(running(), 40) == "epoch 2/5  45% 212/469 | loss 0.5123");
  CHECK(format_progress(running(), 20) == "epoch 2/5  45% 212/4");

  // A finished epoch's line has its elapsed time instead of an eta.
  ProgressState done = running();
  done.done = true;
  done.step = done.steps;
  CHECK(format_progress(done, 200) == "epoch 2/5 100%|" + repeat("█", 40) +
                                          "| 469/469 | loss 0.5123 | 23456 samples/s | gpu0 97% 3.2/80.0 GiB | "
                                          "elapsed 0:00:12");
  CHECK(format_progress(done, 60) == "epoch 2/5 100% 469/469 | loss 0.5123 | elapsed 0:00:12");
}

TEST_CASE("the progress line shows 100% only for a complete epoch, and an empty bar at its start", "[cpu]") {
  ProgressState s = running();
  s.step = 468;
  CHECK_THAT(format_progress(s, 120), Catch::Contains(" 99%|") && Catch::Contains(" 468/469"));
  s.step = 469;
  CHECK_THAT(format_progress(s, 200), Catch::Contains("100%|" + repeat("█", 40) + "| 469/469"));
  s.step = 0;
  const std::string start = format_progress(s, 200);
  CHECK_THAT(start, Catch::Contains("  0%|" + std::string(40, ' ') + "| 0/469"));
  // No loss or rate yet (before the first step is known): the fields are left out, not printed as nonsense.
  s.loss.reset();
  s.samples_per_sec.reset();
  CHECK_THAT(format_progress(s, 200), !Catch::Contains("loss") && !Catch::Contains("samples/s"));
}

TEST_CASE("times are H:MM:SS", "[cpu]") {
  CHECK(format_hms(0) == "0:00:00");
  CHECK(format_hms(65) == "0:01:05");
  CHECK(format_hms(3725.4) == "1:02:05");
  CHECK(format_hms(3599.6) == "1:00:00");
  CHECK(format_hms(-3) == "0:00:00");
  CHECK(format_hms(std::numeric_limits<double>::quiet_NaN()) == "0:00:00");
}

TEST_CASE("the bar's GPU text is each GPU's utilisation and memory, and nothing without a GPU", "[cpu]") {
  gt::MonitorSample s;
  s.host.rss_mib = 900;
  CHECK(gt::progress_gpu_text(s).empty());
  gt::GpuSample a;
  a.ordinal = 0;
  a.util_pct = 97.2;
  a.mem_used_mib = 3277;
  a.mem_total_mib = 81920;
  a.temp_c = 70;
  gt::GpuSample b;
  b.ordinal = 1;  // NVML gave neither reading
  s.gpus = {a, b};
  CHECK(gt::progress_gpu_text(s) == "gpu0 97% 3.2/80.0 GiB gpu1 ?%");
}

TEST_CASE("gputrain train on a terminal draws a bar per epoch in place, and on a pipe it logs plain lines", "[e2e]") {
  TempDir dir;
  write_text(dir / "bar.yaml", kBarConfig);
  const std::string train = "train " + (dir / "bar.yaml") + " --threads 2 --out ";

  const auto tty = run_on_terminal(train + (dir / "tty"), "TERM=xterm COLUMNS=100");
  INFO(tty.output);
  REQUIRE(tty.exit_code == 0);
  // Drawn in place: a carriage return, the bar, and erase-to-end-of-line.
  CHECK(std::regex_search(tty.output, std::regex("\repoch 1/2 +[0-9]+%\\|[^\r\n]*\\| [0-9]+/125 [^\r\n]*\x1b\\[K")));
  // Each epoch ends in a permanent line at 100% with its loss and time.
  for (const char* e : {"1/2", "2/2"})
    CHECK(std::regex_search(tty.output, std::regex(std::string("\repoch ") + e +
                                                   " 100%\\|(█)+\\| 125/125 \\| loss [0-9.]+ [^\r\n]*elapsed "
                                                   "[0-9:]+\x1b\\[K\r\n")));
  // A log line in the middle of an epoch clears the bar, is printed whole, and the bar is drawn again below it.
  CHECK(std::regex_search(tty.output, std::regex("\r\x1b\\[K\\[[0-9:]+\\] eval epoch 1/2 \\| step 50 \\| test_loss "
                                                 "[^\r\n]*\r\nepoch 1/2 +[0-9]+%\\|")));
  // The bar stands for the periodic step lines on the console; train.log still has them.
  CHECK_THAT(tty.output, !Catch::Contains("| step 20/250 |"));
  CHECK_THAT(read_text(dir / "tty/train.log"), Catch::Contains("] epoch 1/2 | step 20/250 | loss "));
  // Never wider than the terminal (one column is kept free so that the cursor never waits to wrap).
  int bars = 0;
  for (const auto& d : draws_of(tty.output))
    if (d.rfind("epoch ", 0) == 0 && d.find("%|") != std::string::npos) {
      ++bars;
      CHECK(columns(d) <= 99);
    }
  CHECK(bars >= 3);

  // The same run on a pipe: today's plain lines, no carriage returns, no escape sequences.
  const auto pipe = run_gputrain(train + (dir / "pipe"));
  INFO(pipe.output);
  REQUIRE(pipe.exit_code == 0);
  CHECK(pipe.output.find('\r') == std::string::npos);
  CHECK(pipe.output.find('\x1b') == std::string::npos);
  CHECK_THAT(pipe.output, Catch::Contains("] epoch 1/2 | step 20/250 | loss ") && !Catch::Contains("%|"));
}

TEST_CASE("a terminal gets no bar with --no-progress, --quiet, TERM=dumb or logging.progress: false", "[e2e]") {
  TempDir dir;
  write_text(dir / "bar.yaml", kBarConfig);
  const std::string train = "train " + (dir / "bar.yaml") + " --threads 2 --epochs 1 --out ";
  struct Case {
    const char* name;
    std::string args, env;
    bool step_lines;
  };
  const std::vector<Case> cases = {
      {"--no-progress", "--no-progress", "TERM=xterm", true},
      {"TERM=dumb", "", "TERM=dumb", true},
      {"logging.progress: false", "--set logging.progress=false", "TERM=xterm", true},
      {"--quiet", "--quiet", "TERM=xterm", false},
  };
  int i = 0;
  for (const auto& c : cases) {
    const auto r = run_on_terminal(train + (dir / std::to_string(i++)) + " " + c.args, c.env);
    INFO(c.name << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find('\x1b') == std::string::npos);
    CHECK_THAT(r.output, !Catch::Contains("%|"));
    CHECK(count_of(r.output, "| step 20/125 | loss ") == (c.step_lines ? 1 : 0));
  }
}

TEST_CASE("under mpirun, logging.progress auto draws no bar, and true makes rank 0 alone draw it", "[e2e][dist]") {
  TempDir dir;
  write_text(dir / "bar.yaml", kBarConfig);
  // Open MPI passes a terminal on to rank 0's stdout even when mpirun's own output is piped: auto takes the launcher
  // as the sign that the lines are collected, and logs plain step lines.
  const std::string env =
      "TERM=xterm COLUMNS=100 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1";
  auto r =
      run_on_terminal("train " + (dir / "bar.yaml") + " --threads 1 --out " + (dir / "auto"), env, "mpirun -np 2 ");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("rank 0 of 2"));
  CHECK(count_of(r.output, "100%|") == 0);
  CHECK(count_of(r.output, "| step 20/124 | loss ") == 1);  // (2 ranks: 62 steps an epoch)
  // true: rank 0 draws it; the other ranks log warnings and errors only and never draw.
  r = run_on_terminal("train " + (dir / "bar.yaml") + " --threads 1 --set ++logging.progress=true --out " +
                          (dir / "on"),
                      env, "mpirun -np 2 ");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (const char* e : {"1/2", "2/2"}) CHECK(count_of(r.output, std::string("epoch ") + e + " 100%|") == 1);
  CHECK_THAT(r.output, !Catch::Contains("[rank 1]"));
}
