// Checkpoints, resume, signals and non-finite steps, end to end through the gputrain binary.
#include "core/error.h"
#include "helpers.h"
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <signal.h>

#include <unistd.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

using namespace gt::test;
namespace fs = std::filesystem;

namespace {

// Shuffling, dropout, augmentation, batch-norm buffers, Adam moments, a schedule with warmup and gradient
// accumulation: every piece of state a resume has to carry.
std::string resume_config(int64_t samples, int64_t every_steps) {
  return fmt::format(R"(name: resume
seed: 11
device: cpu
data:
  format: synthetic
  samples: {}
  test_samples: 300
  input_shape: [1, 8, 8]
  targets: {{classes: 4}}
  batch_size: 32
  augment: {{random_crop: {{padding: 1}}, hflip: true}}
model:
  layers:
    - {{type: conv2d, out_channels: 4, kernel_size: 3, padding: 1}}
    - batchnorm2d
    - relu
    - flatten
    - {{type: dropout, p: 0.3}}
    - {{type: linear, out_features: 4}}
optimizer: {{type: adam, lr: 0.01}}
scheduler: {{type: cosine, warmup_steps: 5}}
train: {{epochs: 3, log_every: 4, eval_every: 15, accumulate: 2}}
checkpoint: {{every_steps: {}, keep: 100}}
)",
                     samples, every_steps);
}

std::vector<int64_t> checkpoint_steps(const std::string& run) {
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
    if (const std::string n = e.path().filename().string(); n.rfind("step-", 0) == 0)
      steps.push_back(std::stoll(n.substr(5)));
  std::sort(steps.begin(), steps.end());
  return steps;
}

// The run's final weights and metrics equal the reference run's, bit for bit.
void check_same_run(const std::string& run, const std::string& reference) {
  CHECK(read_text(run + "/model.safetensors") == read_text(reference + "/model.safetensors"));
  CHECK(metrics_without_timing(run) == metrics_without_timing(reference));
  const std::string a = read_text(run + "/summary.json"), b = read_text(reference + "/summary.json");
  CHECK(json_number(a, "final_train_loss") == json_number(b, "final_train_loss"));
  CHECK(json_number(a, "test_accuracy") == json_number(b, "test_accuracy"));
  CHECK(json_number(a, "steps") == json_number(b, "steps"));
}

}  // namespace

TEST_CASE("a resumed run ends bit-identical to an uninterrupted one, from any checkpoint", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(3000, 10));
  const auto full = run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 2 --out " + (dir / "full"));
  INFO(full.output);
  REQUIRE(full.exit_code == 0);
  // 94 micro-batches of 32 → 47 steps per epoch, 141 in all: every 10th step, each epoch's end and the last.
  CHECK(checkpoint_steps(dir / "full") ==
        std::vector<int64_t>{10, 20, 30, 40, 47, 50, 60, 70, 80, 90, 94, 100, 110, 120, 130, 140, 141});
  CHECK(read_text(dir / "full/checkpoints/latest") == "step-141\n");

  // Cut the run back to one checkpoint (mid-epoch and mid-log-window, an epoch's end, a later epoch) and resume.
  for (int64_t cut : {30, 47, 110}) {
    DYNAMIC_SECTION("resumed from step " << cut) {
      const std::string run = dir / fmt::format("cut{}", cut);
      fs::copy(dir / "full", run, fs::copy_options::recursive);
      for (int64_t s : checkpoint_steps(run))
        if (s > cut) fs::remove_all(run + fmt::format("/checkpoints/step-{}", s));
      fs::remove(run + "/model.safetensors");
      fs::remove(run + "/summary.json");  // a run cut short there: it never wrote one (a finished run is not resumed)
      const auto r = run_gputrain("train " + (dir / "c.yaml") + " --threads 2 --resume auto --out " + run);
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      CHECK_THAT(r.output,
                 Catch::Contains(fmt::format("resuming from {}/checkpoints/step-{}: step {}", run, cut, cut)));
      check_same_run(run, dir / "full");
    }
  }
}

TEST_CASE("state.json holds the loop counters, config hash and file checksums, and is checked when read", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(600, 5));
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --max-steps 12 --out " + (dir / "run")).exit_code == 0);
  const std::string ckpt = dir / "run/checkpoints/step-10";
  const gt::CheckpointInfo info = gt::read_checkpoint(ckpt);
  CHECK(info.progress.step == 10);
  CHECK(info.progress.epoch == 1);  // 19 micro-batches → 10 steps per epoch: step 10 ends epoch 1
  CHECK(info.progress.optimizer_steps == 10);
  CHECK(info.world_size == 1);
  CHECK(info.optimizer_type == "adam");
  CHECK(info.config == read_text(dir / "run/config.resolved.yaml"));
  CHECK(info.config_hash == gt::config_hash(info.config));
  // optimizer.safetensors holds Adam's two moments per parameter (conv, batch norm and linear: 6 parameters).
  const std::string header = read_text(ckpt + "/optimizer.safetensors").substr(8, 2000);
  for (const char* name : {"\"0.exp_avg\"", "\"0.exp_avg_sq\"", "\"5.exp_avg_sq\""})
    CHECK_THAT(header, Catch::Contains(name));
  // model.safetensors has the batch-norm running statistics besides the parameters.
  CHECK_THAT(read_text(ckpt + "/model.safetensors").substr(8, 2000), Catch::Contains("running_mean"));

  const std::string good = read_text(ckpt + "/state.json");
  auto refused = [&](const std::string& text, const std::string& message) {
    INFO(text.substr(0, 200));
    CHECK_THROWS_WITH(gt::parse_state_json(text, "x/state.json"),
                      Catch::Contains("x/state.json") && Catch::Contains(message));
  };
  refused("", "expected a JSON object");
  refused("{\"format\": ", "not valid JSON");
  refused(std::regex_replace(good, std::regex("\"step\": 10,"), "\"step\": \"ten\","),
          "field step expected an integer");
  refused(std::regex_replace(good, std::regex("\"format_version\": 2"), "\"format_version\": 9"),
          "field format_version is 9");
  refused(std::regex_replace(good, std::regex("\"window_loss\": [^,]*,"), ""), "field progress/window_loss is missing");
  refused(std::regex_replace(good, std::regex("\"crc32\": \"[0-9a-f]+\""), "\"crc32\": 5"), "expected 8 hex digits");
}

