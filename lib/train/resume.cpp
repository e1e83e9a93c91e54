// Resume planning: the checkpoint a run continues from, the progress it restores, and the weights `eval` loads.
#include "train/resume.h"

#include "core/ownership.h"
#include "graph/model.h"
#include "log/logging.h"
#include "optim/optimizer.h"
#include "train/run_dir.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>
#include <vector>

namespace gt {
namespace fs = std::filesystem;

namespace {

// The run --resume auto continues without --out: the newest runs/<name>/* with checkpoints that no process is
// using, when it is unfinished; "" (a new run) when there is none or the newest has ended for good (said).
std::string newest_unfinished_run(const Experiment& exp, bool& said) {
  std::error_code ec;
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(fs::path("runs") / exp.name, ec))
    if (e.is_directory() && fs::exists(e.path() / "checkpoints")) runs.push_back(e.path().string());
  std::sort(runs.rbegin(), runs.rend());  // names are time stamps: newest first
  for (const std::string& run : runs) {
    if (run_is_alive(run)) {
      spdlog::info("--resume auto: {} is in use by a running process; looking at older runs", run);
      continue;
    }
    if (run_is_complete(run)) {
      spdlog::info(
          "--resume auto: the newest run, {}, is complete ({}): starting a new run (--resume {} --out DIR "
          "continues it into a new folder)",
          run, run_exit_reason(run), run);
      said = true;
      return "";
    }
    return run;
  }
  return "";
}

}  // namespace

std::optional<CheckpointInfo> newest_good_of_run(const std::string& run_dir, const CheckpointConfig& cfg) {
  const CheckpointStore store(run_dir, cfg);
  const auto candidates = store.list();
  auto found = store.newest_good();  // warns about each broken one it skips
  if (found && found->dir != candidates.front())
    spdlog::warn("falling back to checkpoint {}: the newer ones do not verify", found->dir);
  if (!found && !candidates.empty())
    throw DataError(fmt::format("{}: none of its {} checkpoint(s) verifies (see the warnings above)", store.root(),
                                candidates.size()));
  return found;
}

CheckpointInfo require_newest_good_of_run(const std::string& run_dir, const CheckpointConfig& cfg) {
  std::optional<CheckpointInfo> found = newest_good_of_run(run_dir, cfg);
  if (!found) throw DataError(fmt::format("{}: no checkpoint to resume from", CheckpointStore(run_dir, cfg).root()));
  return std::move(*found);
}

ResumePlan plan_resume(const Experiment& exp, const std::string& out_dir, const std::string& resume) {
  ResumePlan plan;
  plan.run_dir = out_dir;
  // --out names a folder this run may write: new or empty, a run's (continued only with --resume), never another
  // command's output or a folder of files gputrain did not write. Checked before anything is loaded.
  if (!out_dir.empty())
    check_output_folder("--out", out_dir, Owner::run, resume.empty() ? Reuse::never : Reuse::resume,
                        run_folder_hint(out_dir));
  if (resume.empty()) return plan;
  if (resume == "auto") {
    // A complete run is never written into (run_training stops before this for --out DIR).
    if (!plan.run_dir.empty() && run_is_complete(plan.run_dir))
      throw ConfigError(fmt::format("--out {}: the run is complete ({}); nothing to resume", plan.run_dir,
                                    run_exit_reason(plan.run_dir)));
    bool said = false;
    if (plan.run_dir.empty()) plan.run_dir = newest_unfinished_run(exp, said);
    if (!plan.run_dir.empty()) plan.from = newest_good_of_run(plan.run_dir, exp.checkpoint);
    if (!plan.from && !said)
      spdlog::info("--resume auto: no checkpoint{}; starting from step 0",
                   plan.run_dir.empty() ? fmt::format(" under runs/{}", exp.name) : " in " + plan.run_dir);
    return plan;
  }
  const fs::path p = resume;
  // A run directory belongs to one run: --out may name the run being resumed, or a folder without a run in it. A
  // complete run is continued only into a new folder: its record (config, summary) is never rewritten.
  auto refuse_other_run = [&](const fs::path& from_run) {
    std::error_code ec;
    const bool same = out_dir.empty() || fs::equivalent(out_dir, from_run, ec);
    if (same && run_is_complete(from_run.string()))
      throw ConfigError(
          fmt::format("--resume {}: the run {} is complete ({}); --resume {} --out NEW_DIR continues "
                      "it, with its optimizer state, into a new folder",
                      resume, from_run.string(), run_exit_reason(from_run.string()), resume));
    if (same || !holds_run_files(out_dir)) return;
    throw ConfigError(
        fmt::format("--out {}: holds another run than the one --resume {} continues (its metrics and "
                    "checkpoints would mix); leave out --out to continue that run in its own folder, "
                    "or choose a folder without a run",
                    out_dir, resume));
  };
  if (fs::exists(p / "state.json")) {
    refuse_other_run(fs::absolute(p).lexically_normal().parent_path().parent_path());
    plan.from = read_checkpoint(p.string());  // an explicit checkpoint that does not verify is refused
    if (plan.run_dir.empty()) plan.run_dir = fs::absolute(p).lexically_normal().parent_path().parent_path().string();
  } else if (fs::is_directory(p / "checkpoints")) {
    refuse_other_run(p);
    if (plan.run_dir.empty()) plan.run_dir = p.string();
    plan.from = require_newest_good_of_run(p.string(), exp.checkpoint);
  } else {
    throw ConfigError(
        fmt::format("--resume {}: neither a checkpoint (no state.json) nor a run directory (no "
                    "checkpoints/ folder)",
                    resume));
  }
  return plan;
}

