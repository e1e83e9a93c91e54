// train.init_from: a new run starts from another run's weights, a checkpoint's or an llm.c file's, renamed, partly
// kept fresh, matched strictly or not; a resume of such a run never reads them again.
#include "core/error.h"
#include "graph/model.h"
#include "helpers.h"
#include "io/llmc.h"
#include "io/safetensors.h"
#include "llmc_cases.h"
#include "train/experiment.h"
#include "train/init_from.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;
namespace fs = std::filesystem;

namespace {

using Weights = std::map<std::string, std::vector<float>>;

// A safetensors file's f32 tensors by name.
Weights weights_of(const std::string& path) {
  Weights out;
  for (const auto& [name, t] : read_safetensors(path))
    out[name] = std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
  return out;
}

// A run of kTinyConfig into `out` with `sets`. Its learning rate is 1e-30 unless a set says otherwise: an SGD step
// then moves no weight by a bit (|w| ≫ 1e-30 · |g|), so the final weights are the weights the run started from.
CommandResult tiny_run(const TempDir& dir, const std::string& out, const std::string& sets,
                       const std::string& lr = "1e-30") {
  return run_gputrain(fmt::format("train {} --quiet --threads 2 --out {} --set optimizer.lr={} {}", dir / "t.yaml",
                                  dir / out, lr, sets));
}

// The source every case starts from: kTinyConfig trained for one epoch (weights far from their initialisation).
void train_source(const TempDir& dir) {
  write_text(dir / "t.yaml", kTinyConfig);
  const auto r = tiny_run(dir, "src", "--set checkpoint.every_steps=4", "0.1");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

}  // namespace

TEST_CASE("init_from starts a new run at a safetensors file's, a run's or a checkpoint's weights, bit for bit",
          "[e2e]") {
  TempDir dir;
  train_source(dir);
  const Weights trained = weights_of(dir / "src/model.safetensors");
  const Weights at4 = weights_of(dir / "src/checkpoints/step-4/model.safetensors");
  REQUIRE(trained != at4);
  // The fresh model of the same seed differs from both: a run that ignored init_from would be caught.
  REQUIRE(tiny_run(dir, "fresh", "").exit_code == 0);
  REQUIRE(weights_of(dir / "fresh/model.safetensors") != trained);
  fs::copy_file(dir / "src/model.safetensors", dir / "w.safetensors");
  const std::vector<std::pair<std::string, const Weights*>> sources = {
      {dir / "w.safetensors", &trained},
      {dir / "src", &trained},  // a run directory: its final weights
      {dir / "src/checkpoints/step-4", &at4},
      {dir / "src/checkpoints/step-4/model.safetensors", &at4},
  };
  for (size_t i = 0; i < sources.size(); ++i) {
    INFO(sources[i].first);
    const std::string out = fmt::format("run{}", i);
    const auto r = tiny_run(dir, out, "--set +train.init_from=" + sources[i].first);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(weights_of(dir / (out + "/model.safetensors")) == *sources[i].second);
    // The fresh schedule and step count: the run's own 8 steps, from step 1.
    CHECK(json_number(read_text(dir / (out + "/summary.json")), "steps") == 8);
    const std::string summary = read_text(dir / (out + "/summary.json"));
    CHECK(json_string(summary, "init_fnv1a").value_or("").size() == 8);
    CHECK_THAT(json_string(summary, "init_from").value_or(""), Catch::EndsWith(".safetensors"));
  }
  // A path relative to where gputrain runs is kept absolute in the run's config, so that the run directory works as a
  // CONFIG from any folder.
  const auto rel =
      run_shell(fmt::format("cd {} && {} train t.yaml --quiet --threads 2 --out rel --set optimizer.lr=1e-30 "
                            "--set +train.init_from=w.safetensors 2>&1",
                            std::string(dir / ""), gputrain_binary()));
  INFO(rel.output);
  REQUIRE(rel.exit_code == 0);
  CHECK_THAT(read_text(dir / "rel/config.resolved.yaml"), Catch::Contains("init_from: " + (dir / "w.safetensors")));
  // Two ranks (worker threads): rank 0 picks the file, both load it, and they start together from its weights.
  const auto ranks = tiny_run(dir, "ranks", "--set +train.init_from=" + (dir / "src") + " --set 'device=[cpu, cpu]'");
  INFO(ranks.output);
  REQUIRE(ranks.exit_code == 0);
  CHECK(weights_of(dir / "ranks/model.safetensors") == trained);
  // A run directory without final weights: its newest checkpoint that verifies (step-8, the epoch's end).
  fs::copy(dir / "src", dir / "cut", fs::copy_options::recursive);
  fs::remove(dir / "cut/model.safetensors");
  const auto r = tiny_run(dir, "from_cut", "--set +train.init_from=" + (dir / "cut"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(weights_of(dir / "from_cut/model.safetensors") == weights_of(dir / "cut/checkpoints/step-8/model.safetensors"));
  CHECK_THAT(json_string(read_text(dir / "from_cut/summary.json"), "init_from").value_or(""),
             Catch::Contains("checkpoints/step-8/model.safetensors"));
}

TEST_CASE("init_map renames, init_strict false lists missing and unexpected once, init_skip keeps a new head fresh",
          "[e2e]") {
  TempDir dir;
  train_source(dir);
  const Weights src = weights_of(dir / "src/model.safetensors");
  const std::string named = " --set model.layers[0].name=enc --set model.layers[2].name=head";
  const std::string map = " --set '+train.init_map={layers.0.: enc.}'";
  SECTION("strict: the run stops naming every missing and unexpected tensor") {
    const auto r = tiny_run(dir, "strict", "--set +train.init_from=" + (dir / "src") + named + map);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("missing from the file: head.weight, head.bias") &&
                             Catch::Contains("not in the model: layers.2.weight, layers.2.bias") &&
                             Catch::Contains("train.init_from"));
    CHECK_FALSE(fs::exists(dir / "strict"));
  }
  SECTION("not strict: the renamed tensors load, the rest is listed, one line each kind") {
    const auto r =
        run_gputrain(fmt::format("train {} --threads 2 --out {} --set optimizer.lr=1e-30 --set "
                                 "+train.init_from={} --set +train.init_strict=false{}{}",
                                 dir / "t.yaml", dir / "loose", dir / "src", named, map));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const std::string log = read_text(dir / "loose/train.log");
    std::vector<std::string> init_lines;
    for (const std::string& l : lines_of(log))
      if (l.find("init_from") != std::string::npos) init_lines.push_back(l);
    REQUIRE(init_lines.size() == 3);  // loaded, missing, unexpected
    CHECK_THAT(init_lines[0], Catch::Contains("2 tensors loaded"));
    CHECK_THAT(init_lines[1], Catch::EndsWith("missing from the file, fresh: head.weight, head.bias"));
    CHECK_THAT(init_lines[2], Catch::EndsWith("in the file, not in the model: layers.2.weight, layers.2.bias"));
    const Weights w = weights_of(dir / "loose/model.safetensors");
    CHECK(w.at("enc.weight") == src.at("layers.0.weight"));
    CHECK(w.at("enc.bias") == src.at("layers.0.bias"));
    CHECK(w.at("head.weight") != src.at("layers.2.weight"));
  }
  SECTION("a head of another shape stops the run with one line naming both shapes, unless init_skip keeps it") {
    const std::string five = " --set model.layers[2].out_features=5 --set data.targets.classes=5";
    const auto r = tiny_run(dir, "shape", "--set +train.init_from=" + (dir / "src") + five);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    int lines = 0;
    for (const std::string& l : lines_of(r.output))
      if (l.find("layers.2.weight") != std::string::npos) {
        ++lines;
        CHECK_THAT(l, Catch::Contains("f32 [3, 16] in") && Catch::Contains("f32 [5, 16] in the model"));
      }
    CHECK(lines == 1);
    // A pattern that matches no tensor (the head is layers.2, relu at layers.1 has none) is refused, naming them.
    const auto typo = tiny_run(
        dir, "typo", "--set +train.init_from=" + (dir / "src") + five + " --set '+train.init_skip=[layers.1.*]'");
    CHECK(typo.exit_code == 2);
    CHECK_THAT(typo.output,
               Catch::Contains("init_skip: layers.1.* matches none of the model's tensors (layers.0.weight"));
    // init_skip: the head is the fresh run's (same seed, no init_from), the rest the source's.
    REQUIRE(tiny_run(dir, "fresh5", five).exit_code == 0);
    const auto s = tiny_run(
        dir, "skip", "--set +train.init_from=" + (dir / "src") + five + " --set '+train.init_skip=[layers.2.*]'");
    INFO(s.output);
    REQUIRE(s.exit_code == 0);
    const Weights w = weights_of(dir / "skip/model.safetensors"), fresh = weights_of(dir / "fresh5/model.safetensors");
    CHECK(w.at("layers.2.weight") == fresh.at("layers.2.weight"));
    CHECK(w.at("layers.2.bias") == fresh.at("layers.2.bias"));
    CHECK(w.at("layers.0.weight") == src.at("layers.0.weight"));
    CHECK(w.at("layers.0.bias") == src.at("layers.0.bias"));
    CHECK(w.at("layers.0.weight") != fresh.at("layers.0.weight"));
  }
}

TEST_CASE("a run started with init_from resumes bit-exact with its source deleted", "[e2e]") {
  TempDir dir;
  train_source(dir);
  fs::copy_file(dir / "src/model.safetensors", dir / "w.safetensors");
  const std::string sets =
      "--set train.epochs=2 --set checkpoint.every_steps=5 --set checkpoint.keep=100 "
      "--set +train.init_from=" +
      (dir / "w.safetensors");
  const auto full = tiny_run(dir, "full", sets, "0.05");
  INFO(full.output);
  REQUIRE(full.exit_code == 0);
  fs::copy(dir / "full", dir / "cut", fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(dir / "cut/checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0 && e.path().filename() != "step-5")
      fs::remove_all(e.path());
  write_text(dir / "cut/checkpoints/latest", "step-5\n");
  fs::remove(dir / "cut/model.safetensors");
  fs::remove(dir / "cut/summary.json");
  fs::remove(dir / "w.safetensors");
  const auto r =
      run_gputrain(fmt::format("train {} --quiet --threads 2 --resume auto --out {} --set optimizer.lr=0.05 {}",
                               dir / "t.yaml", dir / "cut", sets));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(read_text(dir / "cut/model.safetensors") == read_text(dir / "full/model.safetensors"));
  CHECK(metrics_without_timing(dir / "cut") == metrics_without_timing(dir / "full"));
  // summary.json still names the weights the run started from.
  const std::string a = read_text(dir / "cut/summary.json"), b = read_text(dir / "full/summary.json");
  CHECK(json_string(a, "init_from") == json_string(b, "init_from"));
  CHECK(json_string(a, "init_fnv1a") == json_string(b, "init_fnv1a"));
  CHECK(json_string(a, "init_from").has_value());
}

TEST_CASE("init_from reads an llm.c checkpoint, its tied head one tensor with the token table", "[e2e]") {
  TempDir dir;
  const LlmcHeader h = tiny_llmc(3);
  write_llmc(dir / "orig.bin", random_checkpoint(h, 5));
  // llm.c's file as `gputrain export llmc` writes it, from the folder `import llmc` made of another one.
  const auto imp = run_gputrain("import llmc " + (dir / "orig.bin") + " --out " + (dir / "imported"));
  INFO(imp.output);
  REQUIRE(imp.exit_code == 0);
  const auto exp_r = run_gputrain("export llmc " + (dir / "imported/config.yaml") + " --checkpoint " +
                                  (dir / "imported") + " --out " + (dir / "gpt.bin"));
  INFO(exp_r.output);
  REQUIRE(exp_r.exit_code == 0);
  const ConfigNode cfg = ConfigNode::load_string(llmc_model_yaml(h), "model.yaml");
  auto build = [&] { return Model::build(parse_model_spec(cfg), Shape{8}, DType::f32, Device::cpu(), 0); };
  Experiment exp;
  exp.train.init_from = dir / "gpt.bin";
  const std::vector<std::pair<std::string, Tensor>> expected = llmc_to_named(read_llmc(dir / "gpt.bin"));
  auto values = [](const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); };
  SECTION("every tensor loads") {
    Model m = build();
    const InitWeights init = load_init_weights(exp, init_weights_file(exp), m);
    CHECK(init.fnv1a.size() == 8);
    CHECK(init.missing.empty());
    CHECK(init.unexpected.empty());
    std::map<std::string, Tensor*> model;
    for (auto& [name, t] : m.state_tensors()) model[name] = t;
    REQUIRE(model.size() == expected.size());
    for (const auto& [name, t] : expected) {
      INFO(name);
      REQUIRE(model.count(name));
      CHECK(values(*model[name]) == values(t));
    }
  }
  SECTION("an import llmc folder: its model.safetensors") {
    exp.train.init_from = dir / "imported";
    Model m = build();
    const InitWeights init = load_init_weights(exp, init_weights_file(exp), m);
    CHECK(init.file == dir / "imported/model.safetensors");
    std::map<std::string, Tensor*> model;
    for (auto& [name, t] : m.state_tensors()) model[name] = t;
    for (const auto& [name, t] : expected) CHECK(values(*model[name]) == values(t));
  }
  SECTION("init_skip of the tied head keeps the token table fresh too") {
    exp.train.init_skip = {"lm_head.*"};
    Model m = build(), fresh = build();
    const InitWeights init = load_init_weights(exp, init_weights_file(exp), m);
    CHECK(init.skipped == std::vector<std::string>{"wte.weight"});
    std::map<std::string, Tensor*> loaded, before;
    for (auto& [name, t] : m.state_tensors()) loaded[name] = t;
    for (auto& [name, t] : fresh.state_tensors()) before[name] = t;
    CHECK(values(*loaded["wte.weight"]) == values(*before["wte.weight"]));
    for (const auto& [name, t] : expected)
      if (name == "wpe.weight") CHECK(values(*loaded[name]) == values(t));  // the rest still loads
  }
}

TEST_CASE("check finds init_from's weights as train does, and a missing path is exit 2 at the key", "[e2e]") {
  TempDir dir;
  train_source(dir);
  const auto ok = run_gputrain(fmt::format("check {} --set +train.init_from={}", dir / "t.yaml", dir / "src"));
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  const auto missing = run_gputrain(fmt::format("check {} --set +train.init_from={}", dir / "t.yaml", dir / "gone"));
  INFO(missing.output);
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.output, Catch::Contains("train.init_from") && Catch::Contains("gone: no such file or folder"));
  // A run directory with nothing that verifies is refused by check as by train, not found out when the run starts.
  fs::create_directories(dir / "empty_run");
  const auto empty = run_gputrain(fmt::format("check {} --set +train.init_from={}", dir / "t.yaml", dir / "empty_run"));
  INFO(empty.output);
  CHECK(empty.exit_code != 0);
  const auto train_empty = tiny_run(dir, "from_empty", "--set +train.init_from=" + (dir / "empty_run"));
  CHECK(train_empty.exit_code == empty.exit_code);
}