namespace {

// Flips bit `bit` of the first character after `after` in the file (one bit of damage, as a failing disk or a stray
// write would do it).
void flip_bit_after(const std::string& path, const std::string& after, int bit) {
  std::string text = read_text(path);
  const size_t at = text.find(after);
  REQUIRE(at != std::string::npos);
  text[at + after.size()] = static_cast<char>(text[at + after.size()] ^ (1 << bit));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

}  // namespace

TEST_CASE("state.json is checksummed: one flipped bit in a counter is refused, and auto falls back", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(600, 5));
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --epochs 2 --out " + (dir / "run")).exit_code == 0);
  REQUIRE(checkpoint_steps(dir / "run") == std::vector<int64_t>{5, 10, 15, 20});
  const std::string good = read_text(dir / "run/checkpoints/step-20/state.json");
  CHECK_NOTHROW(gt::check_state_checksum(good, "s.json"));
  // Each of these still parses: only the checksum tells them from the real state.
  struct Flip {
    const char* field;
    int bit;
  };
  for (const Flip& f : {Flip{"\"epoch\": ", 1},          // 2 → 0: a resumed run would end at once as completed
                        Flip{"\"lr_scale\": ", 3},       // 1 → 9: nine times the learning rate
                        Flip{"\"micro_batches\": ", 0},  // another position in the epoch
                        Flip{"\"step\": ", 2}}) {
    DYNAMIC_SECTION(f.field) {
      const std::string ckpt = dir / "flipped";
      fs::remove_all(ckpt);
      fs::copy(dir / "run/checkpoints/step-20", ckpt);
      flip_bit_after(ckpt + "/state.json", f.field, f.bit);
      REQUIRE(read_text(ckpt + "/state.json") != good);
      CHECK_NOTHROW(gt::parse_state_json(read_text(ckpt + "/state.json"), "s.json"));
      CHECK_THROWS_WITH(gt::read_checkpoint(ckpt),
                        Catch::Contains(ckpt + "/state.json") && Catch::Contains("state_crc32"));
      const auto r =
          run_gputrain("train " + (dir / "c.yaml") + " --epochs 3 --resume " + ckpt + " --out " + (dir / "never"));
      CHECK(r.exit_code == 1);
      CHECK_THAT(r.output, Catch::Contains("state_crc32") && Catch::Contains("the file is corrupt"));
      CHECK_FALSE(fs::exists(dir / "never"));
    }
  }
  // A checksum that is missing (an edit by hand that dropped it) is refused too.
  CHECK_THROWS_WITH(gt::check_state_checksum(good.substr(0, good.rfind(", \"state_crc32\"")) + "}\n", "s.json"),
                    Catch::Contains("s.json: has no state_crc32"));

  // --resume auto skips the damaged newest checkpoint, says why, and continues from the one before (of a run cut
  // short: a finished one, with its summary.json, is not resumed in place).
  flip_bit_after(dir / "run/checkpoints/step-20/state.json", "\"epoch\": ", 1);
  fs::remove(dir / "run/summary.json");
  const auto r = run_gputrain("train " + (dir / "c.yaml") + " --epochs 3 --resume auto --out " + (dir / "run"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("skipping checkpoint " + (dir / "run/checkpoints/step-20")) &&
                           Catch::Contains("state_crc32") &&
                           Catch::Contains("falling back to checkpoint " + (dir / "run/checkpoints/step-15")));
  CHECK(json_number(read_text(dir / "run/summary.json"), "steps") == 30);
}

TEST_CASE("gputrain eval verifies a checkpoint before it scores its weights", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(600, 5));
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --max-steps 10 --out " + (dir / "run")).exit_code == 0);
  const std::string ckpt = dir / "run/checkpoints/step-10";
  const auto before = run_gputrain("eval " + (dir / "c.yaml") + " --checkpoint " + ckpt + " --json");
  INFO(before.output);
  REQUIRE(before.exit_code == 0);
  {  // one flipped exponent bit in the last weight: a finite but huge number
    std::fstream f(ckpt + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char last = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(last ^ 0x20));
  }
  for (const std::string& where : {ckpt, ckpt + "/model.safetensors"}) {
    const auto r = run_gputrain("eval " + (dir / "c.yaml") + " --checkpoint " + where + " --json");
    INFO(where << "\n" << r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains(ckpt + "/model.safetensors") && Catch::Contains("the file is corrupt"));
    CHECK_THAT(r.output, !Catch::Contains("test_loss"));
  }
  // A run directory without final weights is scored at its newest checkpoint that verifies, saying which it skipped.
  fs::remove(dir / "run/model.safetensors");
  const auto r = run_gputrain("eval " + (dir / "c.yaml") + " --checkpoint " + (dir / "run") + " --json");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("skipping checkpoint " + ckpt) &&
                           Catch::Contains("falling back to checkpoint " + (dir / "run/checkpoints/step-5")));
}

