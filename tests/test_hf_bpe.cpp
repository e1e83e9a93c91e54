// Byte-level BPE from tokenizer.json against Hugging Face `tokenizers` and tiktoken: the ids of both for the same
// strings (tests/reference/bpe/, written by bench/make_bpe_fixtures.py) must come out exactly; decoding gives the
// bytes back, special tokens stay whole, malformed files are ConfigErrors naming the file. And llm.c's
// gpt2_tokenizer.bin, written here in its layout, decodes.
#include "core/error.h"
#include "core/json_read.h"
#include "helpers.h"
#include "text/hf_bpe.h"
#include "text/llmc_tokenizer.h"
#include "text/pretokenize.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <thread>

using namespace gt;
using namespace gt::test;

namespace {

const std::string kBpeDir = "tests/reference/bpe/";

const JsonValue& bpe_expected() {
  static const JsonValue v = json_read(read_text(source_path(kBpeDir + "expected.json")));
  return v;
}

std::vector<std::string> bpe_samples() {
  std::vector<std::string> out;
  for (const JsonValue& s : bpe_expected().find("samples")->items) out.push_back(s.string);
  return out;
}

std::vector<uint32_t> bpe_ids_of(const JsonValue& list) {
  std::vector<uint32_t> out;
  for (const JsonValue& v : list.items) out.push_back(static_cast<uint32_t>(*v.integer));
  return out;
}

std::string bpe_fixture_text(const std::string& name) {
  return read_text(source_path(kBpeDir + name + ".tokenizer.json"));
}

/// A ConfigError from loading `text` as a file, with its message.
std::string bpe_load_error(const TempDir& dir, const std::string& text) {
  const std::string path = dir / "tokenizer.json";
  write_text(path, text);
  try {
    load_hf_tokenizer(path);
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
    return message;
  }
  FAIL("loading did not throw ConfigError");
  return "";
}

std::string bpe_replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("tokenizer.json: ids equal tokenizers' and tiktoken's, and decoding gives the text back", "[cpu][text]") {
  const std::vector<std::string> texts = bpe_samples();
  for (const std::string name : {"gpt2_style", "llama3_style", "options_style"}) {
    INFO(name);
    const auto tok = load_hf_tokenizer(source_path(kBpeDir + name + ".tokenizer.json"));
    CHECK(tok->kind() == "byte-level BPE (tokenizer.json)");
    const JsonValue& want = *bpe_expected().find(name);
    const JsonValue* tiktoken = want.find("tiktoken");  // options_style has options tiktoken lacks
    REQUIRE(want.find("tokenizers")->items.size() == texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      INFO("sample " << i << ": " << texts[i]);
      const std::vector<uint32_t> ids = tok->encode(texts[i]);
      CHECK(ids == bpe_ids_of(want.find("tokenizers")->items[i]));
      if (tiktoken) CHECK(ids == bpe_ids_of(tiktoken->items[i]));
      // tokenizers' own decoding of the ids, written down where it is not the sample (NFC, prefix spaces, stripped
      // white space around added tokens).
      const JsonValue* decoded = want.find("decoded")->find(std::to_string(i));
      CHECK(tok->decode(ids) == (decoded ? decoded->string : texts[i]));
      CHECK(tok->encode(texts[i]) == ids);  // again, from the word cache
    }
  }
}

TEST_CASE("tokenizer.json: special tokens are found first and never split", "[cpu][text]") {
  const auto gpt2 = load_hf_tokenizer(source_path(kBpeDir + "gpt2_style.tokenizer.json"));
  REQUIRE(gpt2->end_of_text());
  const uint32_t eot = *gpt2->end_of_text();
  CHECK(gpt2->token_bytes(eot) == "<|endoftext|>");
  CHECK(gpt2->encode("<|endoftext|>") == std::vector<uint32_t>{eot});
  for (const std::string around : {"x", " ", "<|", "|>", "endoftext", "\xf0\x9f\x98\x80"}) {
    const std::vector<uint32_t> ids = gpt2->encode(around + "<|endoftext|>" + around);
    CHECK(std::count(ids.begin(), ids.end(), eot) == 1);
    CHECK(gpt2->decode(ids) == around + "<|endoftext|>" + around);
  }
  const auto llama = load_hf_tokenizer(source_path(kBpeDir + "llama3_style.tokenizer.json"));
  // The vocabulary it was trained with keeps <|endoftext|> (as a plain token), the first name looked for.
  REQUIRE(llama->end_of_text());
  CHECK(llama->token_bytes(*llama->end_of_text()) == "<|endoftext|>");
  for (uint32_t id = llama->vocab_size() - 6; id < llama->vocab_size(); ++id) {
    const std::string special = llama->token_bytes(id);
    CHECK(llama->encode("ab" + special + special + "\n") == [&] {
      std::vector<uint32_t> v = llama->encode("ab");
      v.push_back(id), v.push_back(id);
      for (const uint32_t x : llama->encode("\n")) v.push_back(x);
      return v;
    }());
  }
  CHECK_THROWS_AS(llama->token_bytes(llama->vocab_size()), DataError);
}

TEST_CASE("tokenizer.json: any bytes, valid UTF-8 or not, come back from decode, on several threads", "[cpu][text]") {
  const auto tok = load_hf_tokenizer(source_path(kBpeDir + "gpt2_style.tokenizer.json"));
  const auto check = [&](unsigned seed, std::vector<int>& failures) {
    std::mt19937 rng(seed);
    for (int n = 0; n < 200; ++n) {
      std::string s(rng() % 400, '\0');
      const bool ascii = n % 2 == 0;
      for (char& c : s) c = static_cast<char>(ascii ? 32 + rng() % 95 : rng() % 256);
      if (tok->decode(tok->encode(s)) != s) failures.push_back(n);
    }
  };
  std::vector<int> a, b;
  std::thread other(check, 2u, std::ref(b));
  check(1u, a);
  other.join();
  CHECK(a.empty());
  CHECK(b.empty());
}

TEST_CASE("tokenizer.json: Split's behaviors make the pieces tokenizers makes", "[cpu][text]") {
  for (const JsonValue& c : bpe_expected().find("splits")->items) {
    const std::string text = c.find("text")->string, behavior = c.find("behavior")->string;
    INFO(c.find("pattern")->string << " on " << text << ", " << behavior << ", invert " << c.find("invert")->boolean);
    const Pattern pattern(c.find("pattern")->string, false, "test");
    std::vector<std::pair<size_t, size_t>> matches, pieces;
    pattern.find_all(text, matches);
    const std::map<std::string, SplitBehavior> behaviors = {
        {"removed", SplitBehavior::removed},
        {"isolated", SplitBehavior::isolated},
        {"merged_with_previous", SplitBehavior::merged_with_previous},
        {"merged_with_next", SplitBehavior::merged_with_next},
        {"contiguous", SplitBehavior::contiguous}};
    split_pieces(text.size(), matches, behaviors.at(behavior), c.find("invert")->boolean, pieces);
    std::vector<std::string> got, want;
    for (const auto& [b, e] : pieces) got.push_back(text.substr(b, e - b));
    for (const JsonValue& p : c.find("pieces")->items) want.push_back(p.string);
    CHECK(got == want);
  }
}

TEST_CASE("tokenizer.json: malformed files are ConfigErrors naming the file and what", "[cpu][text]") {
  const TempDir dir;
  const std::string gpt2 = bpe_fixture_text("gpt2_style"), llama = bpe_fixture_text("llama3_style");
  CHECK(bpe_load_error(dir, gpt2.substr(0, gpt2.size() / 2)).find("not a tokenizer.json") != std::string::npos);
  CHECK(bpe_load_error(dir, "").find("not a tokenizer.json") != std::string::npos);
  CHECK(bpe_load_error(dir, bpe_replaced(gpt2, "\"type\": \"ByteLevel\", \"add_prefix_space\"",
                                         "\"type\": \"Whitespace\", \"add_prefix_space\""))
            .find("\"Whitespace\" is not supported") != std::string::npos);
  CHECK(bpe_load_error(
            dir, bpe_replaced(llama, "\"normalizer\": {\"type\": \"NFC\"}", "\"normalizer\": {\"type\": \"NFKC\"}"))
            .find("\"NFKC\" is not supported") != std::string::npos);
  CHECK(bpe_load_error(dir, bpe_replaced(llama, "\"pretokenizers\": [", "\"pretokenizers\": [], \"x\": ["))
            .find("empty Sequence") != std::string::npos);
  CHECK(bpe_load_error(dir, bpe_replaced(gpt2, "\"type\": \"BPE\"", "\"type\": \"WordPiece\"")).find("model.type") !=
        std::string::npos);
  // A merge naming a token the vocabulary lacks, in both forms.
  CHECK(bpe_load_error(
            dir, bpe_replaced(gpt2, "\"merges\": [[\"", "\"merges\": [[\"\xe2\x82\xac\xe2\x82\xac\", \"a\"], [\""))
            .find("which model.vocab lacks") != std::string::npos);
  CHECK(bpe_load_error(dir, bpe_replaced(llama, "\"merges\": [\"", "\"merges\": [\"zzqq ")).find("model.merges[0]") !=
        std::string::npos);
  // An added token past the vocabulary, or one that leaves an id without a token.
  CHECK(bpe_load_error(dir, bpe_replaced(gpt2, "{\"id\": 0,", "{\"id\": 99999,")).find("past the vocabulary") !=
        std::string::npos);
  CHECK(bpe_load_error(dir, bpe_replaced(gpt2, "\"!\": 1,", "\"!\": 640,")).find("id 1 has no token") !=
        std::string::npos);
  CHECK(bpe_load_error(dir, bpe_replaced(llama, "\"Regex\": \"", "\"Regex\": \"(")).find("does not compile") !=
        std::string::npos);
  CHECK(bpe_load_error(dir, bpe_replaced(gpt2, "\"dropout\": null", "\"dropout\": 0.1")).find("dropout") !=
        std::string::npos);
  CHECK_THROWS_AS(load_hf_tokenizer(dir / "missing.json"), ConfigError);
}

namespace {

/// A tokenizer file as llm.c's dev/data scripts write it: 256 uint32 of header, then length-prefixed tokens.
std::string llmc_tokenizer_file(uint32_t version, const std::vector<std::string>& tokens, uint32_t eot) {
  std::vector<uint32_t> header(256, 0);
  header[0] = 20240328, header[1] = version, header[2] = static_cast<uint32_t>(tokens.size()), header[3] = eot;
  std::string out(1024, '\0');
  std::memcpy(out.data(), header.data(), 1024);
  for (const std::string& t : tokens) out += static_cast<char>(t.size()) + t;
  return out;
}

}  // namespace

TEST_CASE("llm.c gpt2_tokenizer.bin decodes the ids of the same vocabulary", "[cpu][text]") {
  const TempDir dir;
  const auto hf = load_hf_tokenizer(source_path(kBpeDir + "gpt2_style.tokenizer.json"));
  std::vector<std::string> tokens;
  for (uint32_t id = 0; id < hf->vocab_size(); ++id) tokens.push_back(hf->token_bytes(id));
  write_text(dir / "v2.bin", llmc_tokenizer_file(2, tokens, *hf->end_of_text()));
  const auto llmc = load_llmc_tokenizer(dir / "v2.bin");
  CHECK(llmc->vocab_size() == hf->vocab_size());
  CHECK(llmc->end_of_text() == hf->end_of_text());
  for (const std::string& s : bpe_samples()) CHECK(llmc->decode(hf->encode(s)) == s);
  CHECK_THROWS_AS(llmc->encode("text"), ConfigError);
  CHECK_THROWS_AS(llmc->token_bytes(llmc->vocab_size()), DataError);

  // Version 1 is GPT-2's vocabulary: 50257 tokens, end-of-text 50256 whatever the header's fourth word says.
  std::vector<std::string> gpt2(50257, "x");
  gpt2[50256] = "<|endoftext|>";
  write_text(dir / "v1.bin", llmc_tokenizer_file(1, gpt2, 0));
  CHECK(load_llmc_tokenizer(dir / "v1.bin")->end_of_text() == 50256u);

  const auto refused = [&](const std::string& bytes, const std::string& what) {
    write_text(dir / "bad.bin", bytes);
    try {
      load_llmc_tokenizer(dir / "bad.bin");
      FAIL("no ConfigError for " << what);
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).find(dir / "bad.bin") != std::string::npos);
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  const std::string good = llmc_tokenizer_file(2, tokens, 0);
  refused(good.substr(0, good.size() - 1), "cut short");
  refused(good + "x", "after the last token");
  refused(good.substr(0, 100), "header");
  refused(llmc_tokenizer_file(3, tokens, 0), "version 3");
  refused(llmc_tokenizer_file(1, tokens, 0), "version 1 is GPT-2's");
  refused(llmc_tokenizer_file(2, tokens, static_cast<uint32_t>(tokens.size())), "end-of-text id");
  std::string magic = good;
  magic[0] ^= 1;
  refused(magic, "magic");
  refused(llmc_tokenizer_file(2, {"a", "", "b"}, 0), "length 0");
}