TrainProgress resume_progress(const CheckpointInfo& from, Model& model, Optimizer& optimizer,
                              OptimizerType optimizer_type, int world) {
  if (from.optimizer_type != to_string(optimizer_type))  // state.json names it
    throw DataError(fmt::format("{}: written by optimizer {}, but the config asks for {}", from.dir,
                                from.optimizer_type, to_string(optimizer_type)));
  // The optimizer state is the trained parameters' by position: another train.freeze (or LoRA) would pair it with
  // other tensors.
  if (from.trained_params >= 0 && (from.trained_params != static_cast<int64_t>(model.params().size()) ||
                                   from.trained_params_fnv1a != trained_params_hash(model)))
    throw DataError(
        fmt::format("{}: its optimizer state is for {} trained parameters, and this run trains {} (or "
                    "other ones): train.freeze or LoRA differ from the run that wrote it; resume with "
                    "the same, or start a new run with train.init_from",
                    from.dir, from.trained_params, model.params().size()));
  load_checkpoint(from, model, optimizer);
  TrainProgress p = from.progress;
  // The position counts global batches of the writer's world size: keep the sample position.
  if (from.world_size != world) p.micro_done = p.micro_done * from.world_size / world;
  return p;
}

void log_resume(const CheckpointInfo& from, const TrainProgress& p, const std::string& resolved_config, int world,
                int64_t batch) {
  if (from.config_hash != config_hash(resolved_config))
    spdlog::warn("the config differs from the checkpoint's in: {} (the run continues with the new one)",
                 config_differences(from.config, resolved_config));
  if (from.world_size != world)
    spdlog::warn("the checkpoint was written by {} rank(s) and this run has {}: the data order differs from there on",
                 from.world_size, world);
  spdlog::info("resuming from {}: step {}, epoch {}, {} samples into it", from.dir, p.step, p.epoch + 1,
               p.micro_done * batch);
}

std::string config_differences(const std::string& a, const std::string& b) {
  std::string out;
  try {
    const YAML::Node x = YAML::Load(a), y = YAML::Load(b);
    std::set<std::string> keys;
    for (const auto& n : {x, y})
      if (n.IsMap())
        for (const auto& kv : n) keys.insert(kv.first.as<std::string>());
    for (const auto& k : keys)
      if (YAML::Dump(x[k]) != YAML::Dump(y[k])) out += (out.empty() ? "" : ", ") + k;
  } catch (const YAML::Exception&) {
    out = "(unreadable)";
  }
  return out;
}

void load_weights(Model& model, const std::string& path) { load_named_tensors(model.state_tensors(), path); }

void load_finite_weights(Model& model, const std::string& path) {
  load_named_tensors(model.state_tensors(), path, /*finite_only=*/true);
}

std::string weights_file(const std::string& path, const CheckpointConfig& cfg, const std::string& what) {
  // A checkpoint's weights are read only once the checkpoint verifies, as --resume and export read them: a flipped
  // bit would otherwise be evaluated as if it were the trained model.
  const fs::path p = path;
  std::error_code ec;  // (the throwing overloads would end a name too long for the file system uncaught)
  if (!fs::is_directory(p, ec)) {
    if (p.filename() == "model.safetensors" && fs::exists(p.parent_path() / "state.json", ec))
      read_checkpoint(p.parent_path().string());
    return path;
  }
  if (fs::exists(p / "state.json", ec)) return (fs::path(read_checkpoint(path).dir) / "model.safetensors").string();
  if (fs::exists(p / "model.safetensors", ec)) return (p / "model.safetensors").string();
  if (fs::is_directory(p / "checkpoints", ec)) {
    return (fs::path(require_newest_good_of_run(path, cfg).dir) / "model.safetensors").string();
  }
  throw ConfigError(fmt::format("{} {}: a folder without model.safetensors or checkpoints/", what, path));
}

}  // namespace gt
