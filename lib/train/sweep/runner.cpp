// `gputrain sweep`'s runner: starts the trials as `gputrain train` child processes, watches them (and stops the
// worse early), and tabulates them with `gputrain runs`' table.
#include "train/sweep.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/ownership.h"
#include "core/quote.h"
#include "train/run_dir.h"
#include "train/runs.h"
#include "train/signals.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

extern char** environ;

namespace gt {
namespace fs = std::filesystem;

namespace {

// The most of a metrics.jsonl that one poll reads (the rest comes with the next ones).
constexpr size_t kMaxMetricsBytes = size_t{64} << 20;

// Reads a regular file of at most `limit` bytes (its last `limit` bytes when larger); nullopt when absent.
std::optional<std::string> read_tail(const fs::path& p, size_t limit) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  const uintmax_t size = fs::file_size(p, ec);
  if (ec) return std::nullopt;
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  if (size > limit) in.seekg(static_cast<std::streamoff>(size - limit));
  std::string text(std::min<uintmax_t>(size, limit), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

std::string last_lines(const std::string& text, size_t n) {
  size_t end = text.size();
  while (end > 0 && text[end - 1] == '\n') --end;
  size_t start = end;
  for (size_t lines = 0; start > 0; --start)
    if (text[start - 1] == '\n' && ++lines == n) break;
  return text.substr(start, end - start);
}

std::string now_stamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  return fmt::format("{}.{:03d}", stamp, ms);
}

}  // namespace

namespace {

// A trial's metrics.jsonl followed as it grows: each poll parses only the bytes added since the last (a long run
// with log_every 1 has a large file, and the sweep polls 5 times a second).
struct CurveFile {
  uintmax_t offset = 0;
  std::string partial;  // the start of a line not yet ended
  Curve curve;

  void update(const fs::path& path, const std::string& metric) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec) return;
    if (size < offset) *this = {};  // cut back (a resume cuts metrics.jsonl back to its checkpoint's length)
    if (size == offset) return;
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    in.seekg(static_cast<std::streamoff>(offset));
    std::string chunk(static_cast<size_t>(std::min<uintmax_t>(size - offset, kMaxMetricsBytes)), '\0');
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    chunk.resize(static_cast<size_t>(in.gcount()));
    offset += chunk.size();
    partial += chunk;
    const size_t end = partial.rfind('\n');
    if (end == std::string::npos) {
      if (partial.size() > kMaxMetricsBytes) partial.clear();  // no row is that long
      return;
    }
    const Curve more = read_curve(partial.substr(0, end), metric);
    curve.insert(curve.end(), more.begin(), more.end());
    partial.erase(0, end + 1);
  }
};

// One running trial.
struct Child {
  pid_t pid = -1;
  size_t trial = 0;
  int slot = 0;
  bool stop_sent = false;  // SIGTERM sent: by the user's stop, or by early stopping
  bool stopped_early = false;
  int rung_judged = -1;  // asha: the highest rung already judged
  std::chrono::steady_clock::time_point started;
};

class SweepRunner {
 public:
  SweepRunner(SweepPlan plan, std::vector<TrialState> states, const SweepOptions& opts)
      : m_plan(std::move(plan)), m_states(std::move(states)), m_opts(opts) {
    m_states.resize(m_plan.trials.size());
    m_files.resize(m_plan.trials.size());
    m_curves.resize(m_plan.trials.size());
  }

  SweepResult run();

 private:
  fs::path trial_dir(size_t i) const { return fs::path(m_opts.out) / m_plan.trials[i].name; }
  void save() const { write_file_atomic((fs::path(m_opts.out) / "sweep.json").string(), sweep_json(m_plan, m_states)); }
  void start(size_t trial, int slot);
  void finished(Child& c, int status);
  void poll_early_stop();
  SweepResult tabulate(bool interrupted);

  SweepPlan m_plan;
  std::vector<TrialState> m_states;
  SweepOptions m_opts;
  std::vector<Child> m_running;
  std::vector<CurveFile> m_files;  // each trial's metrics.jsonl, followed for early stopping
  std::vector<Curve> m_curves;     // (the curves, as the rules take them)
  int m_threads = 1;
  int m_slots = 1;
  SweepResult m_result;
};

