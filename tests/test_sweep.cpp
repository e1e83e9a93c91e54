// `gputrain sweep`: the plan (grid order, random draws for a seed, tags, bad specs), sweep.json, the early-stopping
// rules on constructed curves; and end to end on a tiny synthetic config: a 2×2 grid on 2 slots, a failing trial, a
// SIGTERM then --resume, early stopping, the Slurm script.
#include "core/error.h"
#include "core/json_read.h"
#include "helpers.h"
#include "train/sweep.h"

#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace gt::test;
namespace fs = std::filesystem;

namespace {

// Trials of a couple of seconds each (an evaluation every 50 steps), for the tests that act while trials run.
const char* kLonger = "--set data.samples=4096 --set train.log_every=50 --set train.eval_every=50 --set train.epochs=";

gt::SweepPlan grid_plan(const std::vector<std::string>& grid, const std::vector<std::string>& random = {},
                        int64_t draws = 0, uint64_t seed = 0) {
  std::vector<gt::SweepAxis> g, r;
  for (const auto& s : grid) g.push_back(gt::parse_grid_axis(s));
  for (const auto& s : random) r.push_back(gt::parse_random_axis(s));
  return gt::plan_sweep("x.yaml", {"train.max_steps=3"}, g, r, draws, seed);
}

std::vector<std::string> names(const gt::SweepPlan& p) {
  std::vector<std::string> out;
  for (const auto& t : p.trials) out.push_back(t.name);
  return out;
}

// The rows of a JSON-lines file, parsed.
std::vector<gt::JsonValue> json_rows(const std::string& path) {
  std::vector<gt::JsonValue> rows;
  for (const auto& l : lines_of(read_text(path))) rows.push_back(gt::json_read_object(l));
  return rows;
}

// How many times a run directory's training started: train.log gets one "gputrain VERSION: run NAME" line a start.
int starts_in(const std::string& run_dir) {
  int n = 0;
  for (const auto& l : lines_of(read_text(run_dir + "/train.log")))
    if (l.find("] gputrain ") != std::string::npos && l.find(": run tiny") != std::string::npos) ++n;
  return n;
}

// Each trial's status in sweep.json, in trial order.
std::vector<std::string> statuses(const std::string& sweep_json) {
  const auto [plan, states] = gt::read_sweep_json(read_text(sweep_json), sweep_json);
  std::vector<std::string> out;
  for (const auto& s : states) out.push_back(gt::trial_status_name(s.status));
  return out;
}

gt::Curve curve(std::initializer_list<double> values) {
  gt::Curve c;
  int64_t step = 0;
  for (double v : values) c.push_back({step += 10, v});
  return c;
}

}  // namespace

TEST_CASE("sweep plan: a grid is every combination, the first axis slowest, with tagged zero-padded names", "[cpu]") {
  const auto p = grid_plan({"optimizer.lr=0.1,0.01", "data.batch_size=16,32,[64]"});
  REQUIRE(p.trials.size() == 6);
  CHECK(names(p) ==
        std::vector<std::string>{"0-optimizer.lr=0.1,data.batch_size=16", "1-optimizer.lr=0.1,data.batch_size=32",
                                 "2-optimizer.lr=0.1,data.batch_size=_64_", "3-optimizer.lr=0.01,data.batch_size=16",
                                 "4-optimizer.lr=0.01,data.batch_size=32", "5-optimizer.lr=0.01,data.batch_size=_64_"});
  CHECK(p.trials[2].overrides() == std::vector<std::string>{"optimizer.lr=0.1", "data.batch_size=[64]"});
  CHECK(p.sets == std::vector<std::string>{"train.max_steps=3"});
  CHECK(fs::path(p.config).is_absolute());
  // Eleven trials or more: two digits, so the folders list in trial order.
  const auto wide = grid_plan({"seed=1,2,3,4,5,6,7,8,9,10,11,12"});
  CHECK(wide.trials.front().name == "00-seed=1");
  CHECK(wide.trials.back().name == "11-seed=12");
  // A flow list with commas stays one value.
  CHECK(gt::parse_grid_axis("model.layers[0].kernel=[3,3],[5,5]").values == std::vector<std::string>{"[3,3]", "[5,5]"});
}