TEST_CASE("SIGTERM finishes the step, checkpoints and exits 75, and --resume auto then matches the uninterrupted run",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(24000, 25));
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 1 --out " + (dir / "full")).exit_code == 0);

  for (int sig : {SIGTERM, SIGUSR1}) {
    DYNAMIC_SECTION("signal " << sig) {
      const std::string run = dir / fmt::format("run{}", sig);
      const Background b = start_gputrain("train " + (dir / "c.yaml") + " --threads 1 --out " + run, dir / "log");
      REQUIRE(wait_for_file(run + "/checkpoints/latest", 60));
      kill(b.pid, sig);
      const int code = wait_exit(b);
      const std::string log = read_text(dir / "log");
      INFO(log);
      REQUIRE(code == 75);
      CHECK_THAT(log, Catch::Contains("received: stopping after step") && Catch::Contains("--resume auto"));
      const std::string summary = read_text(run + "/summary.json");
      CHECK(json_string(summary, "exit_reason") == "interrupted");
      CHECK(json_number(summary, "steps") < 2250.0);  // 750 steps per epoch × 3: it did stop early
      const auto r = run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 1 --resume auto --out " + run);
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      check_same_run(run, dir / "full");
    }
  }
}

TEST_CASE("a signal while the run is being set up still stops it the documented way", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(3000, 10));
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) {
    DYNAMIC_SECTION("signal " << sig) {
      const std::string run = dir / fmt::format("run{}", sig);
      // Writing config.resolved.yaml (after the data loaded, before the first step) is held up for 3 s: the signal
      // lands there, where the handlers used to be missing still.
      const Background b = start_gputrain("train " + (dir / "c.yaml") + " --threads 1 --out " + run, dir / "log",
                                          std::string("LD_PRELOAD=") + GT_FAULT_LIB +
                                              " GT_FAULT_MATCH=config.resolved.yaml GT_FAULT_ACTION=slow"
                                              " GT_FAULT_SLEEP_MS=3000");
      REQUIRE(wait_for_file(run + "/config.resolved.yaml.tmp", 60));
      kill(b.pid, sig);
      const int code = wait_exit(b);
      const std::string log = read_text(dir / "log");
      INFO(log);
      CHECK(code == 75);
      const std::string summary = read_text(run + "/summary.json");
      CHECK(json_string(summary, "exit_reason") == "interrupted");
      CHECK(json_number(summary, "steps") == 1);  // the step under way when it was noticed, then the stop
      // No epoch ended: the final train loss is not known, and 0 would read as a perfect fit.
      CHECK_THAT(summary, Catch::Contains("\"final_train_loss\": null"));
      CHECK_THAT(log, Catch::Contains("final train loss n/a"));
      CHECK(fs::exists(run + "/checkpoints/step-1"));
    }
  }
}

TEST_CASE("a SIGTERM before main, while the libraries initialise, stops a run the documented way", "[e2e]") {
  // The preloaded library raises SIGTERM from its initialiser: after gputrain's .preinit_array, before its main.
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(3000, 10));
  const std::string env = std::string("LD_PRELOAD=") + GT_FAULT_LIB + " GT_FAULT_RAISE_AT_LOAD=TERM";
  const auto r = run_gputrain("train " + (dir / "c.yaml") + " --threads 1 --out " + (dir / "run"), env);
  INFO(r.output);
  CHECK(r.exit_code == 75);
  CHECK(json_string(read_text(dir / "run/summary.json"), "exit_reason") == "interrupted");
  CHECK_THAT(r.output, Catch::Contains("SIGTERM received"));
  // Any other command takes the signal's default action once its command line is read, as before main.
  CHECK(run_gputrain("check " + (dir / "c.yaml"), env).exit_code == 128 + SIGTERM);
  CHECK(run_gputrain("--version", env).exit_code == 0);  // (--version answers before the command is known)
}

TEST_CASE("a second Ctrl-C exits 130 at once and leaves the last checkpoint loadable", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(24000, 25));
  const std::string run = dir / "run";
  // The second checkpoint's write is slowed down so that the second Ctrl-C lands in the middle of it.
  const Background b = start_gputrain("train " + (dir / "c.yaml") + " --threads 1 --out " + run, dir / "log",
                                      std::string("LD_PRELOAD=") + GT_FAULT_LIB +
                                          " GT_FAULT_MATCH=tmp/model.safetensors GT_FAULT_SKIP=1 GT_FAULT_ACTION=slow"
                                          " GT_FAULT_SLEEP_MS=5000");
  REQUIRE(wait_for_file(run + "/checkpoints/latest", 60));
  // Past step 25 first: a stop at the step just checkpointed writes nothing more and exits before the second Ctrl-C
  // (a race that fast steps made frequent under ctest -j2).
  for (int i = 0; i < 1000 && read_text(dir / "log").find("| step 28/") == std::string::npos; ++i) usleep(10000);
  kill(b.pid, SIGINT);
  for (int i = 0; i < 500 && read_text(dir / "log").find("stop requested") == std::string::npos; ++i) usleep(10000);
  kill(b.pid, SIGINT);
  const int code = wait_exit(b);
  INFO(read_text(dir / "log"));
  CHECK(code == 130);
  CHECK_THAT(read_text(dir / "log"), Catch::Contains("second interrupt"));
  CHECK(read_text(run + "/checkpoints/latest") == "step-25\n");  // untouched
  const auto r =
      run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 1 --max-steps 5 --resume auto --out " + run);
  INFO(r.output);
  CHECK(r.exit_code == 0);
}

