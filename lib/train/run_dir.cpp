// Run directories: creation with a write test, train.log, the final weights and summary.json.
#include "train/run_dir.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/json_read.h"
#include "core/ownership.h"
#include "core/quote.h"
#include "graph/model.h"
#include "io/safetensors.h"
#include "log/logging.h"
#include "text/byte_tokenizer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

namespace gt {
namespace fs = std::filesystem;

const char* exit_reason_name(ExitReason reason) {
  switch (reason) {
    case ExitReason::completed: return "completed";
    case ExitReason::max_steps: return "max_steps";
    case ExitReason::interrupted: return "interrupted";
    case ExitReason::diverged: return "diverged";
  }
  return "completed";
}

std::string make_run_dir(const std::string& name, const std::string& requested, bool resume) {
  fs::path dir;
  if (!requested.empty()) {
    dir = requested;
  } else {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    dir = fs::path("runs") / name / stamp;
    std::error_code ec;
    for (int i = 1; fs::exists(fs::symlink_status(dir, ec)); ++i)
      dir = fs::path("runs") / name / fmt::format("{}-{}", stamp, i);
  }
  claim_output_folder("--out", dir.string(), Owner::run, resume ? Reuse::resume : Reuse::never,
                      run_folder_hint(dir.string()));
  // Check writability now, not after an hour of training; the probe goes whether or not the write worked.
  std::error_code ec;
  const fs::path probe = dir / ".write-test";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("{}: the run directory is not writable: {}", dir.string(), std::strerror(errno)));
  const bool wrote = ::write(fd, "ok", 2) == 2;
  const int err = errno;
  ::close(fd);
  fs::remove(probe, ec);
  if (!wrote) throw Error(fmt::format("{}: the run directory is not writable: {}", dir.string(), std::strerror(err)));
  return dir.string();
}

RunDirLock::~RunDirLock() {
  if (m_fd >= 0) ::close(m_fd);  // releases the flock
}

void RunDirLock::acquire(const std::string& dir) {
  std::error_code ec;
  if (m_fd >= 0 && fs::equivalent(m_dir, dir, ec)) return;
  const std::string path = (fs::path(dir) / ".lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("{}: cannot open the run directory's lock: {}", path, std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    std::string pid(buf, n > 0 ? static_cast<size_t>(n) : 0);
    pid = pid.substr(0, pid.find_first_not_of("0123456789"));
    if (err != EWOULDBLOCK) throw Error(fmt::format("{}: cannot lock the run directory: {}", path, std::strerror(err)));
    throw Error(fmt::format("{}: in use by another gputrain run (pid {}); wait for it to end, or choose another --out",
                            dir, pid.empty() ? "unknown" : pid));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd);
    throw Error(fmt::format("{}: cannot write: {}", path, std::strerror(err)));
  }
  if (m_fd >= 0) ::close(m_fd);
  m_fd = fd;
  m_dir = dir;
}

std::string run_exit_reason(const std::string& dir) {
  std::error_code ec;
  const fs::path path = fs::path(dir) / "summary.json";
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) > (size_t{1} << 20)) return "";
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    const JsonValue v = json_read_object(text);
    const JsonValue* reason = v.find("exit_reason");
    return reason && reason->is_string() ? reason->string : "";
  } catch (const DataError&) {
    return "";
  }
}

bool run_is_complete(const std::string& dir) {
  const std::string reason = run_exit_reason(dir);
  return reason == exit_reason_name(ExitReason::completed) || reason == exit_reason_name(ExitReason::diverged);
}

bool run_is_alive(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".lock").string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // (a shared lock taken here goes with the descriptor)
  return held;
}

std::string run_folder_hint(const std::string& dir) {
  if (run_is_complete(dir))
    return fmt::format(
        "it is complete: --resume {} --out NEW_DIR continues it into a new folder, or choose another "
        "--out",
        dir);
  return fmt::format("--resume auto --out {} continues it, or choose another --out", dir);
}

std::string resume_command(const std::string& dir) {
  // The run directory stands for its config (config.resolved.yaml) and names where to go on: absolute, so that the
  // command works from any folder.
  std::error_code ec;
  const std::string q = shell_quote(fs::absolute(dir, ec).lexically_normal().string());
  return fmt::format("gputrain train {0} --resume auto --out {0}", q);
}

std::string overrides_json(const std::vector<std::string>& overrides) {
  std::string list;
  for (const std::string& o : overrides) list += (list.empty() ? "" : ", ") + json_quote(o);
  return fmt::format("{{\"overrides\": [{}]}}\n", list);
}

