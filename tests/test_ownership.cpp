// The writer rule (core/ownership.h): each command writes only into a folder it creates or one its own kind of output
// owns, never into another command's output, a folder of other files, or over its own input; a re-run that replaces
// its earlier output removes every stale file of it. Unit tests of the helper, then each command through the binary.
#include "core/error.h"
#include "core/json_read.h"
#include "core/ownership.h"
#include "core/rng.h"
#include "data/tokens.h"
#include "helpers.h"
#include "io/llmc.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

using namespace gt;
using namespace gt::test;
namespace fs = std::filesystem;

namespace {

// Every file under `dir` with its bytes: what a refused command must leave exactly as it was.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = read_text(e.path().string());
  return files;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

// A tiny llm.c checkpoint (2 layers, 2 heads, 16 channels, vocabulary `vocab` padded to a multiple of 64).
void write_tiny_llmc(const std::string& path, int32_t vocab) {
  LlmcCheckpoint c;
  c.header.version = 3;
  c.header.max_seq_len = 8;
  c.header.vocab_size = vocab;
  c.header.num_layers = 2;
  c.header.num_heads = 2;
  c.header.channels = 16;
  c.header.padded_vocab_size = (vocab + 63) / 64 * 64;
  Rng rng(5, 1);
  for (const auto& [name, shape] : llmc_tensor_shapes(c.header)) {
    Tensor t = Tensor::empty(shape, DType::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng.normal()) * 0.02f;
    c.tensors.emplace_back(name, std::move(t));
  }
  write_llmc(path, c);
}

}  // namespace

TEST_CASE("folder ownership: manifests, older outputs by their files, and everything else as foreign", "[cpu]") {
  TempDir dir;
  using State = FolderOwnership::State;
  CHECK(folder_ownership(dir / "none").state == State::missing);
  CHECK(folder_ownership(dir.path()).state == State::empty);
  write_text(dir / "file", "x");
  CHECK(folder_ownership(dir / "file").state == State::not_a_folder);
  // A run's lock alone (taken before the manifest) leaves a folder empty; anything else makes it someone's.
  fs::create_directories(dir / "locked");
  write_text(dir / "locked/.lock", "12\n");
  CHECK(folder_ownership(dir / "locked").state == State::empty);
  fs::create_directories(dir / "notes");
  write_text(dir / "notes/readme.txt", "mine");
  const FolderOwnership notes = folder_ownership(dir / "notes");
  CHECK(notes.state == State::foreign);
  CHECK(notes.evidence == "readme.txt");
  // Older outputs, recognised by the files their commands write.
  struct Older {
    std::string name;
    std::vector<std::pair<std::string, std::string>> files;
    Owner owner;
  };
  for (const Older& o :
       {Older{"run", {{"summary.json", "{}"}}, Owner::run}, Older{"sweep", {{"sweep.json", "{}"}}, Owner::sweep},
        Older{"tok",
              {{"tokenizer.json", R"j({"type": "bytes", "format": "llm.c token shards (magic 20240520)"})j"},
               {"train_000000.bin", "x"},
               {"train_000001.bin", "x"},
               {"val_000000.bin.tmp", "x"},
               {"train_1.bin", "not ours"}},
              Owner::tokenization},
        Older{"imp",
              {{"config.yaml", "# Imported from llm.c's checkpoint a.bin\n"}, {"model.safetensors", "x"}},
              Owner::import}}) {
    INFO(o.name);
    fs::create_directories(dir / o.name);
    for (const auto& [f, text] : o.files) write_text(dir / o.name + "/" + f, text);
    const FolderOwnership got = folder_ownership(dir / o.name);
    CHECK(got.state == State::owned);
    CHECK(got.owner == o.owner);
    CHECK_FALSE(got.has_manifest);
  }
  CHECK(folder_ownership(dir / "tok").files ==
        std::vector<std::string>{"train_000000.bin", "train_000001.bin", "val_000000.bin.tmp", "tokenizer.json"});
  // A config.yaml that import did not write, or a tokenizer.json of another tool, is someone else's.
  fs::create_directories(dir / "hf");
  write_text(dir / "hf/config.yaml", "model_type: gpt2\n");
  write_text(dir / "hf/model.safetensors", "x");
  CHECK(folder_ownership(dir / "hf").state == State::foreign);
  // A manifest that is not one gputrain wrote is not trusted.
  fs::create_directories(dir / "bad");
  write_text(dir / "bad/gputrain-output.json", R"({"owner": "someone"})");
  CHECK(folder_ownership(dir / "bad").state == State::foreign);
  write_text(dir / "bad/gputrain-output.json", "{not json");
  CHECK(folder_ownership(dir / "bad").state == State::foreign);
}