TEST_CASE("kill -9 in the middle of a checkpoint write leaves the previous one complete", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(3000, 10));
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 2 --out " + (dir / "full")).exit_code == 0);
  // The third checkpoint (step 30) dies half-way through writing its optimizer state.
  const Background b = start_gputrain("train " + (dir / "c.yaml") + " --threads 2 --out " + (dir / "run"), dir / "log",
                                      std::string("LD_PRELOAD=") + GT_FAULT_LIB +
                                          " GT_FAULT_MATCH=tmp/optimizer.safetensors GT_FAULT_SKIP=2 "
                                          "GT_FAULT_ACTION=kill");
  CHECK(wait_exit(b) == 128 + SIGKILL);
  CHECK(fs::exists(dir / "run/checkpoints/.step-30.tmp"));  // the half-written one, never renamed into place
  CHECK(checkpoint_steps(dir / "run") == std::vector<int64_t>{10, 20});
  CHECK(read_text(dir / "run/checkpoints/latest") == "step-20\n");
  const auto r = run_gputrain("train " + (dir / "c.yaml") + " --threads 2 --resume auto --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("step-20: step 20"));
  check_same_run(dir / "run", dir / "full");
  CHECK_FALSE(fs::exists(dir / "run/checkpoints/.step-30.tmp"));  // cleaned up once a new checkpoint is complete
}

TEST_CASE("a full disk stops the run with exit 1 naming the file and keeps the last good checkpoint", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(3000, 10));
  const auto r = run_gputrain("train " + (dir / "c.yaml") + " --out " + (dir / "run"),
                              std::string("LD_PRELOAD=") + GT_FAULT_LIB +
                                  " GT_FAULT_MATCH=tmp/model.safetensors GT_FAULT_SKIP=1 GT_FAULT_ACTION=enospc");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains(dir / "run/checkpoints/.step-20.tmp/model.safetensors.tmp") &&
                           Catch::Contains("No space left on device"));
  CHECK(checkpoint_steps(dir / "run") == std::vector<int64_t>{10});
  CHECK_FALSE(fs::exists(dir / "run/checkpoints/.step-20.tmp"));
  CHECK_NOTHROW(gt::read_checkpoint(dir / "run/checkpoints/step-10"));
}

TEST_CASE("corrupt checkpoints are refused by name, and auto falls back to the previous good one", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(600, 5));
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --epochs 2 --out " + (dir / "run")).exit_code == 0);
  REQUIRE(checkpoint_steps(dir / "run") == std::vector<int64_t>{5, 10, 15, 20});
  fs::remove(dir / "run/summary.json");  // as a run cut short leaves it: a finished run is not resumed in place
  {                                      // flip one byte in the middle of the newest checkpoint's weights
    std::fstream f(dir / "run/checkpoints/step-20/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-7, std::ios::end);
    f.put('\x5a');
  }
  const auto explicit_path =
      run_gputrain("train " + (dir / "c.yaml") + " --resume " + (dir / "run/checkpoints/step-20"));
  CHECK(explicit_path.exit_code == 1);
  CHECK_THAT(explicit_path.output, Catch::Contains(dir / "run/checkpoints/step-20/model.safetensors") &&
                                       Catch::Contains("the file is corrupt"));

  const auto r = run_gputrain("train " + (dir / "c.yaml") + " --epochs 3 --resume auto --out " + (dir / "run"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("skipping checkpoint " + (dir / "run/checkpoints/step-20")) &&
                           Catch::Contains("falling back to checkpoint " + (dir / "run/checkpoints/step-15")) &&
                           Catch::Contains("the config differs from the checkpoint's in: train"));

  // A checkpoint of another model is refused with the differences listed.
  fs::remove(dir / "run/summary.json");
  const auto other = run_gputrain(
      "train " + (dir / "c.yaml") +
      " --set model.layers[5].out_features=3 --set data.targets.classes=3 --resume auto --out " + (dir / "run"));
  CHECK(other.exit_code == 1);
  CHECK_THAT(other.output, Catch::Contains("does not match the model") &&
                               Catch::Contains("layers.5.weight: f32 [4, 256] in the file, f32 [3, 256] in the model"));
  // Starting a new run in a folder that holds a run would mix two runs: refused.
  const auto clash = run_gputrain("train " + (dir / "c.yaml") + " --out " + (dir / "run"));
  CHECK(clash.exit_code == 2);
  CHECK_THAT(clash.output, Catch::Contains("--out " + (dir / "run") + ": holds a") &&
                               Catch::Contains(") already; --resume auto --out"));
}

TEST_CASE("a run directory is locked while a run uses it, and belongs to one run", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(24000, 25));
  const std::string run = dir / "run";
  // The first checkpoint's write is held up, so the run is surely still going when the others try.
  const Background b = start_gputrain("train " + (dir / "c.yaml") + " --threads 1 --out " + run, dir / "log",
                                      std::string("LD_PRELOAD=") + GT_FAULT_LIB +
                                          " GT_FAULT_MATCH=tmp/model.safetensors GT_FAULT_ACTION=slow"
                                          " GT_FAULT_SLEEP_MS=4000");
  REQUIRE(wait_for_file(run + "/checkpoints/.step-25.tmp/model.safetensors.tmp", 60));
  const std::string metrics = read_text(run + "/metrics.jsonl");
  for (const char* how : {"", " --resume auto"}) {
    const auto second =
        run_gputrain("train " + (dir / "c.yaml") + " --threads 1 --max-steps 3 --out " + run + std::string(how));
    INFO(second.output);
    CHECK(second.exit_code == 1);
    CHECK_THAT(second.output,
               Catch::Contains(run + ": in use by another gputrain run (pid " + std::to_string(b.pid) + ")"));
  }
  CHECK(read_text(run + "/metrics.jsonl").substr(0, metrics.size()) == metrics);  // nothing of theirs in it
  kill(b.pid, SIGTERM);
  CHECK(wait_exit(b) == 75);
  // Once the run is over, the directory is free again (the lock went with the process).
  const auto again =
      run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 1 --max-steps 30 --resume auto --out " + run);
  INFO(again.output);
  CHECK(again.exit_code == 0);

  // A checkpoint of one run resumed into another run's directory would mix both: refused before anything changes.
  write_text(dir / "other.yaml", resume_config(600, 5));
  REQUIRE(run_gputrain("train " + (dir / "other.yaml") + " --quiet --max-steps 5 --out " + (dir / "other")).exit_code ==
          0);
  const std::string other_metrics = read_text(dir / "other/metrics.jsonl");
  for (const std::string& from : {run + "/checkpoints/step-25", run}) {
    const auto mixed =
        run_gputrain("train " + (dir / "c.yaml") + " --threads 1 --resume " + from + " --out " + (dir / "other"));
    INFO(mixed.output);
    CHECK(mixed.exit_code == 2);
    CHECK_THAT(mixed.output, Catch::Contains("--out " + (dir / "other") + ": holds another run"));
  }
  CHECK(read_text(dir / "other/metrics.jsonl") == other_metrics);
  CHECK(checkpoint_steps(dir / "other") == std::vector<int64_t>{5});
  // A folder without a run in it may take a resumed copy.
  const auto copy = run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 1 --max-steps 27 --resume " + run +
                                 "/checkpoints/step-25 --out " + (dir / "copy"));
  INFO(copy.output);
  CHECK(copy.exit_code == 0);
}

