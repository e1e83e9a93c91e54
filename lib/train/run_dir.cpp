// Run directories: creation with a write test, train.log, the final weights and summary.json.
#include "train/run_dir.h"

#include "core/error.h"
#include "core/json.h"
#include "graph/model.h"
#include "io/safetensors.h"
#include "log/logging.h"

#include <algorithm>
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

std::string make_run_dir(const std::string& name, const std::string& requested) {
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
    for (int i = 1; fs::exists(dir); ++i) dir = fs::path("runs") / name / fmt::format("{}-{}", stamp, i);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the run directory: {}", dir.string(), ec.message()));
  // Check writability now, not after an hour of training.
  const fs::path probe = dir / ".write-test";
  {
    std::ofstream f(probe);
    if (!(f << "ok") || !f.flush())
      throw Error(fmt::format("{}: the run directory is not writable", dir.string()));
  }
  fs::remove(probe, ec);
  return dir.string();
}

void summarize(RunSummary& sum, const TrainProgress& p, double wall_seconds) {
  sum.epochs = p.epochs_done;
  sum.steps = p.step;
  sum.samples_per_sec = static_cast<double>(p.train_samples) / std::max(p.train_seconds, 1e-9);
  sum.final_train_loss = p.final_train_loss;
  sum.test_loss = p.test_loss;
  sum.test_accuracy = p.test_accuracy;
  sum.wall_seconds = wall_seconds;
}

void write_summary(const std::string& dir, const std::string& name, const RunSummary& sum, int world, int threads) {
  const JsonObject summary = JsonObject()
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
  write_file_durable((fs::path(dir) / "summary.json").string(), summary.str() + "\n");
}

void write_final_weights(const std::string& dir, Model& model, const std::string& name, int64_t steps) {
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (auto& [tensor_name, t] : model.state_tensors()) tensors.emplace_back(tensor_name, t);
  write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors,
                    {{"format", "pt"}, {"gputrain_version", GPUTRAIN_VERSION}, {"name", name},
                     {"steps", std::to_string(steps)}});
}

RunLogFile::RunLogFile(const std::string& path) {
  if (path.empty()) return;
  add_log_file(path);
  m_attached = true;
}

RunLogFile::~RunLogFile() {
  if (m_attached) remove_log_file();
}

}  // namespace gt