TEST_CASE("sweep plan: random trials repeat for a seed and differ for another, within their ranges", "[cpu]") {
  const std::vector<std::string> axes{"optimizer.lr=1e-4:1e-1:log", "data.batch_size=8:64", "optimizer.type=sgd,adam",
                                      "train.grad_clip.max_norm=0.5:2"};
  const auto a = grid_plan({"seed=1,2"}, axes, 20, 7);
  const auto b = grid_plan({"seed=1,2"}, axes, 20, 7);
  const auto c = grid_plan({"seed=1,2"}, axes, 20, 8);
  REQUIRE(a.trials.size() == 40);
  CHECK(names(a) == names(b));
  CHECK(names(a) != names(c));
  std::set<std::string> lrs, types;
  for (const auto& t : a.trials) {
    REQUIRE(t.values.size() == 5);
    const double lr = std::stod(t.values[1].second);
    CHECK(lr >= 1e-4 * 0.999);
    CHECK(lr <= 1e-1 * 1.001);
    lrs.insert(t.values[1].second);
    const std::string& bs = t.values[2].second;  // integer ends: integer draws
    CHECK(bs.find_first_not_of("0123456789") == std::string::npos);
    CHECK(std::stoi(bs) >= 8);
    CHECK(std::stoi(bs) <= 64);
    types.insert(t.values[3].second);
    const double clip = std::stod(t.values[4].second);
    CHECK(clip >= 0.5);
    CHECK(clip <= 2);
  }
  CHECK(lrs.size() > 30);  // draws, not one value
  CHECK(types == std::set<std::string>{"sgd", "adam"});
  // Log-uniform: about as many draws per decade (a linear draw would put ~90 % in the top one).
  int below_1e3 = 0;
  for (const auto& t : a.trials) below_1e3 += std::stod(t.values[1].second) < 1e-3;
  CHECK(below_1e3 >= 4);
  CHECK(below_1e3 <= 24);
  // The grid point varies slowest; its draws follow.
  CHECK(a.trials[19].values[0].second == "1");
  CHECK(a.trials[20].values[0].second == "2");
}

TEST_CASE("sweep plan: tags are file names of bounded length", "[cpu]") {
  CHECK(gt::sweep_tag({{"data.train.path", "/data/a b.csv"}}) == "data.train.path=_data_a_b.csv");
  const std::string long_a(200, 'a');
  const std::string tag = gt::sweep_tag({{"name", long_a}});
  CHECK(tag.size() <= 96);
  CHECK(tag.find('~') == 87);
  CHECK(gt::sweep_tag({{"name", long_a + "b"}}) != tag);  // cut alike, told apart by the hash
}

