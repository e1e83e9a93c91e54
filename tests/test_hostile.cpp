// Hostile input that the malformed-case table cannot hold: sizes whose products overflow, values too large to
// check into the tree (a 10 MB CSV field, a config over 1 MiB), and files the test user cannot read.
#include "config/config.h"
#include "core/checked.h"
#include "core/limits.h"
#include "core/quote.h"
#include "core/shape.h"
#include "data/dataset.h"
#include "helpers.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;

TEST_CASE("checked size arithmetic reports overflow instead of wrapping", "[cpu]") {
  const int64_t big = int64_t{1} << 62;
  CHECK(checked_mul(big, 1) == big);
  CHECK_FALSE(checked_mul(big, 2).has_value());
  CHECK_FALSE(checked_mul(INT64_MAX, INT64_MAX).has_value());
  CHECK_FALSE(checked_mul(-1, 2).has_value());
  CHECK(checked_add(big, big - 1 + big) == std::nullopt);
  CHECK(checked_add(int64_t{3}, int64_t{4}) == 7);
  CHECK_THROWS_AS(mul_sizes(big, 4), SizeOverflow);
  // A shape whose element count wraps to 0 in 64 bits ((2^32)^2) must not report 0 (or anything) as its size.
  const Shape wraps{int64_t{1} << 32, int64_t{1} << 32};
  CHECK_FALSE(wraps.checked_numel().has_value());
  CHECK_THROWS_AS(wraps.numel(), SizeOverflow);
  CHECK(Shape{limits::kExtent.max, limits::kExtent.max}.numel() == int64_t{1} << 48);
}

TEST_CASE("values quoted into messages are escaped and cut", "[cpu]") {
  CHECK(quote_value("abc") == "\"abc\"");
  CHECK(quote_value(std::string("a\0b", 3)) == "\"a\\0b\"");
  CHECK(quote_value("a\nb\t\"c\"\x01") == "\"a\\nb\\t\\\"c\\\"\\x01\"");
  const std::string huge(10'000'000, 'z');
  const std::string q = quote_value(huge);
  CHECK(q.size() < 100);
  CHECK_THAT(q, Catch::StartsWith("\"zzzz") && Catch::EndsWith("…\" (10000000 bytes)"));
}

TEST_CASE("a 10 MB CSV field gives a short error line", "[data][cpu]") {
  TempDir dir;
  write_text(dir / "big.csv", "x1,x2,label\n1,2,0\n1," + std::string(10'000'000, 'q') + ",1\n");
  CsvSpec spec;
  try {
    read_csv(dir / "big.csv", spec);
    FAIL("a non-numeric field was accepted");
  } catch (const DataError& e) {
    const std::string what = e.what();
    CHECK(what.size() < 300);
    CHECK_THAT(what, Catch::Contains("big.csv:3: field 2 (\"qqqq") && Catch::Contains("(10000000 bytes)"));
  }
}

TEST_CASE("config files are read only up to 1 MiB", "[config][cpu]") {
  TempDir dir;
  // A comment fills the file: valid YAML, so only the size can refuse it.
  const std::string head = "name: big\n# ";
  write_text(dir / "big.yaml", head + std::string(static_cast<size_t>(limits::kConfigBytes) - head.size() + 1, 'x'));
  try {
    ConfigNode::load_file(dir / "big.yaml");
    FAIL("a config over 1 MiB was read");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("big.yaml: the config file is larger than 1048576 bytes (1 MiB)"));
  }
  // One byte less is read (the size bound is not off by one).
  write_text(dir / "ok.yaml", head + std::string(static_cast<size_t>(limits::kConfigBytes) - head.size(), 'x'));
  CHECK_NOTHROW(ConfigNode::load_file(dir / "ok.yaml"));
}

TEST_CASE("a data file the user cannot read says permission denied, not file not found", "[e2e]") {
  // Root reads any file whatever its mode; as root the command runs as nobody through setpriv, so the refusal
  // still happens. Without setpriv the case is skipped, and says so.
  std::string as_user;
  if (::geteuid() == 0) {
    if (run_shell("command -v setpriv >/dev/null && echo yes").output.find("yes") == std::string::npos) {
      WARN("skipped: running as root without setpriv, where file permissions do not refuse reads");
      return;
    }
    as_user = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
  }
  TempDir dir;
  ::chmod(dir.path().c_str(), 0755);  // the unprivileged user reads the config in it
  write_text(dir / "locked.csv", "x1,x2,label\n0.5,1.0,0\n-0.5,2.0,1\n");
  ::chmod((dir / "locked.csv").c_str(), 0);
  write_text(dir / "exp.yaml", "device: cpu\ndata: {format: csv, train: {path: " + (dir / "locked.csv") +
                                   "}, batch_size: 1}\nmodel: {layers: [{type: linear, out_features: 2}]}\n"
                                   "optimizer: {type: sgd, lr: 0.1}\n");
  ::chmod((dir / "exp.yaml").c_str(), 0644);
  const CommandResult r = run_shell(as_user + gputrain_binary() + " check " + (dir / "exp.yaml") + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("data.train.path: cannot read " + (dir / "locked.csv") + ": Permission denied"));
}

TEST_CASE("an NPY input truncated while a run maps it ends the run with exit 1 naming it, not Bus error", "[e2e]") {
  TempDir dir;
  const int64_t n = 100000, features = 16;
  std::vector<float> x(static_cast<size_t>(n * features));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) / 97.0f;
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>(i % 3);
  write_npy(dir / "x.npy", "<f4", fmt::format("({}, {})", n, features), x.data(), x.size() * 4);
  write_npy(dir / "y.npy", "<i8", fmt::format("({},)", n), y.data(), y.size() * 8);
  write_text(dir / "c.yaml", "name: npy\nseed: 1\ndevice: cpu\ndata:\n  format: npy\n  train: {inputs: " +
                                 (dir / "x.npy") + ", targets: " + (dir / "y.npy") +
                                 "}\n  batch_size: 64\nmodel: {layers: [{type: linear, out_features: 3}]}\n"
                                 "loss: cross_entropy\noptimizer: {type: sgd, lr: 0.01}\ntrain: {epochs: 50}\n"
                                 "checkpoint: {every_steps: 50}\n");
  const std::string run = dir / "run";
  const Background b =
      start_gputrain("train " + (dir / "c.yaml") + " --threads 1 --no-progress --out " + run, dir / "log");
  REQUIRE(wait_for_file(run + "/checkpoints/latest", 60));
  ::truncate((dir / "x.npy").c_str(), 4096);
  const int code = wait_exit(b);
  const std::string log = read_text(dir / "log");
  INFO(log);
  CHECK(code == 1);
  CHECK_THAT(log, Catch::Contains("error: " + (dir / "x.npy") + ": the file was cut short while this run read it"));
}