void SweepRunner::start(size_t i, int slot) {
  const SweepTrial& t = m_plan.trials[i];
  const fs::path dir = trial_dir(i);
  std::error_code ec;
  // A failed trial starts again from nothing; an interrupted one (or one whose sweep died) continues from its
  // checkpoints; without checkpoints it starts from nothing too (train refuses a folder with checkpoints and no
  // --resume, and a run's files of an earlier start would mix with the new ones). console.log keeps every start.
  const bool has_checkpoints = fs::is_directory(dir / "checkpoints", ec);
  const bool resume = has_checkpoints && m_states[i].status != TrialStatus::failed;
  if (!resume && fs::exists(dir, ec)) {
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename() != "console.log") fs::remove_all(it->path(), ec);
  }
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the trial's folder: {}", dir.string(), ec.message()));
  if (!resume) write_manifest(dir.string(), Owner::run, {}, true);  // a run's folder, for the trial's train to take
  m_files[i] = {};                                                  // its metrics.jsonl is cut back or new

  std::vector<std::string> args = trial_train_args(m_plan, t, m_opts.out);
  args.insert(args.begin(), m_opts.exe);
  args.emplace_back("--no-progress");
  args.emplace_back("--threads");
  args.push_back(std::to_string(m_threads));
  if (resume) {
    args.emplace_back("--resume");
    args.emplace_back("auto");
  }
  std::vector<std::string> env;
  const bool gpu = !m_opts.devices.empty();
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    if (gpu && v.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0) continue;
    if (v.rfind("OMP_NUM_THREADS=", 0) == 0 || v.rfind("OPENBLAS_NUM_THREADS=", 0) == 0) continue;
    env.emplace_back(v);
  }
  if (gpu) env.push_back(fmt::format("CUDA_VISIBLE_DEVICES={}", m_opts.devices[static_cast<size_t>(slot)]));
  env.push_back(fmt::format("OMP_NUM_THREADS={}", m_threads));  // a BLAS's own threads share the trial's cores too
  env.push_back(fmt::format("OPENBLAS_NUM_THREADS={}", m_threads));

  // The exact command, with the variables the sweep sets, so that a trial can be run again by hand.
  std::string command = fmt::format(
      "{}OMP_NUM_THREADS={} OPENBLAS_NUM_THREADS={}",
      gpu ? fmt::format("CUDA_VISIBLE_DEVICES={} ", m_opts.devices[static_cast<size_t>(slot)]) : std::string(),
      m_threads, m_threads);
  for (const std::string& a : args) {
    if (!command.empty()) command += ' ';
    command += shell_quote(a);
  }
  const fs::path log = dir / "console.log";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("{}: cannot open: {}", log.string(), std::strerror(errno)));
  const std::string header = fmt::format(
      "[{}] [sweep] start {} of trial {}{}: {}\n", now_stamp(), m_states[i].starts + 1, t.name,
      gpu ? fmt::format(" on CUDA device {}", m_opts.devices[static_cast<size_t>(slot)]) : std::string(), command);
  if (::write(fd, header.data(), header.size()) < 0) {
    // the header is informative; the trial's own output still goes there
  }

  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    throw Error(fmt::format("cannot start trial {}: fork: {}", t.name, std::strerror(errno)));
  }
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec. Its own process group, so that a Ctrl-C on the terminal
    // reaches the sweep alone, which stops the trials itself; and a SIGTERM when the sweep dies (kill -9).
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(75);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "[sweep] cannot run the gputrain binary (execve failed)\n";
    if (::write(2, msg, sizeof msg - 1) < 0) {
    }
    ::_exit(127);
  }
  ::close(fd);
  m_states[i].status = TrialStatus::running;
  m_states[i].starts += 1;
  m_result.started += 1;
  Child c;
  c.pid = pid;
  c.trial = i;
  c.slot = slot;
  c.started = std::chrono::steady_clock::now();
  c.rung_judged = -1;
  m_running.push_back(c);
  save();
  spdlog::info("[sweep] start {}{}: {}{}", t.name, resume ? " (resumed from its checkpoint)" : "",
               gpu ? fmt::format("CUDA device {}", m_opts.devices[static_cast<size_t>(slot)])
                   : fmt::format("{} CPU thread{}", m_threads, m_threads == 1 ? "" : "s"),
               m_states[i].starts > 1 ? fmt::format(", start {}", m_states[i].starts) : std::string());
}

