// Config validation: each class of error names the key path and the YAML line and column; --set overrides.
#include "core/json_read.h"
#include "graph/model.h"
#include "ops/devices.h"
#include "train/config_schema.h"
#include "train/experiment.h"
#include "train/loss.h"
#include "train/setup.h"

#include "helpers.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

using namespace gt;
using namespace gt::test;

namespace {

const char* kBase = R"(name: t
seed: 3
data:
  format: synthetic
  samples: 64
  input_shape: [4]
  targets: {classes: 3}
  batch_size: 16
model:
  layers:
    - {type: linear, out_features: 8}
    - relu
    - {type: linear, out_features: 3}
loss: cross_entropy
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 1}
)";

std::string with(const std::string& from, const std::string& to) {
  std::string s = kBase;
  const size_t at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

// What `gputrain check` does: parse, load data, build the model, fit the loss.
void validate(const ConfigNode& root) {
  const Experiment exp = parse_experiment(root);
  const LoadedData data = load_data(exp);
  const Model model = Model::build(exp.model, data.train.input_shape(), DType::f32, Device::cpu(), exp.seed);
  check_loss_fits(exp.loss, model.output_shape(), data.train, exp.at.loss);
}

void validate(const std::string& yaml) { validate(ConfigNode::load_string(yaml, "t.yaml")); }

// "(t.yaml:L:C)" for the first occurrence of `needle` in the text.
std::string position_of(const std::string& yaml, const std::string& needle) {
  std::istringstream in(yaml);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t col = line.find(needle);
    if (col != std::string::npos) return "(t.yaml:" + std::to_string(n) + ":" + std::to_string(col + 1) + ")";
  }
  FAIL("needle not found");
  return "";
}

