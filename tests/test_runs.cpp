// `gputrain runs`: three tiny runs that differ in one --set, compared as a table, CSV and JSON lines; sorting;
// corrupt and missing files; usage errors.
#include "core/json_read.h"
#include "helpers.h"

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

using namespace gt::test;
namespace fs = std::filesystem;

namespace {

// The cells of a `runs` text table: its header and its rows, split at runs of spaces.
std::vector<std::vector<std::string>> table_cells(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& line : lines_of(out)) {
    std::vector<std::string> cells;
    size_t i = 0;
    while (i < line.size()) {
      const size_t start = line.find_first_not_of(' ', i);
      if (start == std::string::npos) break;
      const size_t end = line.find(' ', start);
      cells.push_back(line.substr(start, end == std::string::npos ? std::string::npos : end - start));
      i = end == std::string::npos ? line.size() : end;
    }
    rows.push_back(cells);
  }
  return rows;
}

size_t column_of(const std::vector<std::string>& header, const std::string& name) {
  for (size_t i = 0; i < header.size(); ++i)
    if (header[i] == name) return i;
  FAIL("no column " << name);
  return 0;
}

}  // namespace

TEST_CASE("gputrain runs compares run directories: differing overrides, status, metrics, sort, CSV, JSON", "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);
  // Three runs that differ in the learning rate: a and b stop after 3 and 2 of 8 steps, c runs its epoch of 16
  // steps of a smaller batch.
  const std::map<std::string, std::string> lrs{{"a", "0.3"}, {"b", "1e-2"}, {"c", "0.1"}};
  const std::map<std::string, std::string> extra{
      {"a", "--max-steps 3"}, {"b", "--max-steps 2"}, {"c", "--set data.batch_size=16"}};
  for (const auto& [name, lr] : lrs) {
    const auto r = run_gputrain("train " + (dir / "tiny.yaml") + " --quiet --threads 1 " + extra.at(name) +
                                " --set optimizer.lr=" + lr + " --out " + (dir / "sweep/" + name));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  fs::create_directories(dir / "sweep/not-a-run");  // ignored: nothing of a run in it

  const auto text = run_gputrain("runs " + (dir / "sweep"));
  INFO(text.output);
  REQUIRE(text.exit_code == 0);
  const auto cells = table_cells(text.output);
  REQUIRE(cells.size() == 4);
  const auto& header = cells[0];
  // Only what differs between the runs: the batch size, the learning rate and max_steps (with the epochs --max-steps
  // lifts), not the layers or the seed.
  CHECK(header == std::vector<std::string>{"run", "data.batch_size", "optimizer.lr", "train.epochs", "train.max_steps",
                                           "status", "steps", "wall_s", "final_train_loss", "test_loss",
                                           "test_accuracy", "samples_per_sec"});
  const size_t lr = column_of(header, "optimizer.lr"), status = column_of(header, "status"),
               steps = column_of(header, "steps");
  CHECK(cells[1][0] == "a");
  CHECK(cells[2][0] == "b");
  CHECK(cells[3][0] == "c");
  CHECK(cells[1][lr] == "0.3");  // config.resolved.yaml's 0.29999999999999999, shortened
  CHECK(cells[2][lr] == "0.01");
  CHECK(cells[1][steps] == "3");
  CHECK(cells[2][steps] == "2");
  CHECK(cells[3][steps] == "16");
  CHECK(cells[1][status] == "max_steps");
  CHECK(cells[2][status] == "max_steps");
  CHECK(cells[3][status] == "completed");

  // --sort: numbers by value (as text "16" would come before "2"), --desc reverses.
  auto order = [&](const std::string& flags) {
    const auto t = table_cells(run_gputrain("runs " + (dir / "sweep") + " " + flags).output);
    std::vector<std::string> names;
    for (size_t i = 1; i < t.size(); ++i) names.push_back(t[i][0]);
    return names;
  };
  CHECK(order("--sort steps") == std::vector<std::string>{"b", "a", "c"});
  CHECK(order("--sort steps --desc") == std::vector<std::string>{"c", "a", "b"});
  CHECK(order("--sort optimizer.lr --desc") == std::vector<std::string>{"a", "c", "b"});
  CHECK(order("--sort status") == std::vector<std::string>{"c", "a", "b"});  // text; equal ones keep their order

  // JSON lines: one object per run, numbers as numbers; and the test loss sort agrees with them.
  const auto json = run_gputrain("runs " + (dir / "sweep") + " --json --sort test_loss");
  REQUIRE(json.exit_code == 0);
  const auto lines = lines_of(json.output);
  REQUIRE(lines.size() == 3);
  double last_loss = -1;
  std::map<std::string, double> test_loss;
  for (const auto& l : lines) {
    INFO(l);
    const gt::JsonValue o = gt::json_read_object(l);
    const std::string name = o.find("run")->string;
    CHECK(o.find("dir")->string == dir / "sweep/" + name);
    CHECK(o.find("optimizer.lr")->number == std::stod(lrs.at(name)));
    // overrides.json, written by train: the --set values and the flags that stand for one, as given.
    REQUIRE(o.find("overrides"));
    REQUIRE(o.find("overrides")->is_array());
    std::vector<std::string> overrides;
    for (const auto& v : o.find("overrides")->items) overrides.push_back(v.string);
    CHECK(overrides == (name == "c" ? std::vector<std::string>{"data.batch_size=16", "optimizer.lr=" + lrs.at(name)}
                                    : std::vector<std::string>{"optimizer.lr=" + lrs.at(name), "train.epochs=1048576",
                                                               "train.max_steps=" + extra.at(name).substr(12)}));
    CHECK(o.find("status")->string == (name == "c" ? "completed" : "max_steps"));
    CHECK(o.find("steps")->integer == (name == "a" ? 3 : name == "b" ? 2 : 16));
    const gt::JsonValue* loss = o.find("test_loss");
    REQUIRE(loss->is_number());
    CHECK(loss->number >= last_loss);
    last_loss = loss->number;
    test_loss[name] = loss->number;
  }

  // CSV: a header and a row per run, numbers in full.
  const auto csv = run_gputrain("runs " + (dir / "sweep") + " --csv --sort steps");
  REQUIRE(csv.exit_code == 0);
  const auto csv_lines = lines_of(csv.output);
  REQUIRE(csv_lines.size() == 4);
  CHECK(csv_lines[0].rfind(
            "run,data.batch_size,optimizer.lr,train.epochs,train.max_steps,status,steps,wall_s,final_train_loss,", 0) ==
        0);
  CHECK(csv_lines[1].rfind("b,32,0.01,1048576,2,max_steps,2,", 0) == 0);
  CHECK(csv_lines[3].rfind("c,16,0.1,1,0,completed,16,", 0) == 0);
  auto csv_field = [&](size_t line, size_t column) {
    std::stringstream in(csv_lines[line]);
    std::string field;
    for (size_t i = 0; i <= column; ++i) std::getline(in, field, ',');
    return field;
  };
  for (size_t i = 1; i < 4; ++i) CHECK(std::stod(csv_field(i, 9)) == test_loss[csv_field(i, 0)]);  // in full

  // A run dir given itself is one row (no column differs); runs/<name>/<time>/ is found one level down.
  const auto one = table_cells(run_gputrain("runs " + (dir / "sweep/a")).output);
  REQUIRE(one.size() == 2);
  CHECK(one[0][1] == "status");
  CHECK(one[1][0] == "a");
  const auto nested = run_gputrain("runs " + dir.path());
  CHECK(nested.exit_code == 0);
  CHECK_THAT(nested.output, Catch::Contains("sweep/a") && Catch::Contains("sweep/c"));
  CHECK(table_cells(run_gputrain("runs " + (dir / "sweep") + " " + (dir / "sweep/a/")).output).size() == 4);

  // A half-written summary.json is listed as unreadable, last when sorting by a metric, and the rest still show;
  // a run with no summary and no process (killed) is "failed" with the steps its metrics reached.
  write_text(dir / "sweep/c/summary.json", "{\"name\": \"tiny\", \"steps\": 3, \"test_lo");
  fs::remove(dir / "sweep/a/summary.json");
  const auto hostile = run_gputrain("runs " + (dir / "sweep") + " --sort test_loss");
  INFO(hostile.output);
  REQUIRE(hostile.exit_code == 0);
  CHECK_THAT(hostile.output, Catch::Contains(dir / "sweep/c: summary.json: "));  // a warning says what is wrong
  std::vector<std::vector<std::string>> rows;
  for (const auto& row : table_cells(hostile.output))
    if (row.size() > 3 && (row[0] == "a" || row[0] == "b" || row[0] == "c")) rows.push_back(row);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0][0] == "b");  // the only one with a test loss
  CHECK(rows[0][status] == "max_steps");
  std::map<std::string, std::vector<std::string>> by_name;
  for (const auto& row : rows) by_name[row[0]] = row;
  CHECK(by_name["c"][status] == "unreadable");
  CHECK(by_name["c"][steps] == "-");
  CHECK(by_name["a"][status] == "failed");
  CHECK(by_name["a"][steps] == "3");  // from metrics.jsonl's last train row
}

