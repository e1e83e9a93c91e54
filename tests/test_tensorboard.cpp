// TensorBoard event files: the CRC-32C and TFRecord framing by themselves, then a run's events file read back by
// TensorBoard's own reader (tests/tools/read_tb.py) and compared with metrics.jsonl, number by number.
#include "helpers.h"
#include "log/metrics.h"
#include "log/tensorboard.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <tuple>

using namespace gt::test;
namespace fs = std::filesystem;

namespace {

// The interpreter that scripts/setup.sh installs tensorboard into: $GT_PYTHON, else the first python3 on PATH.
std::string python() {
  const char* p = std::getenv("GT_PYTHON");
  return p && *p ? p : "python3";
}

std::vector<std::string> events_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path().string());
  return out;
}

const std::string kTbConfig =
    "name: tb\nseed: 3\ndevice: cpu\n" +
    synthetic_mlp({.samples = 960, .test_samples = 256, .features = 12, .classes = 3, .batch = 32, .hidden = 16}) +
    R"(optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
scheduler: {type: cosine}
train: {epochs: 2, log_every: 100, eval_every: 10}
logging: {every_steps: 4}
)";

}  // namespace

TEST_CASE("crc32c gives the standard check value and TFRecord's masked form", "[cpu]") {
  const char* check = "123456789";
  CHECK(gt::crc32c(check, 9) == 0xE3069283u);
  CHECK(gt::crc32c("", 0) == 0u);
  // The mask: rotate right by 15, add 0xa282ead8 (modulo 2^32).
  const uint32_t c = 0xE3069283u;
  CHECK(gt::masked_crc32c(check, 9) == static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xA282EAD8u));
  CHECK(gt::masked_crc32c(check, 9) == 0xC78AB0E5u);  // the same formula evaluated apart, in Python
  // 32 zero bytes: the iSCSI test vector of RFC 3720 (B.4).
  const std::string zeros(32, '\0');
  CHECK(gt::crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
}

TEST_CASE("a TFRecord frame is length, masked CRC of the length, data, masked CRC of the data", "[cpu]") {
  const std::string data = "brain.Event:2";
  const std::string rec = gt::tfrecord_frame(data);
  REQUIRE(rec.size() == 8 + 4 + data.size() + 4);
  uint64_t len = 0;
  uint32_t len_crc = 0, data_crc = 0;
  std::memcpy(&len, rec.data(), 8);
  std::memcpy(&len_crc, rec.data() + 8, 4);
  std::memcpy(&data_crc, rec.data() + 12 + data.size(), 4);
  CHECK(len == data.size());
  CHECK(len_crc == gt::masked_crc32c(rec.data(), 8));
  CHECK(rec.substr(12, data.size()) == data);
  CHECK(data_crc == gt::masked_crc32c(data.data(), data.size()));
}

TEST_CASE("the metrics sink maps train and eval fields to TensorBoard tags", "[cpu]") {
  CHECK(gt::tensorboard_tag("train", "loss") == "train/loss");
  CHECK(gt::tensorboard_tag("train", "samples_per_sec") == "train/samples_per_sec");
  CHECK(gt::tensorboard_tag("train", "data_wait_ms") == "train/data_wait_ms");
  CHECK(gt::tensorboard_tag("train", "loss_scale") == "train/loss_scale");  // fp16 runs (train.loss_scale)
  CHECK(gt::tensorboard_tag("train", "overflow_skips") == "train/overflow_skips");
  CHECK(gt::tensorboard_tag("train", "device_peak_mib") == "train/device_peak_mib");
  CHECK(gt::tensorboard_tag("train", "step").empty());
  CHECK(gt::tensorboard_tag("train", "elapsed_s").empty());
  CHECK(gt::tensorboard_tag("eval", "test_loss") == "test/loss");
  CHECK(gt::tensorboard_tag("eval", "test_accuracy") == "test/accuracy");
  CHECK(gt::tensorboard_tag("skip", "step").empty());
  CHECK(gt::tensorboard_tag("train", "gpu0_util") == "gpu0/util");
  CHECK(gt::tensorboard_tag("train", "host_rss_mib") == "host/rss_mib");
  // Other ranks' readings in rank 0's rows.
  CHECK(gt::tensorboard_tag("train", "rank1_host_rss_mib") == "rank1/host/rss_mib");
  CHECK(gt::tensorboard_tag("train", "rank12_gpu3_util") == "rank12/gpu3/util");
  CHECK(gt::tensorboard_tag("train", "rank1_loss").empty());
  CHECK(gt::tensorboard_tag("train", "rankx_host_rss_mib").empty());
}