TEST_CASE("explicit outputs never overwrite a run's own files, and failed writes leave no temporaries", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(600, 5));
  const std::string run = dir / "run";
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --max-steps 10 --out " + run).exit_code == 0);
  const std::string metrics = read_text(run + "/metrics.jsonl");
  const std::string weights = read_text(run + "/checkpoints/step-10/model.safetensors");
  struct Case {
    std::string args, target;
  };
  for (const Case& c : {Case{"report " + run + " --out ", run + "/metrics.jsonl"},
                        Case{"report " + run + " --out ", run + "/summary.json"},
                        Case{"export " + run + " --to ", run + "/checkpoints/step-10/model.safetensors"},
                        Case{"export " + run + " --to ", run + "/model.safetensors"},
                        Case{"export " + run + "/checkpoints/step-5 --to ", run + "/checkpoints/step-10/../new"}}) {
    const auto r = run_gputrain(c.args + c.target);
    INFO(c.args << c.target << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("inside " + run + ", which holds a finished run (summary.json)"));
  }
  CHECK(read_text(run + "/metrics.jsonl") == metrics);
  CHECK(read_text(run + "/checkpoints/step-10/model.safetensors") == weights);
  CHECK_NOTHROW(gt::read_checkpoint(run + "/checkpoints/step-10"));
  CHECK_FALSE(fs::exists(run + "/checkpoints/new"));
  // The run's own report is rewritten, as the run itself does.
  CHECK(run_gputrain("report " + run).exit_code == 0);
  CHECK(run_gputrain("report " + run + " --out " + run + "/report.html").exit_code == 0);

  // A target that cannot be written (here a folder) fails with exit 1 and leaves no temporary beside it.
  fs::create_directory(dir / "folder");
  const auto e = run_gputrain("export " + run + " --to " + (dir / "folder"));
  INFO(e.output);
  CHECK(e.exit_code == 1);
  CHECK_FALSE(fs::exists(dir / "folder.tmp"));
  const auto rep = run_gputrain("report " + run + " --out " + (dir / "folder"));
  INFO(rep.output);
  CHECK(rep.exit_code == 1);
  CHECK_FALSE(fs::exists(dir / "folder.tmp"));
}

TEST_CASE("a full disk leaves metrics.jsonl whole rows and no probe file", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(3000, 10));
  // The disk fills up in the middle of a metrics row (at 1000 bytes; the rows are longer than 100).
  const auto r = run_gputrain("train " + (dir / "c.yaml") + " --out " + (dir / "run"),
                              std::string("LD_PRELOAD=") + GT_FAULT_LIB +
                                  " GT_FAULT_MATCH=metrics.jsonl GT_FAULT_ACTION=full GT_FAULT_BYTES=1000");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains(dir / "run/metrics.jsonl") && Catch::Contains("No space left on device"));
  const std::string metrics = read_text(dir / "run/metrics.jsonl");
  CHECK(metrics.size() <= 1000);
  CHECK(metrics.size() > 100);
  CHECK(metrics.back() == '\n');
  for (const auto& l : lines_of(metrics)) CHECK(l.back() == '}');
  // --resume auto picks the run up from there.
  const auto resumed =
      run_gputrain("train " + (dir / "c.yaml") + " --quiet --max-steps 30 --resume auto --out " + (dir / "run"));
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);

  // The run directory's write test on a full disk: refused by name, and the probe does not stay behind.
  const auto full = run_gputrain("train " + (dir / "c.yaml") + " --out " + (dir / "full"),
                                 std::string("LD_PRELOAD=") + GT_FAULT_LIB +
                                     " GT_FAULT_MATCH=.write-test GT_FAULT_ACTION=full GT_FAULT_BYTES=0");
  INFO(full.output);
  CHECK(full.exit_code == 1);
  CHECK_THAT(full.output, Catch::Contains(dir / "full: the run directory is not writable: No space left on device"));
  CHECK_FALSE(fs::exists(dir / "full/.write-test"));
}