TEST_CASE("claim_output_folder: new folders get a manifest, other outputs and other files are refused", "[cpu]") {
  TempDir dir;
  const ClaimedFolder c = claim_output_folder("--out", dir / "a/b", Owner::tokenization, Reuse::never);
  CHECK(c.created);
  const JsonValue m = json_read_object(read_text(dir / "a/b/gputrain-output.json"));
  CHECK(m.find("owner")->string == "tokenize");
  CHECK_FALSE(m.find("complete")->boolean);  // not finished until the command says so
  // Not finished: the same command takes it again without being asked.
  write_manifest(dir / "a/b", Owner::tokenization, {"train_000000.bin"}, false);
  write_text(dir / "a/b/train_000000.bin", "old");
  CHECK(claim_output_folder("--out", dir / "a/b", Owner::tokenization, Reuse::never).removed ==
        std::vector<std::string>{"train_000000.bin"});
  CHECK_FALSE(fs::exists(dir / "a/b/train_000000.bin"));
  // Finished: refused without replace, naming the folder, what it holds and the hint.
  write_text(dir / "a/b/train_000000.bin", "old");
  write_text(dir / "a/b/tokenizer.json", "{}");
  write_manifest(dir / "a/b", Owner::tokenization, {"train_000000.bin", "tokenizer.json"}, true);
  CHECK_THAT(message_of([&] {
               claim_output_folder("--out", dir / "a/b", Owner::tokenization, Reuse::never, "--force replaces it");
             }),
             Catch::Contains("--out " + (dir / "a/b") +
                             ": holds a tokenization (train_000000.bin, tokenizer.json) already; --force replaces it"));
  // Another command's output is refused whatever the reuse, and so is a folder inside it.
  for (const Owner o : {Owner::run, Owner::sweep, Owner::import})
    for (const Reuse r : {Reuse::never, Reuse::resume, Reuse::replace}) {
      CHECK_THAT(message_of([&] { claim_output_folder("--out", dir / "a/b", o, r); }),
                 Catch::Contains("holds a tokenization") && Catch::Contains("another command's output"));
      CHECK_THAT(message_of([&] { claim_output_folder("--out", dir / "a/b/inner", o, r); }),
                 Catch::Contains("inside " + (dir / "a/b") + ", which holds a tokenization"));
    }
  CHECK(fs::exists(dir / "a/b/train_000000.bin"));
  CHECK_FALSE(fs::exists(dir / "a/b/inner"));
  // Replace removes exactly the listed files: a name that leaves the folder is never followed.
  write_text(dir / "outside.txt", "keep");
  write_text(dir / "a/b/mine.txt", "the user's");
  write_manifest(dir / "a/b", Owner::tokenization, {"train_000000.bin", "../../outside.txt", "/etc/passwd", ".."},
                 true);
  const ClaimedFolder r = claim_output_folder("--out", dir / "a/b", Owner::tokenization, Reuse::replace);
  CHECK(r.removed == std::vector<std::string>{"train_000000.bin"});
  CHECK(read_text(dir / "outside.txt") == "keep");
  CHECK(read_text(dir / "a/b/mine.txt") == "the user's");
  // A folder of files gputrain did not write is refused for every command.
  fs::create_directories(dir / "home");
  write_text(dir / "home/thesis.tex", "…");
  for (const Owner o : {Owner::run, Owner::sweep, Owner::tokenization, Owner::import})
    CHECK_THAT(message_of([&] { claim_output_folder("--out", dir / "home", o, Reuse::replace); }),
               Catch::Contains("holds files gputrain did not write (\"thesis.tex\""));
  // A run inside a sweep is the sweep's trial: allowed.
  claim_output_folder("--out", dir / "sw", Owner::sweep, Reuse::never);
  CHECK(claim_output_folder("--out", dir / "sw/0-trial", Owner::run, Reuse::never).created);
}