void SweepRunner::finished(Child& c, int status) {
  const size_t i = c.trial;
  const SweepTrial& t = m_plan.trials[i];
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c.started).count();
  TrialState& s = m_states[i];
  // A trial the sweep sent SIGTERM to in its first moments (a stop right after it was started) can die of the
  // signal before its handlers are in place: it did nothing yet, and is stopped (or stopped early) as asked, not
  // failed; without checkpoints, --resume starts it from nothing.
  const bool stopped_at_start = c.stop_sent && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM;
  const bool stopped = code == 75 || stopped_at_start;
  s.exit_code = code;
  if (code == 0) {
    s.status = TrialStatus::completed;
    m_result.completed += 1;
    spdlog::info("[sweep] {} completed in {:.1f} s", t.name, seconds);
  } else if (stopped && c.stopped_early) {
    s.status = TrialStatus::stopped_early;
    m_result.stopped_early += 1;
    spdlog::info("[sweep] {} stopped early after {:.1f} s ({} rule on {})", t.name, seconds,
                 m_opts.early_stop.rule == EarlyStopRule::median ? "median" : "asha", m_opts.metric);
  } else if (stopped) {
    s.status = TrialStatus::interrupted;
    m_result.interrupted += 1;
    if (stopped_at_start)
      spdlog::info("[sweep] {} interrupted as it started (--resume starts it again)", t.name);
    else
      spdlog::info("[sweep] {} interrupted after {:.1f} s (its checkpoint is kept: --resume continues it)", t.name,
                   seconds);
  } else {
    s.status = TrialStatus::failed;
    m_result.failed += 1;
    // Reported at once: which trial, how it ended and the end of its output.
    const fs::path log = trial_dir(i) / "console.log";
    const std::string tail = last_lines(read_tail(log, 64 << 10).value_or(""), 10);
    std::string indented;
    for (size_t from = 0; from < tail.size();) {
      size_t end = tail.find('\n', from);
      if (end == std::string::npos) end = tail.size();
      indented += "    " + tail.substr(from, end - from) + "\n";
      from = end + 1;
    }
    fmt::print(stderr, "gputrain sweep: trial {} ({}) failed with exit code {}{}; the end of {}:\n{}", t.index, t.name,
               code, WIFSIGNALED(status) ? fmt::format(" (killed by signal {})", WTERMSIG(status)) : std::string(),
               log.string(), indented);
    std::fflush(stderr);
  }
  save();
}

void SweepRunner::poll_early_stop() {
  if (m_opts.early_stop.rule == EarlyStopRule::none) return;
  // Every trial's curve so far (finished ones too: the rules compare with them).
  for (size_t i = 0; i < m_plan.trials.size(); ++i) {
    m_files[i].update(trial_dir(i) / "metrics.jsonl", m_opts.metric);
    m_curves[i] = m_files[i].curve;
  }
  for (Child& c : m_running) {
    if (c.stop_sent) continue;
    bool stop = false;
    if (m_opts.early_stop.rule == EarlyStopRule::median) {
      stop = median_rule_stops(m_curves, c.trial, m_opts.early_stop);
    } else {
      const int rung = asha_rung(m_curves[c.trial], m_opts.early_stop);
      if (rung > c.rung_judged) {
        c.rung_judged = rung;
        stop = asha_stops(m_curves, c.trial, rung, m_opts.early_stop);
      }
    }
    if (!stop) continue;
    const CurvePoint& at = m_curves[c.trial].back();
    spdlog::info("[sweep] stopping {} early: {} {} at step {} is among the worse", m_plan.trials[c.trial].name,
                 m_opts.metric, at.value, at.step);
    c.stop_sent = true;
    c.stopped_early = true;
    ::kill(c.pid, SIGTERM);
  }
}