namespace {

// Reads RUN_DIR's events with TensorBoard's reader and checks that they hold exactly the scalars of metrics.jsonl.
void check_events_match_metrics(const std::string& run_dir, int want_train_rows, int want_eval_rows) {
  const std::string py = python();
  const auto probe = run_shell(py + " -c 'import tensorboard' 2>&1");
  if (probe.exit_code != 0)
    FAIL(fmt::format("{} cannot import tensorboard: run scripts/setup.sh (it installs the reader)\n{}", py,
                     probe.output));

  // metrics.jsonl → the (tag, step) → value it implies.
  std::map<std::pair<std::string, int64_t>, double> want;
  int train_rows = 0, eval_rows = 0;
  for (const auto& line : lines_of(read_text(run_dir + "/metrics.jsonl"))) {
    const auto type = json_string(line, "type");
    const auto step = static_cast<int64_t>(*json_number(line, "step"));
    if (type == "train") {
      ++train_rows;
      for (const char* f : {"loss", "lr", "grad_norm", "samples_per_sec", "data_wait_ms"})
        want[{std::string("train/") + f, step}] = *json_number(line, f);
      // The sampler's host fields, once it has a sample (null values are not plotted).
      for (const char* f : {"rss_mib", "cpu_pct", "threads"})
        if (const auto v = json_number(line, std::string("host_") + f)) want[{std::string("host/") + f, step}] = *v;
    } else if (type == "eval") {
      ++eval_rows;
      want[{"test/loss", step}] = *json_number(line, "test_loss");
      want[{"test/accuracy", step}] = *json_number(line, "test_accuracy");
    }
  }
  CHECK(train_rows == want_train_rows);
  CHECK(eval_rows == want_eval_rows);

  const auto tb = run_shell(py + " " + source_path("tests/tools/read_tb.py") + " " + run_dir + " 2>&1");
  INFO(tb.output);
  REQUIRE(tb.exit_code == 0);
  std::map<std::pair<std::string, int64_t>, double> got;
  for (const auto& line : lines_of(tb.output)) {
    if (line[0] != '{') continue;  // TensorBoard's own log lines (its purge after a restart says so)
    const auto tag = json_string(line, "tag");
    REQUIRE(tag);
    const auto key = std::make_pair(*tag, static_cast<int64_t>(*json_number(line, "step")));
    CHECK(got.count(key) == 0);  // each scalar once
    got[key] = *json_number(line, "value");
    CHECK(*json_number(line, "wall_time") > 1.6e9);  // seconds since 1970, not a step or zero
  }
  CHECK(got.size() == want.size());
  for (const auto& [key, v] : want) {
    INFO(key.first << " at step " << key.second);
    REQUIRE(got.count(key) == 1);
    // simple_value is a float: the file holds the JSON number rounded to 24 bits of mantissa.
    CHECK(got[key] == Approx(v).epsilon(1e-6).margin(1e-30));
  }
}

}  // namespace

TEST_CASE("TensorBoard's reader finds every scalar of metrics.jsonl in the events file", "[e2e]") {
  TempDir dir;
  write_text(dir / "tb.yaml", kTbConfig);
  const auto r = run_gputrain("train " + (dir / "tb.yaml") + " --out " + (dir / "run") + " --threads 2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(events_files(dir / "run").size() == 1);
  // logging.every_steps 4 overrides train.log_every 100: 2 epochs × 30 steps, a row every 4 steps (60 is one);
  // evaluations at steps 10, 20, …, 60.
  check_events_match_metrics(dir / "run", 60 / 4, 6);
}

TEST_CASE("a resumed run's events replace what the first start logged after the checkpoint", "[e2e]") {
  TempDir dir;
  write_text(dir / "tb.yaml", kTbConfig);
  const std::string base = "train " + (dir / "tb.yaml") + " --threads 2 --max-steps 20 --set checkpoint.every_steps=8";
  auto r = run_gputrain(base + " --out " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // Back to step 8: steps 9-20 run again, and their rows (12, 16, 20; evaluation at 10, 20) are logged twice.
  r = run_gputrain(base + " --resume " + (dir / "run/checkpoints/step-8"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(events_files(dir / "run").size() >= 1);
  check_events_match_metrics(dir / "run", 5, 2);
}

TEST_CASE("logging: jsonl and tensorboard switch their files off, and level quiets the console", "[e2e]") {
  TempDir dir;
  write_text(dir / "tb.yaml", kTbConfig);
  const std::string base = "train " + (dir / "tb.yaml") + " --threads 2 --max-steps 8";
  auto r = run_gputrain(base + " --out " + (dir / "no_tb") + " --set logging.tensorboard=false");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(events_files(dir / "no_tb").empty());
  CHECK(fs::exists(dir / "no_tb/metrics.jsonl"));

  r = run_gputrain(base + " --out " + (dir / "no_jsonl") + " --set logging.jsonl=false --set logging.level=warn");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(events_files(dir / "no_jsonl").size() == 1);
  CHECK(!fs::exists(dir / "no_jsonl/metrics.jsonl"));
  CHECK(r.output.find("step 8/8") == std::string::npos);  // info lines are gone with level warn
  CHECK(read_text(dir / "no_jsonl/config.resolved.yaml").find("level: warn") != std::string::npos);
}