TEST_CASE("sweep plan: bad specs are usage errors naming the flag", "[cpu]") {
  auto grid_error = [](const std::string& s) {
    try {
      gt::parse_grid_axis(s);
    } catch (const gt::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto random_error = [](const std::string& s) {
    try {
      gt::parse_random_axis(s);
    } catch (const gt::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(grid_error("optimizer.lr"), Catch::Contains("--grid \"optimizer.lr\": expected KEY=VALUES"));
  CHECK_THAT(grid_error("=1,2"), Catch::Contains("no key"));
  CHECK_THAT(grid_error("optimizer.lr="), Catch::Contains("no values"));
  CHECK_THAT(grid_error("optimizer.lr=0.1,,0.2"), Catch::Contains("an empty value"));
  CHECK_THAT(grid_error("optimizer.lr=0.1,0.1"), Catch::Contains("given twice"));
  CHECK_THAT(random_error("optimizer.lr=a:1"), Catch::Contains("\"a\" is not a finite number"));
  CHECK_THAT(random_error("optimizer.lr=1:0.1"), Catch::Contains("must be below"));
  CHECK_THAT(random_error("optimizer.lr=0:1:log"), Catch::Contains("above 0"));
  CHECK_THAT(random_error("optimizer.lr=0.1:1:exp"), Catch::Contains("is not \"log\""));
  CHECK_THAT(random_error("optimizer.type=sgd"), Catch::Contains("at least two values"));
  auto plan_error = [](const std::vector<std::string>& grid, const std::vector<std::string>& random, int64_t draws) {
    try {
      grid_plan(grid, random, draws);
    } catch (const gt::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(plan_error({}, {}, 0), Catch::Contains("nothing to sweep"));
  CHECK_THAT(plan_error({"seed=1,2"}, {}, 3), Catch::Contains("--trials N counts random draws"));
  CHECK_THAT(plan_error({}, {"optimizer.lr=0.1:1"}, 0), Catch::Contains("--random needs --trials"));
  CHECK_THAT(plan_error({"optimizer.lr=1,2", "+optimizer.lr=3,4"}, {}, 0), Catch::Contains("swept twice"));
  CHECK_THAT(plan_error({"seed=0,1,2,3,4,5,6,7,8,9", "optimizer.lr=0,1,2,3,4,5,6,7,8,9"}, {"x=0:1"}, 101),
             Catch::Contains("10100 trials; one sweep runs at most 10000"));
}

TEST_CASE("sweep.json round-trips the plan and the trials' states, and a hostile one is refused", "[cpu]") {
  const auto plan = grid_plan({"optimizer.lr=0.1,0.01"}, {"seed=0:1000"}, 2, 42);
  std::vector<gt::TrialState> states(plan.trials.size());
  states[1] = {gt::TrialStatus::stopped_early, 75, 1};
  states[2] = {gt::TrialStatus::failed, 4, 2};
  const std::string text = gt::sweep_json(plan, states);
  const auto [back, back_states] = gt::read_sweep_json(text, "s/sweep.json");
  CHECK(gt::sweep_json(back, back_states) == text);
  CHECK(back.seed == 42);
  CHECK(names(back) == names(plan));
  REQUIRE(back_states.size() == 4);
  CHECK(back_states[1].status == gt::TrialStatus::stopped_early);
  CHECK(back_states[2].exit_code == 4);
  CHECK(back_states[2].starts == 2);
  // A name that leads out of the sweep's folder, a cut file, another JSON: DataError naming the file.
  std::string escape = text;
  escape.replace(escape.find(plan.trials[0].name), plan.trials[0].name.size(), "../../etc");
  CHECK_THROWS_WITH(gt::read_sweep_json(escape, "s/sweep.json"), Catch::Contains("s/sweep.json: a trial name"));
  CHECK_THROWS_AS(gt::read_sweep_json(text.substr(0, text.size() / 2), "s/sweep.json"), gt::DataError);
  CHECK_THROWS_WITH(gt::read_sweep_json("{\"steps\": 3}", "s/sweep.json"), Catch::Contains("not a sweep.json"));
}

TEST_CASE("early stopping, median rule: the trial below the others' median at the same step stops", "[cpu]") {
  gt::EarlyStopParams p;
  p.rule = gt::EarlyStopRule::median;
  // Loss curves (lower is better): two good trials that went further, a bad one at its 3rd point.
  std::vector<gt::Curve> c{curve({1.0, 0.6, 0.4, 0.3, 0.2}), curve({1.0, 0.7, 0.5, 0.4}), curve({1.1, 1.05, 1.0})};
  CHECK(gt::median_rule_stops(c, 2, p));
  CHECK_FALSE(gt::median_rule_stops(c, 0, p));
  CHECK_FALSE(gt::median_rule_stops(c, 1, p));  // at its step 40 only one other trial has been there
  // The grace: at its first point a trial always goes on.
  std::vector<gt::Curve> early{c[0], c[1], curve({5.0})};
  CHECK_FALSE(gt::median_rule_stops(early, 2, p));
  // Fewer than min_others trials have reached the step: no judgement.
  std::vector<gt::Curve> alone{c[0], curve({1.1, 1.05, 1.0})};
  CHECK_FALSE(gt::median_rule_stops(alone, 1, p));
  p.min_others = 1;
  CHECK(gt::median_rule_stops(alone, 1, p));
  // Its best value counts, not its last: a trial that was good once is judged by that.
  p.min_others = 2;
  std::vector<gt::Curve> best{c[0], c[1], curve({1.0, 0.3, 0.9})};
  CHECK_FALSE(gt::median_rule_stops(best, 2, p));
  // Maximised metrics (accuracy): higher is better.
  p.maximize = true;
  std::vector<gt::Curve> acc{curve({0.5, 0.8, 0.9}), curve({0.5, 0.85, 0.9}), curve({0.3, 0.35, 0.4})};
  CHECK(gt::median_rule_stops(acc, 2, p));
  CHECK_FALSE(gt::median_rule_stops(acc, 0, p));
}

TEST_CASE("early stopping, successive halving: rungs at the 1st, 3rd, 9th point, and the bottom of a rung stops",
          "[cpu]") {
  gt::EarlyStopParams p;
  p.rule = gt::EarlyStopRule::asha;
  CHECK(gt::asha_rung(curve({}), p) == -1);
  CHECK(gt::asha_rung(curve({1}), p) == 0);
  CHECK(gt::asha_rung(curve({1, 1}), p) == 0);
  CHECK(gt::asha_rung(curve({1, 1, 1}), p) == 1);
  CHECK(gt::asha_rung(curve({1, 1, 1, 1, 1, 1, 1, 1, 1}), p) == 2);
  p.grace = 2;
  CHECK(gt::asha_rung(curve({1}), p) == -1);
  CHECK(gt::asha_rung(curve({1, 1, 1, 1, 1, 1}), p) == 1);
  p.grace = 1;
  // Fewer than eta (3) trials at a rung: every one goes on.
  std::vector<gt::Curve> two{curve({0.5, 0.4, 0.3}), curve({0.9, 0.8, 0.7})};
  CHECK_FALSE(gt::asha_stops(two, 1, 1, p));
  // Three at rung 1 (3rd point): only the top third goes on.
  std::vector<gt::Curve> three{curve({0.5, 0.4, 0.3, 0.2}), curve({0.9, 0.8, 0.7}), curve({0.6, 0.5, 0.4})};
  CHECK_FALSE(gt::asha_stops(three, 0, 1, p));
  CHECK(gt::asha_stops(three, 1, 1, p));
  CHECK(gt::asha_stops(three, 2, 1, p));
  // The value at the rung is the best up to the rung's point, not later ones (trial 0's 0.2 is after it).
  std::vector<gt::Curve> later{curve({0.5, 0.4, 0.35, 0.01}), curve({0.9, 0.8, 0.3}), curve({0.9, 0.8, 0.7})};
  CHECK(gt::asha_stops(later, 0, 1, p));
  CHECK_FALSE(gt::asha_stops(later, 1, 1, p));
}

TEST_CASE("early stopping reads the metric's rows of metrics.jsonl, skipping what does not parse", "[cpu]") {
  const std::string text =
      "{\"type\": \"train\", \"step\": 1, \"loss\": 2.5}\n"
      "{\"type\": \"eval\", \"step\": 10, \"test_loss\": 1.5, \"test_accuracy\": 0.5}\n"
      "garbage test_loss\n"
      "{\"type\": \"eval\", \"step\": 20, \"test_loss\": null}\n"
      "{\"type\": \"eval\", \"step\": 30, \"test_loss\": 1.25, \"test_acc";
  const gt::Curve c = gt::read_curve(text, "test_loss");
  REQUIRE(c.size() == 1);
  CHECK(c[0].step == 10);
  CHECK(c[0].value == 1.5);
  CHECK(gt::read_curve(text, "loss").size() == 1);
}

TEST_CASE("gputrain sweep: a 2x2 grid on 2 parallel slots writes the table, sorted by the metric", "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);
  const auto r =
      run_gputrain("sweep " + (dir / "tiny.yaml") +
                   " --grid optimizer.lr=0.01,0.1 --grid data.batch_size=16,32 --parallel 2 --out " + (dir / "s"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto csv = lines_of(read_text(dir / "s/sweep.csv"));
  REQUIRE(csv.size() == 5);
  CHECK(csv[0].rfind("run,data.batch_size,optimizer.lr,status,steps,", 0) == 0);
  // Each trial's row: its values and steps (256 samples in batches of 16 or 32), sorted by test_loss, lowest first.
  std::map<std::string, std::string> rows;
  for (size_t i = 1; i < csv.size(); ++i) rows[csv[i].substr(0, csv[i].find("\",") + 1)] = csv[i];
  CHECK(rows.at("\"0-optimizer.lr=0.01,data.batch_size=16\"").find(",16,0.01,completed,16,") != std::string::npos);
  CHECK(rows.at("\"1-optimizer.lr=0.01,data.batch_size=32\"").find(",32,0.01,completed,8,") != std::string::npos);
  CHECK(rows.at("\"2-optimizer.lr=0.1,data.batch_size=16\"").find(",16,0.1,completed,16,") != std::string::npos);
  CHECK(rows.at("\"3-optimizer.lr=0.1,data.batch_size=32\"").find(",32,0.1,completed,8,") != std::string::npos);
  const auto jsonl = json_rows(dir / "s/sweep.jsonl");
  REQUIRE(jsonl.size() == 4);
  for (size_t i = 1; i < jsonl.size(); ++i)
    CHECK(jsonl[i].find("test_loss")->number >= jsonl[i - 1].find("test_loss")->number);
  // The overrides each trial got are recorded in its run directory, and listed by `gputrain runs`.
  for (const auto& row : jsonl) {
    const std::string name = row.find("run")->string;
    const auto* o = row.find("overrides");
    REQUIRE(o);
    REQUIRE(o->items.size() == 2);
    CHECK(name.find(o->items[0].string) != std::string::npos);
    CHECK(fs::exists(dir / "s/" + name + "/overrides.json"));
  }
  CHECK_THAT(r.output, Catch::Contains("4 started, 4 completed"));
  // The table printed at the end is the one written.
  CHECK_THAT(r.output, Catch::Contains("0-optimizer.lr=0.01,data.batch_size=16"));
  // report.html: one scatter per swept key.
  const std::string html = read_text(dir / "s/report.html");
  CHECK_THAT(html, Catch::Contains("data-key=\"optimizer.lr\"") && Catch::Contains("data-key=\"data.batch_size\""));
  CHECK(html.find("<script") == std::string::npos);
  // And every trial's loss curve on one chart, coloured by the first swept key (its 4 trials: 4 lines).
  const size_t curves = html.find("data-tag=\"trial_loss\"");
  REQUIRE(curves != std::string::npos);
  const std::string svg = html.substr(curves, html.find("</svg>", curves) - curves);
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++lines;
  CHECK(lines == 4);
  CHECK_THAT(svg, Catch::Contains("colour: optimizer.lr from 0.01 (dark) to"));
  // Again into the same folder without --resume: refused, nothing started.
  const auto again = run_gputrain("sweep " + (dir / "tiny.yaml") + " --grid optimizer.lr=0.01 --out " + (dir / "s"));
  CHECK(again.exit_code == 2);
  CHECK_THAT(again.output, Catch::Contains("holds a sweep (sweep.json) already; --resume continues it"));
}

TEST_CASE("gputrain sweep: a failing trial is reported at once and the others finish, and a bad value starts nothing",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);
  // lr 1e30 is a valid config that fails at run time: the loss turns non-finite and train exits 4.
  const auto r = run_gputrain("sweep " + (dir / "tiny.yaml") +
                              " --set +train.nonfinite=abort --grid optimizer.lr=1e30,0.1,0.05 --out " + (dir / "s"));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("trial 0 (0-optimizer.lr=1e30) failed with exit code 4; the end of ") &&
                           Catch::Contains("training diverged"));
  CHECK(statuses(dir / "s/sweep.json") == std::vector<std::string>{"failed", "completed", "completed"});
  const auto jsonl = json_rows(dir / "s/sweep.jsonl");
  REQUIRE(jsonl.size() == 3);
  CHECK(jsonl.back().find("status")->string == "diverged");  // no test_loss: last
  // A trial that cannot even start (its folder cannot be written: a full disk) fails alone, reported; the next one
  // runs. (A file put where its folder goes is refused before anything starts: the sweep's folder is not new.)
  fs::create_directories(dir / "f");
  write_text(dir / "f/0-optimizer.lr=0.1", "not a folder");
  const auto foreign =
      run_gputrain("sweep " + (dir / "tiny.yaml") + " --grid optimizer.lr=0.1,0.05 --out " + (dir / "f"));
  CHECK(foreign.exit_code == 2);
  CHECK_THAT(foreign.output, Catch::Contains("holds files gputrain did not write (\"0-optimizer.lr=0.1\""));
  const auto blocked =
      run_gputrain("sweep " + (dir / "tiny.yaml") + " --grid optimizer.lr=0.1,0.05 --out " + (dir / "c"),
                   std::string("LD_PRELOAD=") + GT_FAULT_LIB +
                       " GT_FAULT_MATCH=0-optimizer.lr=0.1/gputrain-output.json GT_FAULT_ACTION=enospc");
  INFO(blocked.output);
  CHECK(blocked.exit_code == 1);
  CHECK_THAT(blocked.output, Catch::Contains("trial 0 (0-optimizer.lr=0.1) could not start: "));
  CHECK(statuses(dir / "c/sweep.json") == std::vector<std::string>{"failed", "completed"});
  // A value the config rejects: exit 2 naming the trial and the key, before any trial starts.
  const auto bad = run_gputrain("sweep " + (dir / "tiny.yaml") + " --grid optimizer.lr=0.1,abc --out " + (dir / "b"));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("trial 1 (1-optimizer.lr=abc): optimizer.lr"));
  CHECK_FALSE(fs::exists(dir / "b"));
  const auto flags = run_gputrain("sweep " + (dir / "tiny.yaml") + " --grid optimizer.lr=0.1 --mode best");
  CHECK(flags.exit_code == 2);
  CHECK_THAT(flags.output, Catch::Contains("--mode best: expected min or max"));
  CHECK(run_gputrain("sweep " + (dir / "tiny.yaml") + " --grid optimizer.lr=0.1 --devices 0 --parallel 2").exit_code ==
        2);
  CHECK(run_gputrain("sweep " + (dir / "tiny.yaml") + " --grid optimizer.lr=0.1 --devices 0,x").exit_code == 2);
}

TEST_CASE("gputrain sweep --devices: one trial per listed device at a time, each told only its own", "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);  // device: cpu, so it runs here; the variable is what a GPU trial sees
  const auto r = run_gputrain("sweep " + (dir / "tiny.yaml") +
                              " --grid optimizer.lr=0.1,0.05,0.02,0.01 --devices 3,5 --out " + (dir / "s"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto [plan, states] = gt::read_sweep_json(read_text(dir / "s/sweep.json"), "sweep.json");
  std::map<std::string, int> per_device;
  for (const auto& t : plan.trials) {
    const std::string head = lines_of(read_text(dir / "s/" + t.name + "/console.log")).at(0);
    INFO(head);
    const bool three = head.find(" CUDA_VISIBLE_DEVICES=3 ") != std::string::npos;
    const bool five = head.find(" CUDA_VISIBLE_DEVICES=5 ") != std::string::npos;
    CHECK(three != five);
    per_device[three ? "3" : "5"] += 1;
  }
  CHECK(per_device["3"] + per_device["5"] == 4);
  CHECK(per_device["3"] >= 1);
  CHECK(per_device["5"] >= 1);
}

TEST_CASE("gputrain sweep: SIGTERM stops the running trials with checkpoints, then --resume runs only what is missing",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);
  const std::string args = "sweep " + (dir / "tiny.yaml") + " " + kLonger +
                           "30 --grid optimizer.lr=0.01,0.02,0.03,0.04,0.05 --parallel 2 --out " + (dir / "s");
  const Background b = start_gputrain(args, dir / "sweep.log");
  // A second sweep in the folder while this one runs is refused (exit 1, naming the holder), and disturbs nothing.
  // Checked first, as soon as the sweep holds its folder: a process start takes seconds on a loaded machine, and
  // between the trials' progress below and the SIGTERM there must be no such wait, or the trials run out.
  REQUIRE(wait_for_file(dir / "s/sweep.json", 60));
  const auto twice = run_gputrain("sweep " + (dir / "tiny.yaml") + " --out " + (dir / "s") + " --resume");
  CHECK(twice.exit_code == 1);
  CHECK_THAT(twice.output, Catch::Contains("in use by another gputrain run (pid " + std::to_string(b.pid)));
  // Stop once a trial has completed and a later one is training (it has a metrics row).
  bool ready = false;
  for (int i = 0; i < 600 && !ready; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!fs::exists(dir / "s/sweep.json")) continue;
    const auto s = statuses(dir / "s/sweep.json");
    const auto [plan, states] = gt::read_sweep_json(read_text(dir / "s/sweep.json"), "sweep.json");
    bool completed = false, training = false;
    for (size_t t = 0; t < s.size(); ++t) {
      completed = completed || s[t] == "completed";
      training =
          training || (s[t] == "running" && t >= 2 && fs::exists(dir / "s/" + plan.trials[t].name + "/metrics.jsonl"));
    }
    ready = completed && training;
  }
  REQUIRE(ready);
  ::kill(b.pid, SIGTERM);
  const int code = wait_exit(b);
  INFO(read_text(b.log));
  REQUIRE(code == 75);
  const auto before = statuses(dir / "s/sweep.json");
  int interrupted = 0, pending = 0, completed = 0;
  for (const auto& s : before) {
    interrupted += s == "interrupted";
    pending += s == "pending";
    completed += s == "completed";
  }
  CHECK(interrupted >= 1);
  CHECK(pending >= 1);
  CHECK(completed >= 1);
  CHECK(interrupted + pending + completed == 5);

  // An interrupted trial with a checkpoint resumes from it; one stopped as it started (SIGTERM before its handlers
  // were in place, so nothing was written) starts again from nothing.
  std::vector<bool> had_checkpoint;
  {
    const auto [plan, states] = gt::read_sweep_json(read_text(dir / "s/sweep.json"), "sweep.json");
    for (const auto& t : plan.trials) had_checkpoint.push_back(fs::is_directory(dir / "s/" + t.name + "/checkpoints"));
  }
  const auto r = run_gputrain("sweep " + (dir / "tiny.yaml") + " --out " + (dir / "s") + " --resume");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output,
             Catch::Contains(fmt::format("{} started, {} completed", interrupted + pending, interrupted + pending)));
  const auto [plan, states] = gt::read_sweep_json(read_text(dir / "s/sweep.json"), "sweep.json");
  for (size_t t = 0; t < plan.trials.size(); ++t) {
    INFO(plan.trials[t].name << " was " << before[t]);
    const std::string run = dir / "s/" + plan.trials[t].name;
    CHECK(states[t].status == gt::TrialStatus::completed);
    // Counted from the trials' own logs: a completed trial ran once, an interrupted one twice when it resumed from
    // its checkpoint (so it still ends at 30 epochs of 128 steps) and once when it started again, a pending one once.
    CHECK(starts_in(run) == (before[t] == "interrupted" && had_checkpoint[t] ? 2 : 1));
    CHECK(json_number(read_text(run + "/summary.json"), "steps") == 30 * 128);
  }
}

TEST_CASE("gputrain sweep: early stopping stops the trial with a hopeless learning rate, and resume leaves it",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);
  for (const std::string rule : {"median", "asha"}) {
    INFO(rule);
    const std::string out = dir / rule;
    // Run one after another, so the good trials' curves are there when the hopeless one (lr 1e-5) is judged. 200
    // epochs (25,600 steps, over a second on a fast idle machine) so that the sweep's polls, every 0.2 s, find the
    // hopeless trial still running: at 20 epochs a fast machine finished it in 0.19 s, between two polls, and it
    // completed unjudged.
    const auto r = run_gputrain("sweep " + (dir / "tiny.yaml") + " " + kLonger +
                                "200 --grid optimizer.lr=0.05,0.1,0.00001 --early-stop " + rule + " --out " + out);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(statuses(out + "/sweep.json") == std::vector<std::string>{"completed", "completed", "stopped_early"});
    const auto jsonl = json_rows(out + "/sweep.jsonl");
    REQUIRE(jsonl.size() == 3);
    CHECK(jsonl.back().find("status")->string == "stopped_early");
    CHECK(jsonl.back().find("steps")->number < 200 * 128);
    // --resume restarts nothing: a trial stopped early is done.
    const auto again = run_gputrain("sweep " + (dir / "tiny.yaml") + " --out " + out + " --resume");
    CHECK(again.exit_code == 0);
    CHECK_THAT(again.output, Catch::Contains("0 started") && Catch::Contains("3 done before"));
  }
}

TEST_CASE("gputrain sweep --emit slurm: a job-array script that bash accepts, naming every trial", "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);
  const std::string args = "sweep " + (dir / "tiny.yaml") +
                           " --random optimizer.lr=1e-3:1:log --random 'optimizer.momentum=0,0.9' --trials 5 "
                           "--seed 11 --parallel 2 --emit slurm --out ";
  const auto r = run_gputrain(args + (dir / "a"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string script = dir / "a/sweep.sbatch";
  CHECK_THAT(r.output, Catch::Contains(script));
  CHECK(run_shell("bash -n " + script + " 2>&1").exit_code == 0);
  const std::string text = read_text(script);
  CHECK_THAT(text, Catch::Contains("#SBATCH --array=0-4%2"));
  const auto [plan, states] = gt::read_sweep_json(read_text(dir / "a/sweep.json"), "sweep.json");
  REQUIRE(plan.trials.size() == 5);
  for (const auto& t : plan.trials) CHECK_THAT(text, Catch::Contains("--out " + dir.path() + "/a/" + t.name));
  CHECK_FALSE(fs::exists(dir / ("a/" + plan.trials[0].name)));  // nothing ran
  // The same seed draws the same trials.
  REQUIRE(run_gputrain(args + (dir / "b")).exit_code == 0);
  const auto [plan_b, states_b] = gt::read_sweep_json(read_text(dir / "b/sweep.json"), "sweep.json");
  CHECK(names(plan_b) == names(plan));
}