TEST_CASE("refuse_output_file: an input is never overwritten, nor a file of another command's output", "[cpu]") {
  TempDir dir;
  write_text(dir / "w.safetensors", "weights");
  CHECK_THAT(message_of([&] { refuse_output_file("--out", dir / "w.safetensors", {dir / "w.safetensors"}); }),
             Catch::Contains("the same file as this command's input"));
  // The same file by another name is the same file.
  fs::create_symlink(dir / "w.safetensors", dir / "link.safetensors");
  CHECK_THAT(message_of([&] { refuse_output_file("--out", dir / "link.safetensors", {dir / "w.safetensors"}); }),
             Catch::Contains("the same file"));
  CHECK_THAT(message_of([&] { refuse_output_file("--out", dir / "./w.safetensors", {dir / "w.safetensors"}); }),
             Catch::Contains("the same file"));
  CHECK_NOTHROW(refuse_output_file("--out", dir / "new.bin", {dir / "w.safetensors"}));
  fs::create_directories(dir / "run");
  write_text(dir / "run/summary.json", "{}");
  CHECK_THAT(message_of([&] { refuse_output_file("--out", dir / "run/metrics.jsonl", {}); }),
             Catch::Contains("inside " + (dir / "run") + ", which holds a finished run (summary.json)"));
  CHECK_NOTHROW(refuse_output_file("--out", dir / "run/report.html", {}, {"report.html"}));
  CHECK_THAT(message_of([&] { refuse_output_file("--out", dir / "run/checkpoints/report.html", {}, {"report.html"}); }),
             Catch::Contains("which holds a finished run"));
}

TEST_CASE("gputrain sweep --out refuses a finished run and leaves it exactly as it was", "[e2e]") {
  TempDir dir;
  write_text(dir / "tiny.yaml", kTinyConfig);
  REQUIRE(run_gputrain("train " + (dir / "tiny.yaml") + " --quiet --out " + (dir / "run")).exit_code == 0);
  const auto before = snapshot(dir / "run");
  REQUIRE(before.count("report.html"));
  const auto r = run_gputrain("sweep " + (dir / "tiny.yaml") + " --grid optimizer.lr=0.1,0.2 --out " + (dir / "run"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--out " + (dir / "run") +
                                       ": holds a finished run (summary.json); sweep does not write "
                                       "into another command's output"));
  CHECK(lines_of(r.output).size() == 1);
  CHECK(snapshot(dir / "run") == before);
  CHECK_FALSE(fs::exists(dir / "run/sweep.json"));
  // --emit and --resume are refused the same way, and so are a tokenization and a folder of the user's files.
  CHECK(run_gputrain("sweep " + (dir / "tiny.yaml") + " --grid optimizer.lr=0.1 --emit slurm --out " + (dir / "run"))
            .exit_code == 2);
  CHECK(run_gputrain("sweep " + (dir / "tiny.yaml") + " --resume --out " + (dir / "run")).exit_code == 2);
  CHECK(snapshot(dir / "run") == before);
  // And a run is not started into a sweep, nor into a folder of other files.
  REQUIRE(run_gputrain("sweep " + (dir / "tiny.yaml") + " --grid optimizer.lr=0.1 --out " + (dir / "sw")).exit_code ==
          0);
  const auto sweep = snapshot(dir / "sw");
  const auto t = run_gputrain("train " + (dir / "tiny.yaml") + " --out " + (dir / "sw"));
  CHECK(t.exit_code == 2);
  CHECK_THAT(t.output, Catch::Contains("holds a sweep (sweep.json); train does not write"));
  CHECK(snapshot(dir / "sw") == sweep);
  fs::create_directories(dir / "mine");
  write_text(dir / "mine/notes.txt", "keep");
  const auto m = run_gputrain("train " + (dir / "tiny.yaml") + " --out " + (dir / "mine"));
  CHECK(m.exit_code == 2);
  CHECK_THAT(m.output, Catch::Contains("holds files gputrain did not write (\"notes.txt\""));
  CHECK(snapshot(dir / "mine") == std::map<std::string, std::string>{{"notes.txt", "keep"}});
  CHECK_FALSE(fs::exists(dir / "mine/.lock"));
}

