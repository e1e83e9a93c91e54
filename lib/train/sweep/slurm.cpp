// `gputrain sweep --emit slurm`: the sweep as one Slurm array job, a task per trial.
#include "train/sweep.h"

#include "core/atomic_file.h"
#include "core/ownership.h"
#include "core/quote.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

namespace gt {
namespace fs = std::filesystem;

std::string write_slurm_script(const SweepPlan& plan, const std::string& out, int parallel, const std::string& exe) {
  std::error_code ec;
  claim_output_folder("--out", out, Owner::sweep, Reuse::never, "choose another --out");
  const std::string abs_out = fs::absolute(out, ec).lexically_normal().string();
  std::string cases;
  for (const SweepTrial& t : plan.trials) {
    std::string line = shell_quote(exe);
    for (const std::string& a : trial_train_args(plan, t, abs_out)) {
      line += ' ';
      line += shell_quote(a);
    }
    // --resume auto: a requeued or preempted task continues from its checkpoint (or starts, when there is none).
    cases += fmt::format("  {})\n    exec {} --no-progress --resume auto ;;\n", t.index, line);
  }
  const std::string name = fs::path(abs_out).filename().string();
  const std::string script = fmt::format(
      "#!/bin/bash\n"
      "# Written by `gputrain sweep --emit slurm`: one array task per trial of {} ({} trials). Submit with\n"
      "#   sbatch {}\n"
      "# then compare the trials with `gputrain runs {}`.\n"
      "#SBATCH --job-name={}\n"
      "#SBATCH --array=0-{}%{}\n"
      "#SBATCH --output={}/slurm-%A_%a.out\n"
      "#SBATCH --requeue\n"
      "set -euo pipefail\n"
      "case \"${{SLURM_ARRAY_TASK_ID:?not inside a Slurm array job}}\" in\n"
      "{}"
      "  *)\n    echo \"no trial $SLURM_ARRAY_TASK_ID in this sweep\" >&2\n    exit 2 ;;\n"
      "esac\n",
      shell_quote(plan.config), plan.trials.size(), shell_quote(abs_out + "/sweep.sbatch"), shell_quote(abs_out),
      shell_quote("sweep-" + name), plan.trials.size() - 1, std::max(parallel, 1), abs_out, cases);
  const std::string path = (fs::path(abs_out) / "sweep.sbatch").string();
  write_file_atomic(path, script);
  ::chmod(path.c_str(), 0755);
  write_file_atomic((fs::path(abs_out) / "sweep.json").string(), sweep_json(plan, {}));
  return path;
}

}  // namespace gt