TEST_CASE("gputrain runs lists a run whose summary.json is a directory or a FIFO as unreadable, not failed", "[e2e]") {
  // "failed" says the run ended without writing summary.json; here one is there, but not a file that can be read.
  TempDir dir;
  for (const std::string name : {"dir", "fifo", "killed"}) {
    fs::create_directories(dir / ("runs/" + name));
    write_text(dir / ("runs/" + name + "/metrics.jsonl"),
               "{\"type\": \"train\", \"step\": 3, \"loss\": 0.5, \"elapsed_s\": 1}\n");
  }
  fs::create_directories(dir / "runs/dir/summary.json");
  REQUIRE(mkfifo((dir / "runs/fifo/summary.json").c_str(), 0600) == 0);  // (a FIFO would block a plain open)
  const auto r = run_gputrain("runs " + (dir / "runs") + " --csv");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains(dir / "runs/dir: summary.json: not a regular file (a directory)"));
  CHECK_THAT(r.output, Catch::Contains(dir / "runs/fifo: summary.json: not a regular file (a FIFO)"));
  std::map<std::string, std::string> status;
  for (const auto& line : lines_of(r.output)) {
    const size_t comma = line.find(',');
    if (comma != std::string::npos)
      status[line.substr(0, comma)] = line.substr(comma + 1, line.find(',', comma + 1) - comma - 1);
  }
  CHECK(status["dir"] == "unreadable");
  CHECK(status["fifo"] == "unreadable");
  CHECK(status["killed"] == "failed");  // no summary.json at all
}

