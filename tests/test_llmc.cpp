// llm.c interchange: the checkpoint header's validation, bf16 rounding, import → export byte for byte, the layout
// check of export, and the imported GPT against the same GPT in PyTorch (tests/tools/torch_gpt2.py).
#include "core/rng.h"
#include "graph/model.h"
#include "helpers.h"
#include "io/llmc.h"
#include "llmc_cases.h"
#include "ops/loss.h"
#include "train/llmc.h"
#include "train/resume.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

using namespace gt;
using gt::test::json_number;
using gt::test::random_checkpoint;
using gt::test::read_text;
using gt::test::run_gputrain;
using gt::test::source_path;
using gt::test::TempDir;
using gt::test::tiny_llmc;

namespace {

std::vector<uint8_t> header_bytes(const std::vector<int32_t>& fields) {
  std::vector<uint8_t> h(kLlmcHeaderBytes, 0);
  std::memcpy(h.data(), fields.data(), fields.size() * 4);
  return h;
}

std::string error_of(const std::vector<uint8_t>& header, uint64_t file_bytes) {
  try {
    parse_llmc_header(header.data(), file_bytes, "m.bin");
  } catch (const DataError& e) {
    return e.what();
  }
  return "no error";
}

template <class T>
std::vector<T> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace

TEST_CASE("llm.c checkpoint headers are validated, naming the file and what was expected", "[cpu][data]") {
  // tiny_llmc(3): 7744 parameters (the PyTorch test's model) after the 1024-byte header.
  const std::vector<int32_t> good = {20240326, 3, 8, 60, 2, 2, 16, 64};
  const uint64_t size = kLlmcHeaderBytes + 7744 * 4;
  const LlmcHeader h = parse_llmc_header(header_bytes(good).data(), size, "m.bin");
  CHECK((h.version == 3 && h.max_seq_len == 8 && h.vocab_size == 60 && h.num_layers == 2 && h.num_heads == 2 &&
         h.channels == 16 && h.padded_vocab_size == 64));
  auto with = [&](size_t i, int32_t v) {
    auto f = good;
    f[i] = v;
    return header_bytes(f);
  };
  CHECK(parse_llmc_header(with(1, 5).data(), kLlmcHeaderBytes + 7744 * 2, "m.bin").version == 5);
  CHECK_THAT(error_of(header_bytes(good), 100), Catch::StartsWith("m.bin: 100 bytes, shorter than"));
  CHECK_THAT(error_of(with(0, 20240520), size),
             Catch::StartsWith("m.bin: not an llm.c model checkpoint (magic 20240520, expected 20240326)"));
  CHECK_THAT(error_of(with(1, 4), size), Catch::Contains("version 4 (expected 3, f32 parameters, or 5, bf16)"));
  CHECK_THAT(error_of(with(2, 0), size), Catch::Contains("header max_seq_len is 0, expected 1 to 16777216"));
  CHECK_THAT(error_of(with(4, -3), size), Catch::Contains("header num_layers is -3, expected 1 to 10000"));
  CHECK_THAT(error_of(with(4, 10001), size), Catch::Contains("num_layers is 10001"));
  CHECK_THAT(error_of(with(6, 1 << 25), size), Catch::Contains("channels is 33554432"));
  CHECK_THAT(error_of(with(5, 3), size), Catch::Contains("channels 16 is not a multiple of num_heads 3"));
  CHECK_THAT(error_of(with(3, 65), size), Catch::Contains("vocab_size 65 is more than padded_vocab_size 64"));
  CHECK_THAT(error_of(header_bytes(good), size - 1), Catch::Contains("needs 32000 bytes: 7744 parameters of 4 bytes"));
  CHECK_THAT(error_of(header_bytes(good), size + 4), Catch::Contains("m.bin: 32004 bytes, but its header"));
  CHECK_THAT(error_of(with(1, 5), size), Catch::Contains("needs 16512 bytes"));  // bf16: 2 bytes a parameter
  // The largest sizes each header field allows: the products are checked, not wrapped.
  CHECK_THAT(error_of(header_bytes({20240326, 3, 1 << 24, 1 << 24, 10000, 1, 1 << 24, 1 << 24}), size),
             Catch::Contains("more than 1099511627776 elements"));
}

TEST_CASE("read_llmc refuses files that are not checkpoints with one line naming them", "[cpu][data]") {
  TempDir dir;
  CHECK_THROWS_WITH(read_llmc(dir / "missing.bin"), Catch::StartsWith(dir / "missing.bin: cannot open"));
  CHECK_THROWS_WITH(read_llmc(dir.path()), Catch::Contains("a folder, not a checkpoint file"));
  write_llmc(dir / "m.bin", random_checkpoint(tiny_llmc(3), 1));
  std::filesystem::resize_file(dir / "m.bin", kLlmcHeaderBytes + 7744 * 4 - 2);
  CHECK_THROWS_AS(read_llmc(dir / "m.bin"), DataError);
}

TEST_CASE("bf16 widens exactly and narrows to the nearest value, ties to even", "[cpu]") {
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(from_bits(0x3f808000u)) == 0x3f80);  // a tie: to the even 0x3f80
  CHECK(f32_to_bf16(from_bits(0x3f818000u)) == 0x3f82);  // a tie: to the even 0x3f82
  CHECK(f32_to_bf16(from_bits(0x3f808001u)) == 0x3f81);  // above the tie: up
  CHECK(f32_to_bf16(from_bits(0xbf807fffu)) == 0xbf80);  // below the tie: down, negative too
  CHECK(f32_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80);  // the largest float rounds to infinity
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));  // a NaN whose payload is in the low bits
  CHECK(bits(bf16_to_f32(0x3f82)) == 0x3f820000u);
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every bf16 that is not a NaN survives f32 and back
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (!std::isnan(f)) REQUIRE(f32_to_bf16(f) == b);
  }
}