SweepResult SweepRunner::run() {
  m_slots = m_opts.devices.empty() ? std::max(m_opts.parallel, 1) : static_cast<int>(m_opts.devices.size());
  const int cores =
      m_opts.cores > 0 ? m_opts.cores : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  m_threads = std::max(1, cores / m_slots);
  // A curve of a trial finished before (a resumed sweep) counts for the early-stopping comparisons too.
  std::vector<size_t> queue;
  for (size_t i = 0; i < m_plan.trials.size(); ++i) {
    const TrialStatus s = m_states[i].status;
    if (s == TrialStatus::completed || s == TrialStatus::stopped_early) {
      m_result.skipped += 1;
      continue;
    }
    queue.push_back(i);
  }
  if (m_result.skipped)
    spdlog::info("[sweep] resuming: {} of {} trials are done, {} to run", m_result.skipped, m_plan.trials.size(),
                 queue.size());
  save();
  size_t next = 0;
  bool stopping = false;
  auto last_poll = std::chrono::steady_clock::now();
  while (next < queue.size() || !m_running.empty()) {
    if (const int sig = stop_requested(); sig && !stopping) {
      stopping = true;
      spdlog::info("[sweep] {}: stopping the {} running trial{} (each writes a checkpoint and exits 75)",
                   signal_name(sig), m_running.size(), m_running.size() == 1 ? "" : "s");
      for (Child& c : m_running) {
        if (!c.stop_sent) ::kill(c.pid, SIGTERM);
        c.stop_sent = true;
      }
    }
    if (stopping && next < queue.size() && m_running.empty()) break;
    while (!stopping && next < queue.size() && static_cast<int>(m_running.size()) < m_slots) {
      std::vector<bool> used(static_cast<size_t>(m_slots), false);
      for (const Child& c : m_running) used[static_cast<size_t>(c.slot)] = true;
      const int slot = static_cast<int>(std::find(used.begin(), used.end(), false) - used.begin());
      const size_t trial = queue[next++];
      try {
        start(trial, slot);
      } catch (const Error& e) {
        // A trial that cannot be started (its folder, fork) fails alone; the running ones go on.
        m_states[trial].status = TrialStatus::failed;
        m_result.failed += 1;
        fmt::print(stderr, "gputrain sweep: trial {} ({}) could not start: {}\n", trial, m_plan.trials[trial].name,
                   e.what());
        save();
      }
    }
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      const auto it = std::find_if(m_running.begin(), m_running.end(), [&](const Child& c) { return c.pid == pid; });
      if (it == m_running.end()) continue;
      Child c = *it;
      m_running.erase(it);
      finished(c, status);
    }
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_poll).count() >= m_opts.poll_seconds) {
      poll_early_stop();
      last_poll = now;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return tabulate(stopping);
}

SweepResult SweepRunner::tabulate(bool interrupted) {
  std::vector<RunInfo> runs;
  for (size_t i = 0; i < m_plan.trials.size(); ++i) {
    RunInfo r;
    r.dir = trial_dir(i).string();
    r.label = m_plan.trials[i].name;
    std::error_code ec;
    if (fs::is_directory(r.dir, ec)) read_run(r);
    if (!r.problem.empty()) spdlog::warn("{}: {}", r.dir, r.problem);
    // The sweep knows how a trial ended where its folder cannot say: stopped early (its summary says interrupted),
    // failed, or never started; a diverged trial keeps its own word.
    const TrialStatus s = m_states[i].status;
    if (s != TrialStatus::completed && !(s == TrialStatus::failed && r.status == "diverged"))
      r.status = trial_status_name(s);
    runs.push_back(std::move(r));
  }
  RunsTable table = runs_table(runs);
  std::vector<std::optional<double>> metric(m_plan.trials.size());
  const auto col = std::find(table.columns.begin(), table.columns.end(), m_opts.metric);
  if (col != table.columns.end()) {
    const size_t c = static_cast<size_t>(col - table.columns.begin());
    for (size_t i = 0; i < table.rows.size(); ++i)
      if (table.rows[i][c].kind == RunCell::Kind::number) metric[i] = table.rows[i][c].number;
    sort_runs(table, m_opts.metric, m_opts.maximize);
  } else {
    spdlog::warn("[sweep] no trial has {} in its summary.json: the table is in trial order", m_opts.metric);
  }
  m_result.table = runs_text(table);
  const fs::path out = m_opts.out;
  write_file_atomic((out / "sweep.csv").string(), runs_csv(table));
  write_file_atomic((out / "sweep.jsonl").string(), runs_jsonl(table));
  try {
    write_sweep_report(m_opts.out, m_plan, m_states, metric, m_opts.metric, m_opts.maximize);
  } catch (const Error& e) {
    spdlog::warn("[sweep] report.html: {}", e.what());
  }
  int failed = 0, pending = 0;
  for (const TrialState& s : m_states) {
    failed += s.status == TrialStatus::failed;
    pending += s.status == TrialStatus::pending || s.status == TrialStatus::interrupted;
  }
  m_result.exit_code = interrupted ? 75 : failed ? 1 : pending ? 1 : 0;
  return m_result;
}

}  // namespace