TEST_CASE("gputrain runs folds runs of different models into one model column", "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);
  REQUIRE(run_gputrain("train " + (dir / "tiny.yaml") + " --quiet --max-steps 1 --out " + (dir / "r/a")).exit_code ==
          0);
  REQUIRE(run_gputrain("train " + (dir / "tiny.yaml") +
                       " --quiet --max-steps 1 --set model.layers[0].out_features=32 '+model.layers[3]=relu' --out " +
                       (dir / "r/b"))
              .exit_code == 0);
  const auto r = run_gputrain("runs " + (dir / "r") + " --csv");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto lines = lines_of(r.output);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].rfind("run,model,status,", 0) == 0);  // no model.layers[...] column
  CHECK(lines[0].find("model.layers") == std::string::npos);
  CHECK(std::regex_search(lines[1], std::regex("^a,[0-9a-f]{8} \\(3 layers\\),")));
  CHECK(std::regex_search(lines[2], std::regex("^b,[0-9a-f]{8} \\(4 layers\\),")));
}

TEST_CASE("gputrain runs: no run is exit 1, usage errors are exit 2", "[e2e]") {
  TempDir dir;
  fs::create_directories(dir / "empty/sub");
  const auto none = run_gputrain("runs " + (dir / "empty") + "");
  CHECK(none.exit_code == 1);
  CHECK_THAT(none.output, Catch::Contains("no run directories in"));
  const auto missing = run_gputrain("runs " + (dir / "nope") + "");
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.output, Catch::Contains("no such folder"));
  CHECK(run_gputrain("runs " + (dir / "empty") + " --json --csv").exit_code == 2);
  CHECK(run_gputrain("runs").exit_code == 2);
  fs::create_directories(dir / "r");
  write_text(dir / "r/summary.json", "{\"steps\": 5, \"test_loss\": 0.5, \"exit_reason\": \"completed\"}\n");
  // Settings in summary.json show only where they differ: threads does here, world_size does not.
  for (const auto& [name, threads] : std::map<std::string, int>{{"x", 1}, {"y", 2}}) {
    fs::create_directories(dir / "two/" + name);
    write_text(dir / "two/" + name + "/summary.json",
               "{\"world_size\": 1, \"threads\": " + std::to_string(threads) + ", \"exit_reason\": \"completed\"}\n");
  }
  const auto two = run_gputrain("runs " + (dir / "two") + " --csv");
  CHECK(lines_of(two.output) ==
        std::vector<std::string>{"run,status,steps,wall_s,threads", "x,completed,,,1", "y,completed,,,2"});
  const auto bad_sort = run_gputrain("runs " + (dir / "r") + " --sort test_los");
  CHECK(bad_sort.exit_code == 2);
  CHECK_THAT(bad_sort.output, Catch::Contains("--sort test_los: no such column (did you mean \"test_loss\"?)"));
}

TEST_CASE("gputrain runs tells a running run from one interrupted", "[e2e]") {
  TempDir dir;
  write_text(dir / "long.yaml", std::string(kTinyConfig) + "checkpoint: {every_epochs: 0}\n");
  const std::string run = dir / "runs/long";
  const Background b = start_gputrain(
      "train " + (dir / "long.yaml") + " --quiet --threads 1 --epochs 1000000 --out " + run, dir / "log");
  REQUIRE(wait_for_file(run + "/metrics.jsonl", 60));
  const auto going = run_gputrain("runs " + (dir / "runs") + " --json");
  INFO(going.output);
  CHECK(going.exit_code == 0);
  CHECK(gt::json_read_object(going.output).find("status")->string == "running");
  kill(b.pid, SIGTERM);
  REQUIRE(wait_exit(b) == 75);
  const auto stopped = run_gputrain("runs " + (dir / "runs") + " --json");
  INFO(stopped.output);
  const gt::JsonValue o = gt::json_read_object(stopped.output);
  CHECK(o.find("status")->string == "interrupted");
  CHECK(o.find("steps")->integer.value_or(0) > 0);
}