TEST_CASE("gputrain import llmc then export llmc writes the same bytes, f32 and bf16", "[e2e]") {
  TempDir dir;
  for (const int32_t version : {3, 5}) {
    INFO("version " << version);
    const std::string bin = dir / fmt::format("v{}.bin", version), out = dir / fmt::format("v{}", version);
    write_llmc(bin, random_checkpoint(tiny_llmc(version), 7));
    const auto imp = run_gputrain("import llmc " + bin + " --out " + out);
    INFO(imp.output);
    REQUIRE(imp.exit_code == 0);
    CHECK_THAT(imp.output, Catch::Contains("2 layers, 2 heads, 16 channels, vocabulary 60 padded to 64, 8 positions, "
                                           "7744 parameters"));
    // The config's model builds and takes the weights (its data section waits for the tokens format).
    const ConfigNode cfg = ConfigNode::load_file(out + "/config.yaml");
    CHECK(cfg["data"]["block_size"].as_int() == 8);
    Model m = Model::build(parse_model_spec(cfg["model"]), Shape{8}, DType::f32, Device::cpu(), 0);
    load_weights(m, out + "/model.safetensors");
    CHECK(m.param_count() == 7744);
    const auto named = m.named_params();
    CHECK(named[0].first == "wte.weight");
    CHECK(named[2].first == "h.0.ln_1.weight");
    const std::string flag = version == 5 ? " --bf16" : "";
    const auto exp = run_gputrain("export llmc " + out + "/config.yaml --checkpoint " + out +
                                  "/model.safetensors --out " + dir / "back.bin" + flag);
    INFO(exp.output);
    REQUIRE(exp.exit_code == 0);
    CHECK(read_text(bin) == read_text(dir / "back.bin"));
    CHECK_FALSE(std::filesystem::exists(dir / "back.bin.tmp"));
  }
  // A model that is not llm.c's layout is refused naming the first layer that differs (exit 2, nothing written).
  const std::string cfg = read_text(dir / "v3/config.yaml");
  std::string other = cfg;
  other.replace(other.find("approximate: tanh"), 17, "approximate: none");
  gt::test::write_text(dir / "other.yaml", other);
  const auto bad =
      run_gputrain("export llmc " + dir / "other.yaml" + " --checkpoint " + dir / "v3" + " --out " + dir / "x.bin");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("not llm.c's GPT-2 layout") && Catch::Contains("its layer h.0.5 is"));
  CHECK_FALSE(std::filesystem::exists(dir / "x.bin"));
  std::string no_block = cfg;
  no_block.replace(no_block.find("repeat: 2"), 9, "repeat: 1");
  gt::test::write_text(dir / "short.yaml", no_block);
  const auto mismatch =
      run_gputrain("export llmc " + dir / "short.yaml" + " --checkpoint " + dir / "v3" + " --out " + dir / "x.bin");
  CHECK(mismatch.exit_code == 1);  // the layout fits, the weights do not: load_weights lists them
  CHECK_THAT(mismatch.output, Catch::Contains("h.1.attn.qkv.weight: in the file but not in the model"));
  // A file that is not a checkpoint: exit 1, one line naming it.
  const auto junk = run_gputrain("import llmc " + dir / "v3/config.yaml" + " --out " + dir / "j");
  CHECK(junk.exit_code == 1);
  CHECK_THAT(junk.output, Catch::Contains("v3/config.yaml: not an llm.c model checkpoint"));
  CHECK(gt::test::lines_of(junk.output).size() == 1);
  CHECK_FALSE(std::filesystem::exists(dir / "j"));
  // A run directory is not written into (exit 2), as export --to and report --out refuse its files.
  std::filesystem::create_directories(dir / "run/checkpoints");
  const auto into_run = run_gputrain("import llmc " + dir / "v3.bin" + " --out " + dir / "run");
  CHECK(into_run.exit_code == 2);
  CHECK_THAT(into_run.output, Catch::Contains("holds an unfinished run (checkpoints)"));
  CHECK_FALSE(std::filesystem::exists(dir / "run/model.safetensors"));
  const auto usage = run_gputrain("export " + dir / "v3");
  CHECK(usage.exit_code == 2);
}