TEST_CASE("gputrain tokenize into an earlier tokenization: refused, or replaced whole with --force", "[e2e]") {
  TempDir dir;
  std::string big, small;
  for (int i = 0; i < 5000; ++i) big += "line " + std::to_string(i) + " of the larger text\n";
  for (int i = 0; i < 100; ++i) small += "short " + std::to_string(i) + "\n";
  write_text(dir / "big.txt", big);
  write_text(dir / "small.txt", small);
  const std::string out = dir / "tok";
  REQUIRE(run_gputrain("tokenize " + (dir / "big.txt") + " --out " + out + " --shard-tokens 20000").exit_code == 0);
  REQUIRE(fs::exists(out + "/train_000004.bin"));
  const auto before = snapshot(out);
  // Without --force: refused (exit 2), nothing touched.
  const auto again = run_gputrain("tokenize " + (dir / "small.txt") + " --out " + out + " --shard-tokens 20000");
  INFO(again.output);
  CHECK(again.exit_code == 2);
  CHECK_THAT(again.output, Catch::Contains("holds a tokenization (train_000000.bin, train_000001.bin, "
                                           "train_000002.bin and 6 more) already; --force replaces it"));
  CHECK(snapshot(out) == before);
  // With --force: said, and no shard of the earlier tokenization is left for a train_*.bin glob to match.
  const auto forced =
      run_gputrain("tokenize " + (dir / "small.txt") + " --out " + out + " --shard-tokens 20000 --force");
  INFO(forced.output);
  CHECK(forced.exit_code == 0);
  CHECK_THAT(forced.output, Catch::Contains(out + ": replaced the earlier tokenization (9 files removed)"));
  CHECK(glob_files(out + "/train_*.bin") == std::vector<std::string>{out + "/train_000000.bin"});
  CHECK(glob_files(out + "/val_*.bin") == std::vector<std::string>{out + "/val_000000.bin"});
  const JsonValue m = json_read_object(read_text(out + "/gputrain-output.json"));
  CHECK(m.find("complete")->boolean);
  CHECK(m.find("files")->items.size() == 3);
  // An input inside the output folder would be removed: refused.
  const auto self = run_gputrain("tokenize " + out + "/train_000000.bin --out " + out + " --force");
  CHECK(self.exit_code == 2);
  CHECK_THAT(self.output, Catch::Contains("holds this command's input"));
  CHECK(fs::exists(out + "/train_000000.bin"));
}

TEST_CASE("export never overwrites its own input, and import llmc takes only a new folder or its own earlier one",
          "[e2e]") {
  TempDir dir;
  write_tiny_llmc(dir / "m.bin", 60);
  const auto imp = run_gputrain("import llmc " + (dir / "m.bin") + " --out " + (dir / "imp"));
  INFO(imp.output);
  REQUIRE(imp.exit_code == 0);
  const std::string weights = dir / "imp/model.safetensors", config = dir / "imp/config.yaml";
  const std::string original = read_text(weights);
  // export llmc over its own weights or config: refused, the file unchanged.
  for (const std::string& target : {weights, config}) {
    const auto r = run_gputrain("export llmc " + config + " --checkpoint " + weights + " --out " + target);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("the same file as this command's input"));
  }
  CHECK(read_text(weights) == original);
  // export llmc into the import's folder: not its own output either.
  CHECK(
      run_gputrain("export llmc " + config + " --checkpoint " + weights + " --out " + (dir / "imp/x.bin")).exit_code ==
      2);
  // import into a folder holding a config.yaml of the user's: refused, the file kept.
  fs::create_directories(dir / "exp");
  write_text(dir / "exp/config.yaml", "name: mine\n");
  const auto mine = run_gputrain("import llmc " + (dir / "m.bin") + " --out " + (dir / "exp"));
  CHECK(mine.exit_code == 2);
  CHECK_THAT(mine.output, Catch::Contains("holds files gputrain did not write (\"config.yaml\""));
  CHECK(read_text(dir / "exp/config.yaml") == "name: mine\n");
  // Into its own earlier import: refused without --force, replaced with it (and said).
  const auto again = run_gputrain("import llmc " + (dir / "m.bin") + " --out " + (dir / "imp"));
  CHECK(again.exit_code == 2);
  CHECK_THAT(again.output, Catch::Contains("holds an llm.c import (config.yaml, model.safetensors) already; --force"));
  const auto forced = run_gputrain("import llmc " + (dir / "m.bin") + " --out " + (dir / "imp") + " --force");
  INFO(forced.output);
  CHECK(forced.exit_code == 0);
  CHECK_THAT(forced.output, Catch::Contains("replaced the earlier import (2 files removed)"));
  CHECK(read_text(weights) == original);
  // The checkpoint itself inside the folder would be replaced: refused.
  const auto self =
      run_gputrain("import llmc " + (dir / "imp/model.safetensors") + " --out " + (dir / "imp") + " --force");
  CHECK(self.exit_code == 2);
  CHECK_THAT(self.output, Catch::Contains("holds this command's input"));
  // A vocabulary past uint16 token ids: import and check agree that it cannot be trained here (exit 2).
  write_tiny_llmc(dir / "wide.bin", 65537);
  const auto wide = run_gputrain("import llmc " + (dir / "wide.bin") + " --out " + (dir / "wide"));
  INFO(wide.output);
  CHECK(wide.exit_code == 2);
  CHECK_THAT(wide.output, Catch::Contains("a vocabulary of 65537 tokens; gputrain takes at most 65536"));
  CHECK_FALSE(fs::exists(dir / "wide"));
}
