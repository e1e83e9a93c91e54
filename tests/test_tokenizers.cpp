// Tokenizers (lib/text): SentencePiece models that `gputrain tokenize` trains, compared id for id with Debian's
// python3-sentencepiece; the shards they write (cut documents, thread counts, uint32 ids); the byte descriptor under
// its old and new names; malformed tokenizer files; eval in bits per byte and generate printing text.
#include "core/error.h"
#include "core/parallel.h"
#include "data/tokens.h"
#include "helpers.h"
#include "io/llmc.h"
#include "llmc_cases.h"
#include "text/byte_tokenizer.h"
#include "text/load.h"
#include "text/sentencepiece.h"
#include "train/experiment.h"
#include "train/generate.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

using namespace gt;
using namespace gt::test;
namespace fs = std::filesystem;

namespace {

// Text of every kind a tokenizer meets: English, code, punctuation runs, accents and CJK, emoji (4-byte UTF-8),
// runs of spaces, tabs and blank lines.
const std::vector<std::string> kSamples = {
    "The quick brown fox jumps over the lazy dog. It's 3:45 p.m., isn't it?\n",
    "int main(int argc, char** argv) {\n  for (int i = 0; i < argc; ++i) printf(\"%s\\n\", argv[i]);\n}\n",
    "def f(x):\n\treturn {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "Wait... what?!?! -- no!!! ((nested)) [[brackets]] {{braces}} ;;; ::: ~~~ ^^^ |||\n",
    "Café naïve façade résumé — «quotes» “curly” ‘single’ … ½ ¼ €100 £5 ¥7\n",
    "日本語のテキスト、中文文本，한국어 텍스트. Ελληνικά, русский текст, עברית, العربية\n",
    "Emoji: 😀 🎉 👍🏽 🇩🇪 ❤️ 🧑‍💻 ✓ ✗ ★\n",
    "spaces:    four, then\t\ttabs,\n\n\n   three blank lines and trailing spaces   \n",
    " leading space, double  space, and a lone\u00a0no-break space\n",
    "x",
    "",
    "   ",
    "\n",
};

// A corpus of `docs` documents built from the samples, varied (numbers, order) so the trainer has something to
// count, about 750 bytes each.
std::string corpus_doc(int i) {
  std::string d;
  for (size_t k = 0; k < kSamples.size(); ++k) d += kSamples[(k * 7 + static_cast<size_t>(i)) % kSamples.size()];
  return d + "Document " + std::to_string(i) + " ends here, number " + std::to_string(i * 37 % 1000) + ".\n";
}

// `text` with every line two spaces in (gpt_layers' "layers:" list under "model:").
std::string indented(const std::string& text) {
  std::string out = "  ";
  for (size_t i = 0; i < text.size(); ++i)
    out += text[i] == '\n' && i + 1 < text.size() ? "\n  " : std::string(1, text[i]);
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<uint32_t> shard_ids(const std::vector<std::string>& files) {
  std::vector<uint32_t> ids;
  for (const std::string& f : files) {
    const TokenShard s(f);
    std::vector<uint32_t> part(static_cast<size_t>(s.size()));
    s.read(0, s.size(), part.data());
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

// Debian's Python binding (python3-sentencepiece, scripts/setup.sh) encoding each file with `model`: one line of
// ids per file.
std::vector<std::string> python_ids(const std::string& model, const std::vector<std::string>& files) {
  std::string cmd =
      "/usr/bin/python3 -c \"import sys, sentencepiece as s; p = s.SentencePieceProcessor(model_file=sys.argv[1]); "
      "[print(' '.join(map(str, p.encode(open(f, encoding='utf-8', newline='').read())))) for f in sys.argv[2:]]\" " +
      model;
  for (const std::string& f : files) cmd += " " + f;
  const CommandResult r = run_shell(cmd + " 2>&1");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> lines;
  std::string line;
  for (const char c : r.output) {
    if (c == '\n') {
      lines.push_back(line);
      line.clear();
    } else {
      line += c;
    }
  }
  return lines;
}

std::string joined(const std::vector<uint32_t>& ids) {
  std::string s;
  for (const uint32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

// Whether `s` ends inside a UTF-8 sequence whose lead byte promises more bytes than follow it.
bool ends_inside_character(const std::string& s) {
  for (size_t back = 1; back <= 4 && back <= s.size(); ++back) {
    const auto c = static_cast<uint8_t>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;
    const size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return len > back;
  }
  return false;
}

}  // namespace

TEST_CASE("tokenize --vocab-size trains a SentencePiece model whose ids are python3-sentencepiece's", "[tokens]") {
  TempDir dir;
  // Two files, the first over 64 KiB so that it is cut into pieces encoded apart.
  std::string one, two;
  for (int i = 0; i < 260; ++i) one += corpus_doc(i);
  for (int i = 260; i < 300; ++i) two += corpus_doc(i);
  REQUIRE(one.size() > 70000);
  write_text(dir / "one.txt", one);
  write_text(dir / "two.txt", two);
  for (const char* model : {"bpe", "unigram"}) {
    DYNAMIC_SECTION(model) {
      SubwordOptions o;
      o.vocab_size = 600;
      o.model = model;
      const TokenizeResult r = tokenize_subword({dir / "one.txt", dir / "two.txt"}, dir / "out", 0.2, 5000, false, o);
      const std::string path = dir / "out/tokenizer.model";
      const std::unique_ptr<Tokenizer> tok = load_tokenizer(path);
      CHECK(tok->vocab_size() == 600);
      REQUIRE(tok->end_of_text() == std::optional<uint32_t>(1));
      // Every sample, and each whole file, as Python's binding encodes it; and back to the same bytes.
      std::vector<std::string> files;
      for (size_t i = 0; i < kSamples.size(); ++i) {
        files.push_back(dir / ("s" + std::to_string(i) + ".txt"));
        write_text(files.back(), kSamples[i]);
      }
      files.push_back(dir / "one.txt");
      files.push_back(dir / "two.txt");
      const std::vector<std::string> py = python_ids(path, files);
      REQUIRE(py.size() == files.size());
      for (size_t i = 0; i < files.size(); ++i) {
        const std::string text = i < kSamples.size() ? kSamples[i] : slurp(files[i]);
        INFO("sample " << i);
        const std::vector<uint32_t> ids = tok->encode(text);
        CHECK(joined(ids) == py[i]);
        CHECK(tok->decode(ids) == text);
        std::string bytes;
        for (const uint32_t id : ids) bytes += tok->token_bytes(id);
        CHECK(bytes == text);
      }
      // The shards: each file after the end-of-text id, train then val. BPE's ids are those of the files encoded
      // whole (the cuts change nothing); unigram's may resolve a tie between equally likely segmentations otherwise
      // at a cut (".." "." for "..."), so for it the text they decode to is checked.
      std::vector<uint32_t> want{1};
      for (const uint32_t id : tok->encode(one)) want.push_back(id);
      want.push_back(1);
      for (const uint32_t id : tok->encode(two)) want.push_back(id);
      const std::vector<uint32_t> got = shard_ids(r.files);
      if (std::string(model) == "bpe") CHECK((got == want));  // (in brackets: not printed whole when they differ)
      CHECK(tok->decode(got) == one + two);
      CHECK(std::count(got.begin(), got.end(), 1u) == 2);
      CHECK(r.train_tokens + r.val_tokens == static_cast<int64_t>(got.size()));
      CHECK(r.val_tokens > 0);
      CHECK(std::count(r.files.begin(), r.files.end(), dir / "out/val_000000.bin") == 1);
      CHECK(TokenShard(r.files.front()).width() == 2);
      fs::remove_all(dir / "out");
    }
  }
}

TEST_CASE("subword shards are the same at 1 and 2 threads, and --doc-sep starts documents", "[tokens]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text += corpus_doc(i) + "%\n";
  write_text(dir / "f.txt", text);
  SubwordOptions o;
  o.vocab_size = 600;
  o.doc_sep = "%\n";
  const int threads = num_threads();
  std::vector<std::string> outs;
  for (const int n : {1, 2}) {
    set_num_threads(n);
    outs.push_back(dir / ("out" + std::to_string(n)));
    tokenize_subword({dir / "f.txt"}, outs.back(), 0.1, 20000, false, o);
  }
  set_num_threads(threads);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(outs[0])) names.push_back(e.path().filename().string());
  CHECK(names.size() > 3);
  for (const std::string& n : names) {
    INFO(n);
    if (n != "tokenizer.model") CHECK(slurp(outs[0] + "/" + n) == slurp(outs[1] + "/" + n));
  }
  // The models hold the same pieces (their files differ in the trainer's thread count, which they record).
  const std::unique_ptr<Tokenizer> a = load_tokenizer(outs[0] + "/tokenizer.model"),
                                   b = load_tokenizer(outs[1] + "/tokenizer.model");
  REQUIRE(a->vocab_size() == b->vocab_size());
  for (uint32_t id = 0; id < a->vocab_size(); ++id) CHECK(a->token_bytes(id) == b->token_bytes(id));
  // 200 documents: 200 end-of-text ids, and no separator left in the text.
  const std::vector<std::string> shards = glob_files(outs[0] + "/*_0*.bin");
  const std::vector<uint32_t> ids = shard_ids(shards);
  CHECK(std::count(ids.begin(), ids.end(), 1u) == 200);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(outs[0] + "/tokenizer.model");
  CHECK(tok->decode(ids).find("%\n") == std::string::npos);
  // --tokenizer encodes with the given model: the same shards again.
  SubwordOptions given;
  given.tokenizer = outs[0] + "/tokenizer.model";
  given.doc_sep = "%\n";
  tokenize_subword({dir / "f.txt"}, dir / "out3", 0.1, 20000, false, given);
  for (const std::string& n : names) CHECK(slurp(outs[0] + "/" + n) == slurp(dir / "out3/" + n));
}

TEST_CASE("uint32 shards (magic 20240801, version 7) are written and read back", "[tokens]") {
  TempDir dir;
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 1000; ++i) ids.push_back(i * 977 % 100000);
  write_token_shard(dir / "w.bin", ids.data(), ids.size());
  const std::string bytes = slurp(dir / "w.bin");
  REQUIRE(bytes.size() == 1024 + 4 * ids.size());
  int32_t head[3];
  std::memcpy(head, bytes.data(), sizeof head);
  CHECK(head[0] == 20240801);
  CHECK(head[1] == 7);
  CHECK(head[2] == 1000);
  const TokenShard s(dir / "w.bin");
  CHECK(s.width() == 4);
  CHECK(s.at(999) == ids[999]);
  CHECK((shard_ids({dir / "w.bin"}) == ids));
  const TokenWindows w({dir / "w.bin"}, 9, 100000);
  std::vector<float> x(9);
  std::vector<int32_t> y(9);
  w.window(3, x.data(), y.data());
  CHECK(x[0] == static_cast<float>(ids[27]));
  CHECK(y[8] == static_cast<int32_t>(ids[36]));
  // A token past the vocabulary is found where it is; version 1 under the uint32 magic is refused.
  CHECK_THROWS_WITH(TokenWindows({dir / "w.bin"}, 9, 99000), Catch::Contains("w.bin: token 99"));
  std::string v1 = bytes;
  const int32_t one = 1;
  std::memcpy(v1.data() + 4, &one, 4);
  write_text(dir / "v1.bin", v1);
  CHECK_THROWS_WITH(TokenShard(dir / "v1.bin"), Catch::Contains("version 1, expected 7"));
  // data inspect reads them as training does.
  write_text(dir / "c.yaml", "name: w\ndata: {format: tokens, train: {path: " + (dir / "w.bin") +
                                 "}, block_size: 9, vocab_size: 100000}\nmodel:\n" +
                                 indented(gpt_layers(100000, 8, 9, 1, 2, 16)) +
                                 "loss: cross_entropy\noptimizer: {type: sgd, lr: 0.1}\n");
  const auto r = run_gputrain("data inspect " + (dir / "c.yaml") + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("1000 tokens"));
}

TEST_CASE("byte tokenizations: gputrain_tokenizer.json now, and folders with the old tokenizer.json still read",
          "[tokens]") {
  TempDir dir;
  write_text(dir / "t.txt", std::string(3000, 'a') + "bc\n");
  REQUIRE(run_gputrain("tokenize " + (dir / "t.txt") + " --out " + (dir / "new")).exit_code == 0);
  CHECK(fs::exists(dir / "new/gputrain_tokenizer.json"));
  CHECK(!fs::exists(dir / "new/tokenizer.json"));
  CHECK(load_tokenizer(dir / "new/gputrain_tokenizer.json")->kind() == "bytes");
  // A folder as tokenize wrote it before: tokenizer.json of type bytes, no manifest.
  fs::create_directories(dir / "old");
  fs::copy_file(dir / "new/train_000000.bin", dir / "old/train_000000.bin");
  fs::copy_file(dir / "new/val_000000.bin", dir / "old/val_000000.bin");
  write_text(
      dir / "old/tokenizer.json",
      R"j({"type": "bytes", "vocab_size": 256, "format": "llm.c token shards (magic 20240520, version 1, uint16 tokens)"})j");
  CHECK(tokenizer_file_in(dir / "old") == dir / "old/tokenizer.json");
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(dir / "old/tokenizer.json");
  CHECK(tok->kind() == "bytes");
  CHECK(tok->decode(tok->encode("héllo")) == "héllo");
  // A Hugging Face tokenizer.json is recognised by its content and read by the byte-level BPE reader, which names
  // what it lacks.
  write_text(dir / "hf.json", R"({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  CHECK_THROWS_WITH(load_tokenizer(dir / "hf.json"), Catch::Contains("hf.json: pre_tokenizer"));
  CHECK(load_tokenizer(source_path("tests/reference/bpe/gpt2_style.tokenizer.json"))->kind() ==
        "byte-level BPE (tokenizer.json)");
  // A run on the old folder trains, eval reports bits per byte, and tokenize --force replaces the folder.
  write_text(dir / "c.yaml", "name: b\ndevice: cpu\ndata: {format: tokens, train: {path: " + (dir / "old/train_*.bin") +
                                 "}, test: {path: " + (dir / "old/val_*.bin") +
                                 "}, block_size: 16, batch_size: 4}\nmodel:\n" +
                                 indented(gpt_layers(256, 8, 16, 1, 2, 16)) +
                                 "loss: cross_entropy\noptimizer: {type: adamw, lr: 0.001}\ntrain: {epochs: 1}\n");
  const auto check = run_gputrain("check " + (dir / "c.yaml") + " 2>&1");
  INFO(check.output);
  CHECK(check.exit_code == 0);
  const auto again = run_gputrain("tokenize " + (dir / "t.txt") + " --force --out " + (dir / "old") + " 2>&1");
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(!fs::exists(dir / "old/tokenizer.json"));
  CHECK(fs::exists(dir / "old/gputrain_tokenizer.json"));
}

TEST_CASE("a malformed tokenizer, or one larger than the model, is exit 2 naming the file", "[tokens]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 60; ++i) text += corpus_doc(i);
  write_text(dir / "t.txt", text);
  SubwordOptions o;
  o.vocab_size = 600;
  tokenize_subword({dir / "t.txt"}, dir / "d", 0.2, 100000, false, o);
  const std::string model = slurp(dir / "d/tokenizer.model");
  write_text(dir / "cut.model", model.substr(0, model.size() / 2));
  auto config = [&](const std::string& tokenizer, int64_t vocab) {
    write_text(dir / "c.yaml", "name: m\ndevice: cpu\ndata: {format: tokens, train: {path: " + (dir / "d/train_*.bin") +
                                   "}, block_size: 16" + (tokenizer.empty() ? "" : ", tokenizer: " + tokenizer) +
                                   "}\nmodel:\n" + indented(gpt_layers(vocab, 8, 16, 1, 2, 16)) +
                                   "loss: cross_entropy\noptimizer: {type: sgd, lr: 0.1}\n");
    return run_gputrain("check " + (dir / "c.yaml") + " 2>&1");
  };
  auto r = config(dir / "cut.model", 600);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("data.tokenizer") && Catch::Contains("cut.model"));
  CHECK(lines_of(r.output).size() == 1);
  r = config(dir / "nope.model", 600);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("data.tokenizer") && Catch::Contains("nope.model"));
  // Found beside the shards: the model's 256 classes cannot hold its 600 ids.
  r = config("", 256);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("tokenizer.model has a vocabulary of 600 tokens"));
  CHECK(lines_of(r.output).size() == 1);
  CHECK(config("", 600).exit_code == 0);
  // An empty file and JSON of another kind are refused too.
  write_text(dir / "empty.model", "");
  CHECK_THROWS_AS(load_tokenizer(dir / "empty.model"), ConfigError);
  write_text(dir / "other.json", R"({"type": "words"})");
  CHECK_THROWS_WITH(load_tokenizer(dir / "other.json"), Catch::Contains("other.json"));
}

TEST_CASE("a GPT on SentencePiece tokens trains, evaluates in bits per byte and generates text", "[tokens]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 120; ++i) text += corpus_doc(i);
  write_text(dir / "t.txt", text);
  const auto tok = run_gputrain("tokenize " + (dir / "t.txt") + " --vocab-size 600 --out " + (dir / "d") + " 2>&1");
  INFO(tok.output);
  REQUIRE(tok.exit_code == 0);
  write_text(dir / "c.yaml",
             "name: s\ndevice: cpu\nseed: 1\ndata: {format: tokens, train: {path: " + (dir / "d/train_*.bin") +
                 "}, test: {path: " + (dir / "d/val_*.bin") + "}, block_size: 16, batch_size: 4}\nmodel:\n" +
                 indented(gpt_layers(600, 16, 16, 1, 2, 32)) +
                 "loss: cross_entropy\noptimizer: {type: adamw, lr: 0.003}\n"
                 "train: {epochs: 1, max_steps: 20, eval_tokens: 512}\n");
  const auto r = run_gputrain("train " + (dir / "c.yaml") + " --quiet --threads 2 --out " + (dir / "run") + " 2>&1");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // The run keeps the tokenizer; bits per byte are the loss over the targets' bytes, not over tokens.
  CHECK(slurp(dir / "run/tokenizer.model") == slurp(dir / "d/tokenizer.model"));
  const std::string summary = read_text(dir / "run/summary.json");
  const double loss = json_number(summary, "test_loss").value_or(-1),
               bpb = json_number(summary, "test_bpb").value_or(-1);
  const std::unique_ptr<Tokenizer> sp = load_tokenizer(dir / "d/tokenizer.model");
  const TokenWindows w(glob_files(dir / "d/val_*.bin"), 16, 600);
  const int64_t windows = std::min<int64_t>(w.windows(), 32);
  int64_t bytes = 0;
  std::vector<float> x(16);
  std::vector<int32_t> y(16);
  for (int64_t i = 0; i < windows; ++i) {
    w.window(i, x.data(), y.data());
    const std::vector<uint32_t> ids(y.begin(), y.end());
    bytes += static_cast<int64_t>(sp->decode(ids).size());  // </s> decodes to nothing
  }
  CHECK(bpb == Approx(loss * static_cast<double>(windows * 16) / (std::log(2.0) * static_cast<double>(bytes))));
  CHECK(bpb != Approx(loss / std::log(2.0)));
  // generate encodes the prompt and prints text; the run's copy is found with the weights.
  fs::remove(dir / "d/tokenizer.model");
  const auto g = run_gputrain("generate " + (dir / "c.yaml") + " --checkpoint " + (dir / "run") +
                              " --prompt 'Café 😀' --tokens 30 --ignore-eot --seed 2");
  INFO(g.output);
  REQUIRE(g.exit_code == 0);
  CHECK(g.output.rfind("Café 😀", 0) == 0);
  CHECK(g.output.size() > std::string("Café 😀").size());
  CHECK_THAT(g.output, Catch::Contains("tokenizer " + (dir / "run/tokenizer.model")));  // (stderr's line)
}

TEST_CASE("generate's text never ends a write inside a UTF-8 character, and --stop ends it", "[tokens]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 40; ++i) text += corpus_doc(i);
  write_text(dir / "t.txt", text);
  SubwordOptions o;
  o.vocab_size = 600;
  tokenize_subword({dir / "t.txt"}, dir / "d", 0.2, 100000, false, o);
  write_text(dir / "c.yaml", "name: u\ndevice: cpu\ndata: {format: tokens, train: {path: " + (dir / "d/train_*.bin") +
                                 "}, block_size: 16}\nmodel:\n" + indented(gpt_layers(600, 8, 16, 1, 2, 16)) +
                                 "loss: cross_entropy\noptimizer: {type: sgd, lr: 0.1}\n");
  REQUIRE(run_gputrain("train " + (dir / "c.yaml") + " --quiet --max-steps 1 --out " + (dir / "run")).exit_code == 0);
  const Experiment exp = parse_experiment_without_data_files(load_config(dir / "c.yaml", {}));
  GenerateOptions opts;
  opts.checkpoint = dir / "run";
  opts.prompt = "ab";
  opts.has_prompt = true;
  opts.tokens = 300;
  opts.stop_at_end = false;
  opts.sampling.temperature = 3;  // untrained weights at a high temperature draw byte pieces (<0xF0> …) often
  opts.sampling.seed = 5;
  std::vector<std::string> writes;
  const GenerateSummary r = generate_text(exp, opts, [&](const std::string& s) { writes.push_back(s); });
  CHECK(r.text);
  CHECK(r.tokenizer == dir / "run/tokenizer.model");
  REQUIRE(writes.size() > 2);
  CHECK(writes[0] == "ab");
  std::string all;
  int split_characters = 0;  // writes that had to wait: a token's bytes ended inside a character
  std::vector<size_t> ends;  // where each write ends in the whole text
  for (const std::string& w : writes) ends.push_back((all += w).size());
  // No write ends inside a well-formed character (a lead byte and all its continuation bytes); a malformed one (a
  // lead byte whose sequence never completes) goes out as it is.
  std::vector<bool> inside(all.size() + 1, false);
  for (size_t i = 0; i < all.size();) {
    const auto c = static_cast<uint8_t>(all[i]);
    const size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    bool whole = i + len <= all.size();
    for (size_t k = 1; whole && k < len; ++k) whole = (static_cast<uint8_t>(all[i + k]) & 0xC0) == 0x80;
    if (!whole) {
      ++i;
      continue;
    }
    for (size_t k = 1; k < len; ++k) inside[i + k] = true;
    i += len;
  }
  int multibyte = 0;
  for (size_t i = 0; i < all.size(); ++i) multibyte += inside[i];
  CHECK(multibyte > 20);  // the draw did print characters of several bytes
  for (const size_t e : ends) CHECK(!inside[e]);
  // The same text as the tokens decoded whole: the waiting lost and reordered nothing.
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(dir / "run/tokenizer.model");
  for (uint32_t id = 0; id < tok->vocab_size(); ++id) split_characters += ends_inside_character(tok->token_bytes(id));
  CHECK(split_characters > 0);  // the vocabulary has pieces that end inside a character (the byte pieces)
  CHECK(all.size() > 2);
  // --stop: the text up to the first occurrence of a string from the middle of it, which is not printed.
  const std::string stop = all.substr(all.size() / 2, 2);
  opts.stop = stop;
  std::string stopped;
  const GenerateSummary s = generate_text(exp, opts, [&](const std::string& w) { stopped += w; });
  CHECK(s.stopped == "--stop");
  CHECK(stopped == all.substr(0, all.find(stop, 2)));
}

TEST_CASE("tokenize --tokenizer with a tokenizer.json gives each document's own ids, cut into pieces or not",
          "[tokens][text]") {
  // Documents of 150 KB each: cut into pieces of about 64 KiB before lone spaces and encoded on two threads, they
  // must come out as the tokenizer encodes them whole, an end-of-text id (if it has one) first.
  TempDir dir;
  std::string a, b;
  for (int i = 0; a.size() < 150000; ++i) a += corpus_doc(i) + " ";
  for (int i = 500; b.size() < 150000; ++i) b += corpus_doc(i) + "  \n";
  write_text(dir / "a.txt", a);
  write_text(dir / "b.txt", b);
  for (const char* style : {"gpt2_style", "llama3_style"}) {
    INFO(style);
    const std::string json = source_path(std::string("tests/reference/bpe/") + style + ".tokenizer.json");
    SubwordOptions o;
    o.tokenizer = json;
    const std::string out = dir / style;
    const TokenizeResult r = tokenize_subword({dir / "a.txt", dir / "b.txt"}, out, 0.0, 1 << 30, false, o);
    CHECK(r.tokenizer_file == "tokenizer.json");
    CHECK(slurp(out + "/tokenizer.json") == slurp(json));
    const std::unique_ptr<Tokenizer> tok = load_tokenizer(json);
    std::vector<uint32_t> want;
    for (const std::string* doc : {&a, &b}) {
      if (tok->end_of_text()) want.push_back(*tok->end_of_text());
      const std::vector<uint32_t> ids = tok->encode(*doc);
      want.insert(want.end(), ids.begin(), ids.end());
    }
    CHECK(shard_ids(r.files) == want);
  }
  // llm.c's gpt2_tokenizer.bin only decodes: tokenize refuses it, naming it.
  std::string bin(1024, '\0');
  const uint32_t header[4] = {20240328, 2, 1, 0};
  std::memcpy(bin.data(), header, sizeof header);
  bin += std::string(1, '\1') + "a";
  write_text(dir / "gpt2_tokenizer.bin", bin);
  SubwordOptions llmc;
  llmc.tokenizer = dir / "gpt2_tokenizer.bin";
  CHECK_THROWS_WITH(tokenize_subword({dir / "a.txt"}, dir / "llmc", 0.1, 1 << 20, false, llmc),
                    Catch::Contains("gpt2_tokenizer.bin") && Catch::Contains("llm.c"));
}

TEST_CASE("import llmc --tokenizer keeps llm.c's gpt2_tokenizer.bin with the model, and generate prints its text",
          "[tokens][text]") {
  TempDir dir;
  const LlmcHeader h = tiny_llmc(3);  // vocabulary 60
  write_llmc(dir / "model.bin", random_checkpoint(h, 5));
  // llm.c's layout, version 2: 256 uint32 of header (magic, version, vocabulary, end-of-text id), then each token's
  // length and bytes. Token i is the letter 'a' + i % 26 and, from 26 on, a space before it.
  std::string bin(1024, '\0');
  const uint32_t header[4] = {20240328, 2, 60, 59};
  std::memcpy(bin.data(), header, sizeof header);
  for (int i = 0; i < 60; ++i) {
    const std::string piece = std::string(i >= 26 ? " " : "") + static_cast<char>('a' + i % 26);
    bin += static_cast<char>(piece.size()) + piece;
  }
  write_text(dir / "gpt2_tokenizer.bin", bin);
  const auto imp = run_gputrain(fmt::format("import llmc {} --out {} --tokenizer {}", dir / "model.bin", dir / "imp",
                                            dir / "gpt2_tokenizer.bin"));
  INFO(imp.output);
  REQUIRE(imp.exit_code == 0);
  CHECK(slurp(dir / "imp/gpt2_tokenizer.bin") == bin);
  CHECK_THAT(slurp(dir / "imp/config.yaml"), Catch::Contains("tokenizer: " + (dir / "imp/gpt2_tokenizer.bin")));
  // The prompt is ids (the file cannot encode); what comes out is text: letters and spaces only.
  const auto gen = run_gputrain(fmt::format("generate {} --checkpoint {} --prompt 0,27 --tokens 12 --seed 3",
                                            dir / "imp/config.yaml", dir / "imp"));
  INFO(gen.output);
  REQUIRE(gen.exit_code == 0);
  const std::string text = gen.output.substr(0, gen.output.find("generated "));
  CHECK(text.rfind("a b", 0) == 0);
  CHECK(text.find_first_not_of("abcdefghijklmnopqrstuvwxyz \n") == std::string::npos);
  // A tokenizer with more tokens than the model's vocabulary is refused before the folder is written.
  const uint32_t big[4] = {20240328, 2, 61, 60};
  std::string bigger = bin;
  std::memcpy(bigger.data(), big, sizeof big);
  bigger += std::string(1, '\1') + "z";
  write_text(dir / "big.bin", bigger);
  const auto refused = run_gputrain(
      fmt::format("import llmc {} --out {} --tokenizer {}", dir / "model.bin", dir / "imp2", dir / "big.bin"));
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("more than the model's vocabulary of 60"));
  CHECK_FALSE(std::filesystem::exists(dir / "imp2/config.yaml"));
}