void summarize(RunSummary& sum, const TrainProgress& p, double wall_seconds) {
  sum.epochs = p.epochs_done;
  sum.steps = p.step;
  sum.samples_per_sec = static_cast<double>(p.train_samples) / std::max(p.train_seconds, 1e-9);
  // Known once an epoch (or a max_steps cut of one) has ended; before that 0 would read as a perfect fit.
  sum.final_train_loss = p.epochs_done > 0 ? std::optional<double>(p.final_train_loss) : std::nullopt;
  sum.test_loss = p.test_loss;
  sum.test_accuracy = p.test_accuracy;
  sum.wall_seconds = wall_seconds;
  if (p.loss_scale > 0) sum.loss_scale = p.loss_scale;
  sum.overflow_skips = p.overflow_skips;
}

void write_summary(const std::string& dir, const std::string& name, const RunSummary& sum, int world, int threads) {
  JsonObject summary = JsonObject()
                           .add("name", name)
                           .add("device", sum.device)
                           .add("world_size", world)
                           .add("epochs", sum.epochs)
                           .add("steps", sum.steps)
                           .add("samples_per_sec", sum.samples_per_sec)
                           .add("final_train_loss", sum.final_train_loss)
                           .add("test_loss", sum.test_loss)
                           .add("test_accuracy", sum.test_accuracy)
                           .add("wall_seconds", sum.wall_seconds)
                           .add("exit_reason", exit_reason_name(sum.exit_reason))
                           .add("threads", threads);
  if (sum.test_bpb) summary.add("test_bpb", sum.test_bpb);
  if (sum.bad_files) summary.add("bad_files", *sum.bad_files);
  if (sum.loss_scale) summary.add("loss_scale", sum.loss_scale).add("overflow_skips", sum.overflow_skips);
  if (!sum.init_from.empty()) summary.add("init_from", sum.init_from).add("init_fnv1a", sum.init_fnv1a);
  if (sum.memory) summary.add("memory", memory_peaks_json(*sum.memory));
  write_file_atomic((fs::path(dir) / "summary.json").string(), summary.str() + "\n");
}

void write_final_weights(const std::string& dir, Model& model, const std::string& name, int64_t steps) {
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (auto& [tensor_name, t] : model.state_tensors()) tensors.emplace_back(tensor_name, t);
  write_safetensors(
      (fs::path(dir) / "model.safetensors").string(), tensors,
      {{"format", "pt"}, {"gputrain_version", GPUTRAIN_VERSION}, {"name", name}, {"steps", std::to_string(steps)}});
}

RunLogFile::RunLogFile(const std::string& path) {
  if (path.empty()) return;
  add_log_file(path);
  m_attached = true;
}

RunLogFile::~RunLogFile() {
  if (m_attached) remove_log_file();
}

void copy_tokenizer(const Dataset& data, const std::string& dir) {
  if (!data.tokenizer) return;
  std::ifstream in(data.tokenizer_path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open: {}", data.tokenizer_path, std::strerror(errno)));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string name = data.tokenizer->file_name();  // under its own tools' name
  write_file_atomic((fs::path(dir) / name).string(), bytes);
}

void write_overrides_and_tokenizer(const std::string& dir, const std::vector<std::string>& overrides,
                                   const Dataset& data) {
  write_file_atomic((fs::path(dir) / "overrides.json").string(), overrides_json(overrides));
  copy_tokenizer(data, dir);
}

std::string run_tokenizer_file(const std::string& weights) {
  // A run directory, its model.safetensors, a checkpoint folder (run/checkpoints/step_N) or a file in one.
  fs::path p = weights;
  for (int up = 0; up < 4 && !p.empty(); ++up, p = p.parent_path()) {
    std::error_code ec;
    if (!fs::is_directory(p, ec) || !holds_run_files(p.string())) continue;
    for (const char* name : {"tokenizer.model", kByteDescriptorName, "tokenizer.json", "gpt2_tokenizer.bin"})
      if (fs::is_regular_file(p / name, ec)) return (p / name).string();
    return "";
  }
  return "";
}

// A run continued into a new folder (--resume RUN --out NEW) starts its metrics.jsonl with the rows the checkpoint
// had, so that its record (charts, runs) covers the whole run; the earlier folder is left as it was.
void carry_metrics(const CheckpointInfo& from, const std::string& run_dir) {
  std::error_code ec;
  const fs::path source = fs::path(from.dir).parent_path().parent_path() / "metrics.jsonl";
  const fs::path target = fs::path(run_dir) / "metrics.jsonl";
  if (fs::equivalent(source.parent_path(), run_dir, ec) || fs::exists(target, ec) || !fs::exists(source, ec)) return;
  std::ifstream in(source, std::ios::binary);
  std::string rows(static_cast<size_t>(from.progress.metrics_bytes), '\0');
  in.read(rows.data(), static_cast<std::streamsize>(rows.size()));
  rows.resize(static_cast<size_t>(in.gcount()));
  write_file_atomic(target.string(), rows);
  spdlog::info("continuing {} in {}: its metrics up to step {} are copied first", source.parent_path().string(),
               run_dir, from.progress.step);
}

}  // namespace gt