// The same GPT in PyTorch (Debian's python3-torch): weights exchanged through llm.c's format, the logits and the
// gradients of the mean cross-entropy over the real vocabulary compared.
TEST_CASE("a GPT imported from llm.c's format computes PyTorch's logits and gradients", "[e2e]") {
  TempDir dir;
  const int64_t B = 2, T = 8, V = 60;
  const std::string py = "/usr/bin/python3 " + source_path("tests/tools/torch_gpt2.py") + " " + dir.path() + " > " +
                         dir / "py.log" + " 2>&1";
  const int rc = std::system(py.c_str());
  INFO(read_text(dir / "py.log"));
  REQUIRE(rc == 0);
  const auto imp = run_gputrain("import llmc " + dir / "model.bin" + " --out " + dir / "imp");
  INFO(imp.output);
  REQUIRE(imp.exit_code == 0);

  const ConfigNode cfg = ConfigNode::load_file(dir / "imp/config.yaml");
  Model m = Model::build(parse_model_spec(cfg["model"]), Shape{T}, DType::f32, Device::cpu(), 0);
  load_weights(m, dir / "imp/model.safetensors");
  m.allocate(B);
  const auto tokens = read_raw<int32_t>(dir / "tokens.i32"), targets = read_raw<int32_t>(dir / "targets.i32");
  const auto want_logits = read_raw<float>(dir / "logits.f32");
  REQUIRE((tokens.size() == static_cast<size_t>(B * T) && want_logits.size() == static_cast<size_t>(B * T * V)));
  Tensor x = Tensor::empty(Shape{B, T}, DType::f32), labels = Tensor::empty(Shape{B * T}, DType::i32);
  for (int64_t i = 0; i < B * T; ++i) {
    x.data<float>()[i] = static_cast<float>(tokens[static_cast<size_t>(i)]);
    labels.data<int32_t>()[i] = targets[static_cast<size_t>(i)];
  }
  const Tensor& logits = m.forward(x, {true, false});
  REQUIRE(logits.shape() == Shape{B, T, V});
  double worst = 0;
  for (int64_t i = 0; i < logits.numel(); ++i)
    worst = std::max(worst, std::abs(double(logits.data<float>()[i]) - want_logits[static_cast<size_t>(i)]));
  CHECK(worst <= 1e-5);

  // The mean over every token: scale 1/(B·T), as F.cross_entropy's default reduction.
  Tensor dlogits = Tensor::empty(Shape{B * T, V}, DType::f32), stats = Tensor::zeros(Shape{2}, DType::f64);
  ops::cross_entropy(logits.view(Shape{B * T, V}), labels, 0.0, 1.0 / (B * T), dlogits, stats);
  CHECK(stats.data<double>()[0] / (B * T) == Approx(std::stod(read_text(dir / "loss.txt"))).epsilon(1e-6));
  m.backward(dlogits.view(Shape{B, T, V}), {true, false});

  const LlmcCheckpoint grads = read_llmc(dir / "grads.bin");
  std::map<std::string, Tensor> want;
  for (auto& [name, t] : llmc_to_named(grads)) want[name] = t;
  const auto named = m.named_params();
  REQUIRE(named.size() == want.size());
  for (const auto& [name, p] : named) {
    INFO(name);
    REQUIRE(want.count(name) == 1);
    const Tensor& w = want[name];
    REQUIRE(w.shape() == p->grad.shape());
    double diff = 0, size = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      diff = std::max(diff, std::abs(double(p->grad.data<float>()[i]) - w.data<float>()[i]));
      size = std::max(size, std::abs(double(w.data<float>()[i])));
    }
    CHECK(diff <= 1e-4);
    CHECK(size > 1e-3);  // every parameter gets a gradient here, so the comparison is not between zeros
  }

  // The command a user runs on an imported model: `gputrain eval` with the test shards set on the command line
  // prints PyTorch's loss. Each sequence becomes one llm.c token shard of T + 1 tokens (one window).
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = static_cast<int32_t>(T + 1);
    std::vector<uint16_t> seq;
    for (int64_t t = 0; t < T; ++t) seq.push_back(static_cast<uint16_t>(tokens[static_cast<size_t>(b * T + t)]));
    seq.push_back(static_cast<uint16_t>(targets[static_cast<size_t>(b * T + T - 1)]));
    std::ofstream f(dir / ("shard_" + std::to_string(b) + ".bin"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    f.write(reinterpret_cast<const char*>(seq.data()), static_cast<std::streamsize>(2 * seq.size()));
  }
  const auto e = run_gputrain("eval " + dir / "imp/config.yaml" + " --checkpoint " + dir / "imp/model.safetensors" +
                              " --set data.test.path=" + dir / "shard_*.bin" + " --set data.block_size=8 --json");
  INFO(e.output);
  REQUIRE(e.exit_code == 0);
  CHECK(json_number(e.output, "tokens") == B * T);
  CHECK(json_number(e.output, "test_loss").value_or(0) == Approx(std::stod(read_text(dir / "loss.txt"))).epsilon(1e-6));
  // Training asks for training shards, which the imported config leaves to the user.
  const auto t = run_gputrain("train " + dir / "imp/config.yaml" + " --set data.test.path=" + dir / "shard_*.bin" +
                              " --out " + dir / "run");
  CHECK(t.exit_code == 2);
  CHECK_THAT(t.output, Catch::Contains("data: tokens: training needs data.train"));
}

TEST_CASE("import llmc refuses a checkpoint whose GPT is larger than gputrain takes, naming the file", "[cpu][data]") {
  TempDir dir;
  // Valid for llm.c (a 32 MiB file), but each sample's logits would be 2^22 × 2^22 elements, past limits::kElements.
  LlmcHeader h;
  h.max_seq_len = 1 << 22;
  h.vocab_size = h.padded_vocab_size = 1 << 22;
  h.num_layers = h.num_heads = h.channels = 1;
  LlmcCheckpoint c;
  c.header = h;
  for (const auto& [name, shape] : llmc_tensor_shapes(h))
    c.tensors.emplace_back(name, Tensor::zeros(shape, DType::f32));
  write_llmc(dir / "big.bin", c);
  CHECK_THROWS_WITH(import_llmc(dir / "big.bin", dir / "out"),
                    Catch::StartsWith(dir / "big.bin: a GPT of these sizes is more than gputrain takes") &&
                        Catch::Contains("more than 1099511627776"));
  CHECK_FALSE(std::filesystem::exists(dir / "out"));
}