TEST_CASE("a resume under another batch size or accumulation is refused, naming the key", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(600, 5));  // batch 32, accumulate 2
  const std::string run = dir / "run";
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --max-steps 12 --out " + run).exit_code == 0);
  const std::string metrics = read_text(run + "/metrics.jsonl");
  // 64 after 32 would end the run at once as completed, 16 would repeat samples, and accumulate 1 would halve a
  // step: each is refused before the run directory changes.
  for (const std::string set : {"data.batch_size=64", "data.batch_size=16", "train.accumulate=1"}) {
    const auto r =
        run_gputrain("train " + (dir / "c.yaml") + " --epochs 3 --set " + set + " --resume auto --out " + run);
    INFO(set << "\n" << r.output);
    CHECK(r.exit_code == 2);
    const std::string key = set.substr(0, set.find('='));
    CHECK_THAT(r.output, Catch::Contains(key + ": is " + set.substr(set.find('=') + 1) + ", but checkpoint " + run +
                                         "/checkpoints/step-12 was written with"));
    CHECK(lines_of(r.output).size() == 1);
    CHECK(read_text(run + "/metrics.jsonl") == metrics);
  }
  const gt::CheckpointInfo info = gt::read_checkpoint(run + "/checkpoints/step-12");
  CHECK(info.batch_size == 32);
  CHECK(info.accumulate == 2);
  // The same batches resume (bit-identity is checked by the cases above).
  CHECK(run_gputrain("train " + (dir / "c.yaml") + " --quiet --epochs 2 --resume auto --out " + run).exit_code == 0);
}