std::string error_of(const std::string& yaml) {
  try {
    validate(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError for:\n" << yaml);
  return "";
}

}  // namespace

TEST_CASE("the base config is valid", "[config][cpu]") { CHECK_NOTHROW(validate(kBase)); }

TEST_CASE("config errors name the key path and the YAML position", "[config][cpu]") {
  SECTION("wrong type, with the path through a list") {
    const auto y = with("out_features: 8", "out_features: abc");
    CHECK(error_of(y) ==
          "model.layers[0].out_features: expected a positive integer, got \"abc\" " + position_of(y, "abc"));
  }
  SECTION("unknown key with did-you-mean and the valid keys") {
    const auto y = with("optimizer:", "optimiser:");
    const auto e = error_of(y);
    CHECK_THAT(e, Catch::StartsWith("optimiser: unknown key (did you mean \"optimizer\"?)"));
    CHECK_THAT(e, Catch::Contains("valid keys: name, seed, device") && Catch::EndsWith(position_of(y, "optimiser")));
  }
  SECTION("unknown layer argument") {
    const auto y = with("out_features: 8", "out_feature: 8");
    CHECK_THAT(error_of(y),
               Catch::StartsWith("model.layers[0].out_feature: unknown key (did you mean \"out_features\"?)"));
  }
  SECTION("unknown layer type lists the known ones") {
    const auto y = with("- relu", "- rleu");
    CHECK_THAT(error_of(y),
               Catch::StartsWith("model.layers[1]: unknown layer type \"rleu\" (did you mean \"relu\"?)") &&
                   Catch::Contains("known types: add, avgpool2d, batchnorm1d") &&
                   Catch::EndsWith(position_of(y, "rleu")));
  }
  SECTION("a bare layer name for a layer that needs arguments") {
    const auto y = with("- relu", "- linear");
    CHECK_THAT(error_of(y), Catch::StartsWith("model.layers[1]: layer linear needs `out_features`"));
  }
  SECTION("out of range") {
    const auto y = with("lr: 0.1", "lr: -1");
    CHECK(error_of(y) == "optimizer.lr: expected a number > 0, got -1 " + position_of(y, "-1"));
  }
  SECTION("a list where a number belongs") {
    const auto y = with("batch_size: 16", "batch_size: [16]");
    CHECK_THAT(error_of(y), Catch::StartsWith("data.batch_size: expected a positive integer, got a list"));
  }
  SECTION("missing required key points at its parent") {
    const auto y = with("{type: sgd, lr: 0.1}", "{type: sgd}");
    CHECK(error_of(y) == "optimizer.lr: is required " + position_of(y, "{type: sgd}"));
  }
  SECTION("unknown choice") {
    const auto y = with("loss: cross_entropy", "loss: crossentropy");
    CHECK_THAT(error_of(y),
               Catch::StartsWith("loss: unknown value \"crossentropy\" (did you mean \"cross_entropy\"?)"));
  }
  SECTION("unknown device") {
    const auto y = with("seed: 3", "seed: 3\ndevice: gpu");
    CHECK_THAT(error_of(y), Catch::StartsWith("device: unknown device \"gpu\""));
  }
  SECTION("missing data file") {
    const auto y = with("  format: synthetic\n  samples: 64\n  input_shape: [4]\n  targets: {classes: 3}\n",
                        "  format: idx\n  train: {images: /nonexistent/img.gz, labels: /nonexistent/lbl.gz}\n");
    CHECK(error_of(y) ==
          "data.train.images: file not found: /nonexistent/img.gz " + position_of(y, "/nonexistent/img"));
  }
  SECTION("model output that does not fit the classes") {
    const auto y = with("out_features: 3}", "out_features: 7}");
    CHECK_THAT(error_of(y),
               Catch::StartsWith("loss: cross_entropy over 3 classes needs a model output of [3], got [7]"));
  }
  SECTION("mse on class labels") {
    const auto y = with("loss: cross_entropy", "loss: mse");
    CHECK_THAT(error_of(y), Catch::StartsWith("loss: mse needs numeric targets"));
  }
  SECTION("nesterov without momentum") {
    const auto y = with("lr: 0.1}", "lr: 0.1, nesterov: true}");
    CHECK_THAT(error_of(y), Catch::StartsWith("optimizer.nesterov: Nesterov momentum needs momentum > 0"));
  }
  SECTION("invalid YAML syntax") {
    const auto y = with("train: {epochs: 1}", "train: {epochs: 1");
    CHECK_THAT(error_of(y), Catch::StartsWith("t.yaml:") && Catch::Contains("invalid YAML"));
  }
  SECTION("empty layer list") {
    const auto y =
        with("  layers:\n    - {type: linear, out_features: 8}\n    - relu\n    - {type: linear, out_features: 3}\n",
             "  layers: []\n");
    CHECK_THAT(error_of(y), Catch::StartsWith("model.layers: expected a non-empty list of layers"));
  }
}

TEST_CASE("graph errors name the layer", "[config][cpu]") {
  auto layers = [](const std::string& list) {
    return with("  layers:\n    - {type: linear, out_features: 8}\n    - relu\n    - {type: linear, out_features: 3}\n",
                "  layers:\n" + list);
  };
  SECTION("a cycle") {
    const auto y = layers(
        "    - {type: linear, name: a, out_features: 4, inputs: b}\n"
        "    - {type: linear, name: b, out_features: 4, inputs: a}\n"
        "    - {type: linear, out_features: 3, inputs: b}\n");
    CHECK_THAT(error_of(y), Catch::StartsWith("model.layers[0]: the layers form a cycle: a → b → a"));
  }
  SECTION("an unknown input name") {
    const auto y = layers(
        "    - {type: linear, name: first, out_features: 3}\n"
        "    - {type: add, inputs: [first, frist]}\n");
    CHECK_THAT(error_of(y),
               Catch::StartsWith("model.layers[1].inputs: no layer is named \"frist\" (did you mean \"first\"?)") &&
                   Catch::EndsWith(position_of(y, "[first, frist]")));
  }
  SECTION("a duplicate name") {
    const auto y = layers("    - {type: linear, name: a, out_features: 3}\n    - {type: relu, name: a}\n");
    CHECK_THAT(error_of(y),
               Catch::StartsWith("model.layers[1].name: the name \"a\" is already used by model.layers[0]"));
  }
  SECTION("add over shapes that differ") {
    const auto y = layers(
        "    - {type: linear, name: a, out_features: 3}\n"
        "    - {type: linear, name: b, out_features: 4, inputs: input}\n"
        "    - {type: add, inputs: [a, b]}\n");
    CHECK_THAT(error_of(y), Catch::StartsWith("model.layers[2]: add needs inputs of one shape, got [3] and [4]"));
  }
  SECTION("an output nobody uses") {
    const auto y = layers(
        "    - {type: linear, name: lost, out_features: 5}\n"
        "    - {type: linear, out_features: 3, inputs: input}\n");
    CHECK_THAT(error_of(y), Catch::StartsWith("model.layers[0]: the output of \"lost\" is never used"));
  }
  SECTION("too few inputs") {
    const auto y = layers("    - {type: linear, out_features: 3}\n    - {type: add}\n");
    CHECK_THAT(error_of(y), Catch::StartsWith("model.layers[1]: add takes 2 or more inputs, got 1"));
  }
  SECTION("a valid residual graph builds and prints its edges") {
    const auto y = layers(
        "    - {type: linear, name: a, out_features: 3}\n"
        "    - {type: relu, name: r}\n"
        "    - {type: add, name: res, inputs: [a, r]}\n");
    validate(y);
    const Model m = Model::build(parse_model_spec(ConfigNode::load_string(y, "t.yaml")["model"]), Shape{4}, DType::f32,
                                 Device::cpu(), 1);
    CHECK_THAT(m.summary_table(2), Catch::Contains("res ← a + r"));
  }
}

TEST_CASE("model: is parsed with the experiment, into layers wired by position, and errors at load", "[config][cpu]") {
  // A wiring error is the experiment's, before data or model are touched: as for any other section.
  const std::string bad = with("    - relu\n", "    - {type: relu, inputs: nowhere}\n");
  CHECK_THROWS_WITH(parse_experiment(ConfigNode::load_string(bad, "t.yaml")),
                    Catch::StartsWith("model.layers[1].inputs: no layer is named \"nowhere\"") &&
                        Catch::EndsWith(position_of(bad, "nowhere")));
  const std::string y =
      with("    - {type: linear, out_features: 8}\n    - relu\n    - {type: linear, out_features: 3}\n",
           "    - {type: linear, name: a, out_features: 3}\n    - {type: relu, name: r}\n"
           "    - {type: add, name: res, inputs: [r, a]}\n");
  const Experiment exp = parse_experiment(ConfigNode::load_string(y, "t.yaml"));
  const ModelSpec& spec = exp.model;
  REQUIRE(spec.layers.size() == 3);
  CHECK(spec.layers[2].name == "res");
  CHECK(spec.layers[2].type == "add");
  CHECK(spec.layers[0].inputs == std::vector<int>{-1});
  CHECK(spec.layers[2].inputs == std::vector<int>{1, 0});
  CHECK(spec.order == std::vector<int>{0, 1, 2});
  CHECK(spec.users[0] == std::vector<int>{1, 2});
  CHECK(spec.where.path() == "model.layers");
  // What later checks fail on carries its key path: a missing key names its section's position.
  CHECK(exp.at.batch_size.path() == "data.batch_size");
  CHECK(exp.at.loss.path() == "loss");
  CHECK_THAT(exp.at.cuda_graphs.where(), Catch::Equals(position_of(y, "{epochs: 1}")));
  const Experiment no_loss = parse_experiment(ConfigNode::load_string(with("loss: cross_entropy\n", ""), "t.yaml"));
  CHECK(no_loss.at.loss.path() == "model.layers");
}

TEST_CASE("config overrides (--set) reach nested keys and list items", "[config][cpu]") {
  const ConfigNode base = ConfigNode::load_string(kBase, "t.yaml");
  SECTION("nested key") {
    const Experiment e = parse_experiment(apply_override(base, "optimizer.lr=0.5"));
    CHECK(e.optimizer.lr == 0.5);
  }
  SECTION("a new key in an existing map") {
    const Experiment e = parse_experiment(apply_override(base, "optimizer.momentum=0.9"));
    CHECK(e.optimizer.momentum == 0.9);
  }
  SECTION("list index") {
    const ConfigNode root = apply_override(base, "model.layers[0].out_features=11");
    const Model m = Model::build(parse_model_spec(root["model"]), Shape{4}, DType::f32, Device::cpu(), 1);
    CHECK(m.nodes()[0].out_shape == Shape{11});
  }
  SECTION("replace a whole list item with a flow map") {
    const ConfigNode root = apply_override(base, "model.layers[1]={type: linear, out_features: 5}");
    const Model m = Model::build(parse_model_spec(root["model"]), Shape{4}, DType::f32, Device::cpu(), 1);
    CHECK(m.nodes()[1].type == "linear");
  }
  SECTION("a path that does not exist names it") {
    CHECK_THROWS_WITH(apply_override(base, "optimizer.foo.bar=1"),
                      Catch::Contains("the config has no key optimizer.foo"));
    // A section the file leaves out is created by a --set into it; what goes in is validated as usual.
    const ConfigNode with_section = apply_override(base, "checkpoint.every_steps=5");
    CHECK(with_section["checkpoint"]["every_steps"].as_int() == 5);
    CHECK_THROWS_WITH(parse_experiment(apply_override(base, "chekpoint.every_steps=5")),
                      Catch::Contains("did you mean \"checkpoint\""));
    CHECK_THROWS_WITH(apply_override(base, "model.layers[9].out_features=1"),
                      Catch::Contains("model.layers has no item [9] (it has 3)"));
    CHECK_THROWS_WITH(apply_override(base, "nothing"), Catch::Contains("expected KEY=VALUE"));
    CHECK_THROWS_WITH(apply_override(base, "model.layers[x]=1"), Catch::Contains("not a non-negative integer"));
    // An index past size_t threw std::out_of_range from std::stoul, which main does not catch as a config error.
    CHECK_THROWS_AS(apply_override(base, "model.layers[99999999999999999999]=1"), ConfigError);
    CHECK_THROWS_WITH(apply_override(base, "model.layers[99999999999999999999]=1"),
                      Catch::Contains("list index 99999999999999999999 is out of range"));
  }
  SECTION("a NUL byte (YAML \"\\0\") does not end a number early") {
    CHECK_THROWS_WITH(validate(apply_override(base, "optimizer.lr=\"0.5\\0junk\"")),
                      Catch::Contains("optimizer.lr: expected a finite number"));
    // A fresh base: apply_override writes into the YAML tree it is given.
    CHECK_THROWS_WITH(validate(apply_override(ConfigNode::load_string(kBase, "t.yaml"), "train.epochs=\"2\\0\"")),
                      Catch::Contains("train.epochs: expected a positive integer"));
  }
  SECTION("a bad value set on the command line points at the --set") {
    const ConfigNode root = apply_override(base, "model.layers[0].out_features=abc");
    CHECK_THROWS_WITH(validate(root),
                      "model.layers[0].out_features: expected a positive integer, got \"abc\" "
                      "(--set model.layers[0].out_features=abc)");
  }
}

TEST_CASE("config overrides: +key adds a key the config lacks, ~key removes one, ++key sets either way",
          "[config][cpu]") {
  // A fresh base per override: apply_override writes into the YAML tree it is given.
  auto base = [] { return ConfigNode::load_string(kBase, "t.yaml"); };
  SECTION("a plain key=value on a missing path says how to add it") {
    CHECK_THROWS_WITH(apply_override(base(), "train.grad_clip.max_norm=1"),
                      "--set train.grad_clip.max_norm=1: the config has no key train.grad_clip; write "
                      "+train.grad_clip.max_norm=1 to add it");
    CHECK_THROWS_WITH(apply_override(base(), "model.layers[3]={type: relu}"),
                      Catch::Contains("model.layers has no item [3]; write +model.layers[3]={type: relu} to append"));
  }
  SECTION("+ adds the key and the maps on the way; the result is validated as usual") {
    CHECK(parse_experiment(apply_override(base(), "+train.grad_clip.max_norm=0.5")).train.grad_clip == 0.5);
    CHECK(parse_experiment(apply_override(base(), "+optimizer.momentum=0.9")).optimizer.momentum == 0.9);
    // A key it adds that the schema does not know fails validation, pointing at the --set.
    CHECK_THROWS_WITH(parse_experiment(apply_override(base(), "+optimizer.momentun=0.9")),
                      Catch::Contains("did you mean \"momentum\"") &&
                          Catch::Contains("(--set +optimizer.momentun=0.9)"));
  }
  SECTION("+ refuses a key that is there, + past a list's end appends") {
    CHECK_THROWS_WITH(apply_override(base(), "+optimizer.lr=0.5"),
                      "--set +optimizer.lr=0.5: optimizer.lr is already set (to \"0.1\"); write optimizer.lr=0.5 to "
                      "replace it");
    const ConfigNode root = apply_override(base(), "+model.layers[3]={type: linear, out_features: 2}");
    const Model m = Model::build(parse_model_spec(root["model"]), Shape{4}, DType::f32, Device::cpu(), 1);
    REQUIRE(m.nodes().size() == 4);
    CHECK(m.output_shape() == Shape{2});
    CHECK_THROWS_WITH(apply_override(base(), "+model.layers[5]=relu"), Catch::Contains("has no item [5] (it has 3)"));
  }
  SECTION("messages name the latest --set that covers the key, and a map + made names the +") {
    CHECK_THROWS_WITH(validate(apply_override(base(), "+model.layers[0].x.y=1")),
                      Catch::Contains("model.layers[0].x: unknown key") &&
                          Catch::Contains("(--set +model.layers[0].x.y=1)"));
    const ConfigNode two = apply_override(apply_override(base(), "+checkpoint.every_steps=5"), "checkpoint.keep=abc");
    CHECK_THROWS_WITH(parse_experiment(two),
                      Catch::Contains("checkpoint.keep") && Catch::Contains("(--set checkpoint.keep=abc)"));
    const ConfigNode replaced =
        apply_override(apply_override(base(), "optimizer.lr=0.5"), "optimizer={type: sgd, lr: abc}");
    CHECK_THROWS_WITH(parse_experiment(replaced), Catch::Contains("(--set optimizer={type: sgd, lr: abc})"));
  }
  SECTION("++ sets a key whether or not it is there") {
    CHECK(parse_experiment(apply_override(base(), "++optimizer.lr=0.5")).optimizer.lr == 0.5);
    CHECK(parse_experiment(apply_override(base(), "++train.grad_clip.max_norm=2")).train.grad_clip == 2);
  }
  SECTION("~ removes a key or a list item; a missing one or another value is an error") {
    const ConfigNode no_opt = apply_override(base(), "~optimizer");
    CHECK_FALSE(no_opt.has("optimizer"));
    CHECK_THROWS_WITH(parse_experiment(no_opt), Catch::Contains("optimizer") && Catch::Contains("(--set ~optimizer)"));
    CHECK_FALSE(apply_override(base(), "~optimizer.lr=0.1")["optimizer"].has("lr"));
    CHECK_THROWS_WITH(apply_override(base(), "~optimizer.lr=0.2"),
                      "--set ~optimizer.lr=0.2: optimizer.lr is \"0.1\", not \"0.2\"; write ~optimizer.lr to remove it "
                      "whatever it is");
    CHECK_THROWS_WITH(apply_override(base(), "~optimizer.nesterov"),
                      "--set ~optimizer.nesterov: the config has no key optimizer.nesterov; nothing to remove");
    CHECK_THROWS_WITH(apply_override(base(), "~train.grad_clip.max_norm"),
                      Catch::Contains("the config has no key train.grad_clip") && !Catch::Contains("write +"));
    const ConfigNode two = apply_override(base(), "~model.layers[1]");
    REQUIRE(two["model"]["layers"].size() == 2);
    CHECK(two["model"]["layers"].at(1)["out_features"].as_int() == 3);  // the last layer moved up
    CHECK_THROWS_WITH(apply_override(base(), "~model.layers[3]"), Catch::Contains("has no item [3]"));
    CHECK_THROWS_WITH(apply_override(base(), "~"), Catch::Contains("empty key path"));
  }
}

TEST_CASE("the resolved config reads back to itself: each section's YAML writer matches its parser", "[config][cpu]") {
  // config.resolved.yaml is what `--resume` compares and what a run can be repeated from, so every mode and every
  // data format must come back from it unchanged.
  auto resolved = [](const ConfigNode& root) {
    const Experiment e = parse_experiment(root);
    YAML::Emitter em;
    em << resolved_config(e, root["model"]["layers"].yaml());
    return std::string(em.c_str());
  };
  TempDir dir;
  write_text(dir / "d.csv", "x,y,label\n1,2,0\n3,4,1\n");
  const std::string csv = "data={format: csv, train: {path: " + (dir / "d.csv") + "}, label: label, header: true}";
  const std::vector<std::string> sets{"scheduler={type: constant}",
                                      "scheduler={type: step, step_size: 2, warmup_steps: 3}",
                                      "scheduler={type: multistep, milestones: [2, 5]}",
                                      "scheduler={type: exponential, gamma: 0.9}",
                                      "scheduler={type: cosine, t_max: 4}",
                                      "scheduler={type: linear, total_iters: 3}",
                                      "scheduler={type: onecycle, max_lr: 1}",
                                      "optimizer={type: adam, lr: 0.01}",
                                      "optimizer={type: adamw, lr: 0.01, amsgrad: true}",
                                      "loss=mse",
                                      "loss={type: cross_entropy, label_smoothing: 0.1}",
                                      "train.nonfinite=skip",
                                      "train.nonfinite=rollback",
                                      "checkpoint.keep_best=test_loss",
                                      "checkpoint.keep_best=test_accuracy",
                                      "logging.level=debug",
                                      "logging.level=warn",
                                      "logging.level=error",
                                      "data.augment={hflip: true}",
                                      "data.targets={shape: [2]}",
                                      csv};
  for (const auto& set : sets) {
    INFO("--set " << set);
    const std::string once = resolved(apply_override(ConfigNode::load_string(kBase, "t.yaml"), set));
    CHECK(resolved(ConfigNode::load_string(once, "resolved.yaml")) == once);
  }
  // `keep_best: none` is the table's name for null: the same resolved config as leaving it out.
  CHECK(resolved(apply_override(ConfigNode::load_string(kBase, "t.yaml"), "checkpoint.keep_best=none")) ==
        resolved(ConfigNode::load_string(kBase, "t.yaml")));
}

TEST_CASE("did-you-mean picks close names only", "[config][cpu]") {
  CHECK(closest_match("optimiser", {"optimizer", "loss"}) == "optimizer");
  CHECK(closest_match("zzzzzz", {"optimizer", "loss"}).empty());
  CHECK(edit_distance("kitten", "sitting") == 3);
}

TEST_CASE("docs/configuration.md's layer reference is the one the registry generates", "[config][cpu]") {
  // scripts/update_docs.sh rewrites the block between the markers from `gputrain layers`.
  std::ifstream in(std::string(GT_SOURCE_DIR) + "/docs/configuration.md");
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string readme = ss.str();
  const std::string begin = "<!-- layers:begin -->\n", end = "<!-- layers:end -->";
  const size_t b = readme.find(begin), e = readme.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  CHECK(readme.substr(b + begin.size(), e - b - begin.size()) == layer_reference_markdown());
}

// `repeat:` blocks: the expansion is the model written out by hand with scoped names — same layers, same edges, same
// initial weights (parameters are drawn in the expanded list's order).
TEST_CASE("repeat: blocks expand to scoped layers, `input` inside a block is the block's input", "[config][cpu]") {
  const std::string repeated =
      "model:\n  layers:\n"
      "    - {type: linear, out_features: 4, name: stem}\n"
      "    - repeat: 3\n"
      "      name: h\n"
      "      layers:\n"
      "        - {type: layernorm, name: ln}\n"
      "        - {type: linear, out_features: 4, name: fc}\n"
      "        - {type: add, name: res, inputs: [input, fc]}\n"
      "    - {type: linear, out_features: 3}\n";
  std::string by_hand = "model:\n  layers:\n    - {type: linear, out_features: 4, name: stem}\n";
  std::string before = "stem";
  for (int k = 0; k < 3; ++k) {
    const std::string h = "h." + std::to_string(k) + ".";
    by_hand += "    - {type: layernorm, name: " + h + "ln}\n    - {type: linear, out_features: 4, name: " + h +
               "fc}\n    - {type: add, name: " + h + "res, inputs: [" + before + ", " + h + "fc]}\n";
    before = h + "res";
  }
  by_hand += "    - {type: linear, out_features: 3, name: layers.2}\n";
  auto build = [](const std::string& y) {
    return Model::build(parse_model_spec(ConfigNode::load_string(y, "t.yaml")["model"]), Shape{5}, DType::f64,
                        Device::cpu(), 7);
  };
  Model a = build(repeated), b = build(by_hand);
  CHECK(YAML::Dump(a.resolved_layers()) == YAML::Dump(b.resolved_layers()));
  CHECK_THAT(a.edges(), Catch::Contains("h.1.res ← h.0.res + h.1.fc"));
  const auto pa = a.named_params(), pb = b.named_params();
  REQUIRE(pa.size() == pb.size());
  REQUIRE(pa.size() == 2 + 3 * 4 + 2);
  for (size_t i = 0; i < pa.size(); ++i) {
    CHECK(pa[i].first == pb[i].first);
    const Tensor &va = pa[i].second->value, &vb = pb[i].second->value;
    REQUIRE(va.numel() == vb.numel());
    CHECK(std::equal(va.data<double>(), va.data<double>() + va.numel(), vb.data<double>()));
  }
  CHECK(pa[2].first == "h.0.ln.weight");
  CHECK(pa[pa.size() - 2].first == "layers.2.weight");
}

TEST_CASE("repeat: errors name the block and the layer inside it", "[config][cpu]") {
  auto block = [](const std::string& inner, const std::string& times = "2") {
    return with("  layers:\n    - {type: linear, out_features: 8}\n    - relu\n    - {type: linear, out_features: 3}\n",
                "  layers:\n    - repeat: " + times + "\n      name: h\n      layers:\n" + inner +
                    "    - {type: linear, out_features: 3}\n");
  };
  CHECK_THAT(error_of(block("        - {type: linear, out_features: 3, inputs: nope}\n")),
             Catch::StartsWith("model.layers[0].layers[0].inputs: no layer is named \"nope\""));
  CHECK_THAT(error_of(block("        - relu\n", "0")),
             Catch::StartsWith("model.layers[0].repeat: expected an integer in [1, 100000], got 0"));
  CHECK_THAT(error_of(block("        - {type: relu, nmae: x}\n")),
             Catch::StartsWith("model.layers[0].layers[0].nmae: unknown key (did you mean \"name\"?)"));
  const std::string misspelt =
      with("  layers:\n    - {type: linear, out_features: 8}\n    - relu\n    - {type: linear, out_features: 3}\n",
           "  layers:\n    - {repeat: 2, name: h, layerz: [relu]}\n    - {type: linear, out_features: 3}\n");
  CHECK_THAT(error_of(misspelt), Catch::StartsWith("model.layers[0].layerz: unknown key (did you mean \"layers\"?)"));
}

namespace {

// The member names of a schema object's "properties", in order.
std::vector<std::string> property_names(const JsonValue& schema) {
  std::vector<std::string> names;
  if (const JsonValue* props = schema.find("properties"))
    for (const JsonMember& m : props->members) names.push_back(m.key);
  return names;
}

// The branch of a section with variants whose `if` names `value` of its discriminator: the keys of that variant.
const JsonValue* variant_of(const JsonValue& section, const std::string& discriminator, const std::string& value) {
  const JsonValue* all = section.find("allOf");
  if (!all) return nullptr;
  for (const JsonValue& branch : all->items) {
    const JsonValue* values = branch.find("if")->find("properties")->find(discriminator)->find("enum");
    for (const JsonValue& v : values->items)
      if (v.string == value) return branch.find("then");
  }
  return nullptr;
}

// "a, b, c" of the message's "valid keys: a, b, c (t.yaml:…)": the keys the parser took.
std::vector<std::string> valid_keys_of(const std::string& message) {
  const std::string tag = "valid keys: ";
  const size_t from = message.find(tag);
  REQUIRE(from != std::string::npos);
  const std::string list = message.substr(from + tag.size(), message.rfind(" (") - from - tag.size());
  std::vector<std::string> keys;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = list.find(", ", at);
    keys.push_back(list.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 2;
  }
  return keys;
}

}  // namespace

TEST_CASE("the config schema is JSON whose keys are the ones the parsers accept, and names every layer",
          "[config][cpu]") {
  const JsonValue schema = json_read(config_json_schema());
  REQUIRE(schema.is_object());
  CHECK(schema.find("$schema")->string == "https://json-schema.org/draft/2020-12/schema");
  CHECK(schema.find("additionalProperties")->type == JsonValue::Type::boolean);
  const JsonValue& top = schema;
  const JsonValue& sections = *top.find("properties");

  // Each section's schema keys against the "valid keys" an unknown key there is refused with, in the same order: a
  // parser that stopped reading its keys from the table would differ here.
  const JsonValue& optimizer = *sections.find("optimizer");
  const JsonValue& scheduler = *sections.find("scheduler");
  const JsonValue& data = *sections.find("data");
  const JsonValue* loss_map = nullptr;
  for (const JsonValue& alt : sections.find("loss")->find("anyOf")->items)
    if (alt.find("properties")) loss_map = &alt;
  REQUIRE(loss_map);
  const std::vector<std::pair<std::string, const JsonValue*>> cases = {
      {"+zzz=1", &top},
      {"+train.zzz=1", sections.find("train")},
      {"+checkpoint={zzz: 1}", sections.find("checkpoint")},
      {"+dist={zzz: 1}", sections.find("dist")},
      {"+logging={zzz: 1}", sections.find("logging")},
      {"loss={type: mse, zzz: 1}", loss_map},
      {"+optimizer.zzz=1", variant_of(optimizer, "type", "sgd")},
      {"optimizer={type: adam, lr: 1, zzz: 1}", variant_of(optimizer, "type", "adam")},
      {"optimizer={type: adamw, lr: 1, zzz: 1}", variant_of(optimizer, "type", "adamw")},
      {"+data.zzz=1", variant_of(data, "format", "synthetic")},
      {"+data.targets.zzz=1", variant_of(data, "format", "synthetic")->find("properties")->find("targets")},
      {"+train.grad_clip={max_norm: 1, zzz: 1}", sections.find("train")->find("properties")->find("grad_clip")},
      {"+model.zzz=1", sections.find("model")},
      {"optimizer={type: sgd, lr: 1, param_groups: [{params: ['*'], zzz: 1}]}",
       variant_of(optimizer, "type", "sgd")->find("properties")->find("param_groups")->find("items")},
  };
  for (const char* type : {"constant", "step", "multistep", "exponential", "cosine", "linear", "onecycle"}) {
    INFO("scheduler " << type);
    REQUIRE(variant_of(scheduler, "type", type));
    CHECK(valid_keys_of(error_of(with("train: {epochs: 1}",
                                      fmt::format("train: {{epochs: 1}}\nscheduler: {{type: {}, zzz: 1}}", type)))) ==
          property_names(*variant_of(scheduler, "type", type)));
  }
  for (const auto& [set, section] : cases) {
    INFO("--set " << set);
    REQUIRE(section);
    CHECK(section->find("additionalProperties"));
    std::string message;
    try {
      validate(apply_override(ConfigNode::load_string(kBase, "t.yaml"), set));
    } catch (const ConfigError& e) {
      message = e.what();
    }
    REQUIRE_THAT(message, Catch::Contains("zzz: unknown key"));
    CHECK(valid_keys_of(message) == property_names(*section));
  }

  // Every registered layer has its branch, holding every argument, and the bare form lists those that need none.
  const JsonValue& layer = *schema.find("$defs")->find("layer");
  const JsonValue* typed = nullptr;
  const JsonValue* bare = nullptr;
  for (const JsonValue& alt : layer.find("anyOf")->items) {
    if (alt.find("enum")) bare = &alt;
    if (alt.find("allOf")) typed = &alt;
  }
  REQUIRE(typed);
  REQUIRE(bare);
  for (const LayerSpec& spec : layer_registry()) {
    INFO("layer " << spec.type);
    const JsonValue* branch = variant_of(*typed, "type", spec.type);
    REQUIRE(branch);
    std::vector<std::string> keys{"type", "name", "inputs"};
    for (const LayerArg& a : spec.args) keys.push_back(a.name);
    CHECK(property_names(*branch) == keys);
    const bool needs_args =
        std::any_of(spec.args.begin(), spec.args.end(), [](const LayerArg& a) { return a.required; });
    const bool listed = std::any_of(bare->find("enum")->items.begin(), bare->find("enum")->items.end(),
                                    [&](const JsonValue& v) { return v.string == spec.type; });
    CHECK(listed == !needs_args);
  }
}

TEST_CASE("train.cuda_graphs is refused where a step cannot be captured, naming the key and its line",
          "[config][cpu]") {
  auto graphs = [](const std::string& train) { return with("train: {epochs: 1}", "train: {" + train + "}"); };
  SECTION("accepted on a GPU device (checked against the hardware when the run starts)") {
    const auto y = with("seed: 3", "seed: 3\ndevice: cuda");
    const Experiment exp = parse_experiment(
        ConfigNode::load_string(y.substr(0, y.find("train:")) + "train: {epochs: 1, cuda_graphs: true}\n", "t.yaml"));
    CHECK(exp.train.cuda_graphs);
    CHECK_FALSE(parse_experiment(ConfigNode::load_string(kBase, "t.yaml")).train.cuda_graphs);  // the default
  }
  SECTION("on the CPU") {
    const auto y = with("seed: 3", "seed: 3\ndevice: cpu");
    const std::string yaml = y.substr(0, y.find("train:")) + "train: {epochs: 1, cuda_graphs: true}\n";
    CHECK_THAT(error_of(yaml), Catch::StartsWith("train.cuda_graphs: CUDA graphs need a GPU, and device is cpu") &&
                                   Catch::EndsWith(position_of(yaml, "true}")));
  }
  SECTION("on a list of devices") {
    const auto y = with("seed: 3", "seed: 3\ndevice: [0, 1]");
    const std::string yaml = y.substr(0, y.find("train:")) + "train: {epochs: 1, cuda_graphs: true}\n";
    CHECK_THAT(error_of(yaml), Catch::StartsWith("train.cuda_graphs: CUDA graphs capture one device's step; device "
                                                 "lists 2 devices"));
  }
  SECTION("with accumulation") {
    const auto yaml = graphs("epochs: 1, accumulate: 2, cuda_graphs: true");
    CHECK_THAT(error_of(yaml), Catch::StartsWith("train.cuda_graphs: train.accumulate: 2 copies a batch") &&
                                   Catch::EndsWith(position_of(yaml, "true}")));
  }
  SECTION("with the profiler") {
    const auto yaml = graphs("epochs: 1, profile: {start_step: 2, steps: 3}, cuda_graphs: true");
    CHECK_THAT(error_of(yaml), Catch::StartsWith("train.cuda_graphs: train.profile times each layer from the host"));
  }
  SECTION("not a boolean") {
    const auto yaml = graphs("epochs: 1, cuda_graphs: maybe");
    CHECK_THAT(error_of(yaml), Catch::StartsWith("train.cuda_graphs: ") && Catch::EndsWith(position_of(yaml, "maybe")));
  }
}

TEST_CASE("train.cuda_graphs on a machine without a GPU ends the run before it starts, exit 2", "[config][cpu]") {
  // device: auto finds no GPU in this build or on this machine; with one it would train on it (the [cuda] tests').
  if (!query_cuda().devices.empty()) {
    WARN("not checked: a CUDA device is present, and device: auto takes it");
    return;
  }
  TempDir dir;
  const std::string yaml = std::string(kBase).replace(std::string(kBase).find("train: {epochs: 1}"), 18,
                                                      "train: {epochs: 1, cuda_graphs: true}");
  write_text(dir / "c.yaml", yaml);
  const CommandResult r = run_gputrain("train " + dir / "c.yaml" + " --out " + dir / "run");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("train.cuda_graphs: CUDA graphs need a GPU, and this run is on cpu"));
  CHECK_FALSE(std::filesystem::exists(dir / "run"));  // refused before the run directory
}

TEST_CASE("gputrain check refuses train.cuda_graphs with dropout and says what it drops", "[config][cpu]") {
  TempDir dir;
  // device: cuda is accepted by the config and by check, which needs no GPU; 64 samples in batches of 24 leave 16.
  std::string yaml = std::string(kBase).replace(std::string(kBase).find("train: {epochs: 1}"), 18,
                                                "train: {epochs: 1, cuda_graphs: true}\ndevice: cuda");
  yaml.replace(yaml.find("batch_size: 16"), 14, "batch_size: 24");
  write_text(dir / "ok.yaml", yaml);
  const CommandResult ok = run_gputrain("check " + dir / "ok.yaml");
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Catch::Contains("train.cuda_graphs: on one GPU, the step is captured into a CUDA graph after "
                                        "3 warm-up steps and replayed; the last 16 samples of each epoch's order are "
                                        "dropped"));
  yaml.replace(yaml.find("    - relu\n"), 11, "    - relu\n    - {type: dropout, p: 0.2}\n");
  write_text(dir / "dropout.yaml", yaml);
  const CommandResult bad = run_gputrain("check " + dir / "dropout.yaml");
  INFO(bad.output);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("train.cuda_graphs: layer layers.2 (dropout) draws its dropout masks"));
}