SweepResult run_sweep(
    SweepPlan plan, const SweepOptions& opts,
    const std::function<void(const std::string& config, const std::vector<std::string>& sets)>& validate) {
  if (opts.out.empty()) throw ConfigError("sweep: --out DIR is needed (the folder the trials' run directories go in)");
  const fs::path json_path = fs::path(opts.out) / "sweep.json";
  std::error_code ec;
  std::vector<TrialState> states;
  // Before anything else: a folder that is not this sweep's to write is refused first.
  check_output_folder("--out", opts.out, Owner::sweep, opts.resume ? Reuse::resume : Reuse::never,
                      "--resume continues it, or choose another --out");
  if (opts.resume) {
    const auto text = read_tail(json_path, size_t{16} << 20);
    if (!text)
      throw ConfigError(
          fmt::format("sweep --resume: no {} (nothing to resume; start it without --resume)", json_path.string()));
    auto loaded = read_sweep_json(*text, json_path.string());
    SweepPlan& stored = loaded.first;  // (a structured binding cannot be captured by the lambda below in C++20)
    // The plan is the stored one; flags given again must describe the same trials.
    if (!plan.trials.empty()) {
      auto same = [&] {
        if (stored.config != plan.config || stored.sets != plan.sets || stored.trials.size() != plan.trials.size())
          return false;
        for (size_t i = 0; i < plan.trials.size(); ++i)
          if (stored.trials[i].name != plan.trials[i].name || stored.trials[i].values != plan.trials[i].values)
            return false;
        return true;
      };
      if (!same())
        throw ConfigError(fmt::format(
            "sweep --resume: the config, --set values or axes differ from those {} records ({} trials of {}); resume "
            "with the same flags (or with CONFIG alone), or sweep into another --out",
            json_path.string(), stored.trials.size(), stored.config));
    }
    plan = std::move(stored);
    states = std::move(loaded.second);
  }
  // Every trial's config is checked before any starts: a typo in one value must not launch the others.
  for (const SweepTrial& t : plan.trials) {
    std::vector<std::string> sets = plan.sets;
    for (const std::string& o : t.overrides()) sets.push_back(o);
    try {
      validate(plan.config, sets);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("trial {} ({}): {}", t.index, t.name, e.what()));
    }
  }
  claim_output_folder("--out", opts.out, Owner::sweep, opts.resume ? Reuse::resume : Reuse::never,
                      "--resume continues it, or choose another --out");
  SweepOptions o = opts;
  if (o.exe.empty()) o.exe = "/proc/self/exe";
  // /proc/self/exe read now: the trials run this binary, even if the file is replaced meanwhile (a rebuild).
  if (o.exe == "/proc/self/exe") {
    const fs::path real = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) o.exe = real.string();
  }
  // One sweep at a time in a folder: a second (a --resume while the first still runs) would start its trials again.
  RunDirLock lock;
  lock.acquire(opts.out);
  SweepRunner runner(std::move(plan), std::move(states), o);
  return runner.run();
}

}  // namespace gt