TEST_CASE("keep prunes old checkpoints only after a new one is complete, and keep_best keeps the best", "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(3000, 10));
  const auto r = run_gputrain("train " + (dir / "c.yaml") +
                              " --quiet --set checkpoint.keep=2 --set checkpoint.keep_best=test_accuracy"
                              " --set train.eval_every=10 --out " +
                              (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // The best test accuracy among the evaluations taken at checkpoints.
  double best = -1;
  int64_t best_step = -1;
  for (const auto& l : lines_of(read_text(dir / "run/metrics.jsonl")))
    if (json_string(l, "type") == "eval" && json_number(l, "test_accuracy") > best) {
      best = *json_number(l, "test_accuracy");
      best_step = static_cast<int64_t>(*json_number(l, "step"));
    }
  REQUIRE(best_step > 0);
  std::set<int64_t> want = {140, 141, best_step};
  const auto steps = checkpoint_steps(dir / "run");
  CHECK(std::set<int64_t>(steps.begin(), steps.end()) == want);
  CHECK(read_text(dir / "run/checkpoints/best") == fmt::format("step-{}\n", best_step));
  CHECK(gt::read_checkpoint(dir / fmt::format("run/checkpoints/step-{}", best_step)).progress.test_accuracy == best);
}

namespace {

// 256 samples of 4 features in two classes; sample 100 (in step 7 when unshuffled at batch 16) holds float's largest
// value in every feature. The data is finite (NaN and Inf inputs are refused at load), but that sample's forward
// pass overflows, so its loss and gradients are not.
std::string nan_data(const TempDir& dir) {
  std::vector<float> x(256 * 4);
  std::vector<int64_t> y(256);
  for (int i = 0; i < 256; ++i) {
    for (int j = 0; j < 4; ++j) x[static_cast<size_t>(i * 4 + j)] = std::sin(static_cast<float>(i * 7 + j * 3));
    y[static_cast<size_t>(i)] = x[static_cast<size_t>(i * 4)] + x[static_cast<size_t>(i * 4 + 1)] > 0 ? 1 : 0;
  }
  for (int j = 0; j < 4; ++j) x[static_cast<size_t>(100 * 4 + j)] = std::numeric_limits<float>::max();
  write_npy(dir / "x.npy", "<f4", "(256, 4)", x.data(), x.size() * sizeof(float));
  write_npy(dir / "y.npy", "<i8", "(256,)", y.data(), y.size() * sizeof(int64_t));
  return fmt::format(R"(name: nan
seed: 3
device: cpu
data: {{format: npy, train: {{inputs: {}, targets: {}}}, batch_size: 16, shuffle: false}}
model: {{layers: [{{type: linear, out_features: 8}}, relu, {{type: linear, out_features: 2}}]}}
optimizer: {{type: sgd, lr: 0.1}}
train: {{epochs: 3, log_every: 4}}
)",
                     dir / "x.npy", dir / "y.npy");
}

}  // namespace

TEST_CASE("a non-finite loss aborts with exit 4 naming the step and layer, or is skipped", "[e2e]") {
  TempDir dir;
  write_text(dir / "nan.yaml", nan_data(dir));
  const auto abort = run_gputrain("train " + (dir / "nan.yaml") + " --out " + (dir / "abort"));
  INFO(abort.output);
  CHECK(abort.exit_code == 4);
  CHECK_THAT(abort.output, Catch::Contains("training diverged: step 7: non-finite loss") &&
                               Catch::Contains("first non-finite gradient: layers.0.weight"));
  CHECK(json_string(read_text(dir / "abort/summary.json"), "exit_reason") == "diverged");
  CHECK(json_number(read_text(dir / "abort/summary.json"), "steps") == 6);  // the weights of step 6 were kept

  const auto skip = run_gputrain("train " + (dir / "nan.yaml") + " --set train.nonfinite=skip --out " + (dir / "skip"));
  INFO(skip.output);
  CHECK(skip.exit_code == 0);
  int skips = 0;
  for (const auto& l : lines_of(read_text(dir / "skip/metrics.jsonl"))) {
    if (json_string(l, "type") == "skip") ++skips;
    if (json_string(l, "type") == "train") CHECK(json_number(l, "loss").has_value());  // null would mean NaN
  }
  CHECK(skips == 3);  // once per epoch
  CHECK(std::isfinite(json_number(read_text(dir / "skip/summary.json"), "final_train_loss").value_or(NAN)));

  // The same bad batch every time: max_skips in a row is reached only when steps fail back to back.
  const auto once = run_gputrain("train " + (dir / "nan.yaml") +
                                 " --set train.nonfinite=skip --set train.max_skips=1 --set data.batch_size=4 --set "
                                 "train.epochs=1 --out " +
                                 (dir / "once"));
  CHECK(once.exit_code == 0);
}

TEST_CASE("nonfinite: rollback returns to the last checkpoint with half the learning rate until training is stable",
          "[e2e]") {
  TempDir dir;
  // Least squares with a learning rate far past the stable range: the loss overflows within a few dozen steps.
  write_text(dir / "div.yaml", R"(name: div
seed: 5
device: cpu
data: {format: synthetic, samples: 2048, input_shape: [20], targets: {shape: [1]}, batch_size: 16}
model: {layers: [{type: linear, out_features: 1}]}
loss: mse
optimizer: {type: sgd, lr: 3.0}
train: {epochs: 2, log_every: 16, nonfinite: rollback, max_skips: 8}
checkpoint: {every_steps: 0, every_epochs: 0}
)");
  const auto r = run_gputrain("train " + (dir / "div.yaml") + " --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  int rollbacks = 0;
  double scale = 1;
  for (const auto& l : lines_of(read_text(dir / "run/metrics.jsonl")))
    if (json_string(l, "type") == "rollback") {
      ++rollbacks;
      CHECK(json_number(l, "to_step") == 0);
      CHECK(json_number(l, "from_step") > 0);
      scale = *json_number(l, "lr_scale");
    }
  CHECK(rollbacks >= 1);
  CHECK(scale == std::pow(0.5, rollbacks));
  CHECK_THAT(r.output, Catch::Contains("rolled back to"));
  CHECK(json_string(read_text(dir / "run/summary.json"), "exit_reason") == "completed");
  // With divergence that no learning rate cures, rollback gives up after max_skips and exits 4.
  const auto hopeless = run_gputrain("train " + (dir / "div.yaml") +
                                     " --set optimizer.lr=1e30 --set train.max_skips=2 "
                                     "--out " +
                                     (dir / "hopeless"));
  CHECK(hopeless.exit_code == 4);
  CHECK_THAT(hopeless.output, Catch::Contains("more than max_skips 2"));
}

TEST_CASE("gputrain export writes weights that PyTorch loads and scores exactly as gputrain does", "[e2e]") {
  TempDir dir;
  // Fashion-MNIST with batch norm, a residual add, pooling, dropout and a linear head: every mapping the script needs.
  write_text(dir / "fm.yaml", R"(name: fm_small
seed: 4
device: cpu
data:
  format: idx
  train: {images: /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz,
          labels: /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz}
  test:  {images: /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz,
          labels: /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz}
  scale: 0.00392156862745098
  batch_size: 64
model:
  layers:
    - {type: conv2d, out_channels: 8, kernel_size: 3, padding: 1, bias: false}
    - batchnorm2d
    - relu
    - {type: maxpool2d, kernel_size: 2, name: stage}
    - {type: conv2d, out_channels: 8, kernel_size: 3, padding: 1}
    - {type: batchnorm2d, name: branch}
    - {type: add, inputs: [stage, branch]}
    - relu
    - {type: avgpool2d, kernel_size: 2}
    - flatten
    - {type: dropout, p: 0.2}
    - {type: linear, out_features: 10}
loss: {type: cross_entropy, label_smoothing: 0.1}
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
train: {epochs: 1, max_steps: 40}
)");
  const auto r = run_gputrain("train " + (dir / "fm.yaml") + " --quiet --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto e = run_gputrain("export " + (dir / "run") + " --to " + (dir / "w.safetensors"));
  INFO(e.output);
  REQUIRE(e.exit_code == 0);
  CHECK_THAT(e.output, Catch::Contains("checkpoints/step-40: 13 tensors of step 40"));

  const std::string cmd = "/usr/bin/python3 " + source_path("scripts/torch_eval.py") + " " + (dir / "w.safetensors") +
                          " > " + (dir / "torch.json") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string torch_out = read_text(dir / "torch.json"), summary = read_text(dir / "run/summary.json");
  INFO(torch_out << "\n" << summary);
  REQUIRE(rc == 0);
  CHECK(json_number(torch_out, "samples") == 10000);
  // Tolerance: float summation order differs between the two (GEMM blocking, convolution algorithm), which can move
  // a logit by ~1e-6; an argmax that close to a tie may flip, so at most 3 of 10,000 predictions may differ.
  CHECK(std::abs(*json_number(torch_out, "test_accuracy") - *json_number(summary, "test_accuracy")) <= 3e-4);
  CHECK(*json_number(torch_out, "test_loss") == Approx(*json_number(summary, "test_loss")).epsilon(1e-5));
  CHECK(json_number(summary, "test_accuracy") > 0.5);  // it did learn: the comparison is not between two guesses

  // Export refuses a checkpoint that does not verify.
  {
    std::fstream f(dir / "run/checkpoints/step-40/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x11');
  }
  const auto bad = run_gputrain("export " + (dir / "run/checkpoints/step-40") + " --to " + (dir / "x.safetensors"));
  CHECK(bad.exit_code == 1);
  CHECK_THAT(bad.output, Catch::Contains("step-40/model.safetensors") && Catch::Contains("corrupt"));
  CHECK_FALSE(fs::exists(dir / "x.safetensors"));
}

TEST_CASE("bad --resume paths, broken state.json and incomplete checkpoints fail with one line naming the file",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(600, 5));
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --max-steps 5 --out " + (dir / "run")).exit_code == 0);
  const std::string good = dir / "run/checkpoints/step-5";
  // Each case gets a copy of the good checkpoint with one thing broken.
  struct Case {
    const char* name;
    std::function<void(const std::string&)> damage;
    int code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no state.json", [](const std::string& d) { fs::remove(d + "/state.json"); }, 2, "neither a checkpoint"},
      {"state.json not JSON", [](const std::string& d) { write_text(d + "/state.json", "{\"step\": [1,"); }, 1,
       "state.json: not valid JSON"},
      {"state.json an array", [](const std::string& d) { write_text(d + "/state.json", "[1, 2]"); }, 1,
       "state.json: expected a JSON object"},
      {"optimizer file missing", [](const std::string& d) { fs::remove(d + "/optimizer.safetensors"); }, 1,
       "optimizer.safetensors: cannot open"},
      {"weights truncated",
       [](const std::string& d) {
         fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") - 4);
       },
       1, "model.safetensors: "},
      {"another format version",
       [](const std::string& d) {
         write_text(d + "/state.json",
                    std::regex_replace(read_text(d + "/state.json"), std::regex("\"format_version\": 2"),
                                       "\"format_version\": 4"));
       },
       1, "state.json: field format_version is 4"},
  };
  for (const auto& c : cases) {
    const std::string ckpt = dir / (std::string("ck-") + std::to_string(&c - cases.data()));
    fs::copy(good, ckpt);
    c.damage(ckpt);
    const auto r = run_gputrain("train " + (dir / "c.yaml") + " --resume " + ckpt + " --out " + (dir / "never"));
    INFO(c.name << "\n" << r.output);
    CHECK(r.exit_code == c.code);
    CHECK_THAT(r.output, Catch::Contains(c.message));
    CHECK(lines_of(r.output).size() == 1);
    CHECK_FALSE(fs::exists(dir / "never"));
    const auto e = run_gputrain("export " + ckpt + " --to " + (dir / "w.safetensors"));
    CHECK(e.exit_code != 0);
    CHECK_FALSE(fs::exists(dir / "w.safetensors"));
  }
  CHECK(run_gputrain("train " + (dir / "c.yaml") + " --resume " + (dir / "nowhere")).exit_code == 2);
}

TEST_CASE("resume never writes into a finished run, and an interrupted one prints the command that resumes it",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "c.yaml", resume_config(600, 5));
  auto snapshot = [](const std::string& d) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(d))
      if (e.is_regular_file()) files[e.path().string()] = read_text(e.path().string());
    return files;
  };
  // A finished run in runs/<name>/ (the default place), then --resume auto with other flags, from the same folder.
  const std::string cd = "cd " + dir.path() + " && " + gputrain_binary() + " ";
  REQUIRE(run_shell(cd + "train c.yaml --quiet --threads 1 2>&1").exit_code == 0);
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(dir / "runs/resume")) runs.push_back(e.path().string());
  REQUIRE(runs.size() == 1);
  const std::string done = runs[0];
  const auto before = snapshot(done);
  auto r = run_shell(cd + "train c.yaml --epochs 1 --resume auto --threads 1 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("the newest run, runs/resume/") && Catch::Contains("is complete (completed): "
                                                                                          "starting a new run"));
  CHECK(snapshot(done) == before);  // summary.json and config.resolved.yaml as they were
  // --resume naming it: refused (exit 2); --resume auto --out it: nothing to do (exit 0), nothing written.
  r = run_gputrain("train " + (dir / "c.yaml") + " --resume " + done);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("is complete (completed); --resume " + done + " --out NEW_DIR continues it"));
  r = run_gputrain("train " + (dir / "c.yaml") + " --resume auto --out " + done);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("the run is complete (completed); nothing to resume, nothing written"));
  CHECK(snapshot(done) == before);
  // --resume RUN --out NEW continues it, optimizer state and all, with its metrics carried over.
  r = run_gputrain("train " + (dir / "c.yaml") + " --epochs 4 --quiet --resume " + done + " --out " + (dir / "more"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(snapshot(done) == before);
  const std::string old_metrics = read_text(done + "/metrics.jsonl");
  CHECK(read_text(dir / "more/metrics.jsonl").substr(0, old_metrics.size()) == old_metrics);
  CHECK(json_number(read_text(dir / "more/summary.json"), "steps") >
        json_number(read_text(done + "/summary.json"), "steps"));
  // An interrupted run says how to resume it; that command, typed from anywhere, finishes it like an unbroken run.
  write_text(dir / "long.yaml", resume_config(24000, 25));
  const std::string run = dir / "run";
  const Background b = start_gputrain("train " + (dir / "long.yaml") + " --threads 1 --out " + run, dir / "log");
  REQUIRE(wait_for_file(run + "/checkpoints/latest", 60));
  kill(b.pid, SIGTERM);
  REQUIRE(wait_exit(b) == 75);
  const std::string log = read_text(dir / "log");
  const std::string want = "gputrain train " + run + " --resume auto --out " + run;
  CHECK_THAT(log, Catch::Contains("interrupted (resume with: " + want + ")"));
  r = run_shell("cd / && " + gputrain_binary() + want.substr(8) + " --quiet --threads 1 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(json_string(read_text(run + "/summary.json"), "exit_reason") == "completed");
}
