// safetensors: round trip, the layout other readers expect, and corrupt files refused by name.
#include "core/rng.h"
#include "helpers.h"
#include "io/safetensors.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

using namespace gt;
using gt::test::TempDir;

TEST_CASE("safetensors round trip keeps names, shapes, dtypes and bits", "[cpu]") {
  TempDir dir;
  Tensor a = Tensor::empty(Shape{3, 4}, DType::f32), b = Tensor::empty(Shape{5}, DType::f64);
  Tensor c = Tensor::empty(Shape{2, 1, 3}, DType::i32);
  Rng rng(1, 1);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = static_cast<float>(rng.normal());
  for (int64_t i = 0; i < b.numel(); ++i) b.data<double>()[i] = rng.normal();
  for (int64_t i = 0; i < c.numel(); ++i) c.data<int32_t>()[i] = static_cast<int32_t>(i) - 3;
  write_safetensors(dir / "m.safetensors", {{"layers.1.weight", &a}, {"b", &b}, {"c", &c}}, {{"format", "pt"}});
  CHECK_FALSE(std::filesystem::exists(dir / "m.safetensors.tmp"));
  const auto back = read_safetensors(dir / "m.safetensors");
  REQUIRE(back.size() == 3);
  CHECK(back[0].first == "layers.1.weight");
  CHECK(back[0].second.shape() == a.shape());
  CHECK(std::memcmp(back[0].second.raw(), a.raw(), a.bytes()) == 0);
  CHECK(back[1].second.dtype() == DType::f64);
  CHECK(std::memcmp(back[1].second.raw(), b.raw(), b.bytes()) == 0);
  CHECK(back[2].second.shape() == c.shape());
  CHECK(std::memcmp(back[2].second.raw(), c.raw(), c.bytes()) == 0);

  // The layout: 8-byte little-endian header length, JSON header, data aligned to 8 bytes.
  const std::string raw = test::read_text(dir / "m.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(raw[static_cast<size_t>(i)])) << (8 * i);
  CHECK(n % 8 == 0);
  CHECK(raw.size() == 8 + n + a.bytes() + b.bytes() + c.bytes());
  CHECK_THAT(raw.substr(8, n), Catch::Contains("\"layers.1.weight\": {\"dtype\": \"F32\", \"shape\": [3, 4], "
                                               "\"data_offsets\": [0, 48]}"));
}

TEST_CASE("corrupt safetensors files are refused by name", "[cpu]") {
  TempDir dir;
  Tensor a = Tensor::zeros(Shape{4}, DType::f32);
  write_safetensors(dir / "m.safetensors", {{"w", &a}});
  const std::string raw = test::read_text(dir / "m.safetensors");
  test::write_text(dir / "short.safetensors", raw.substr(0, raw.size() - 3));
  CHECK_THROWS_WITH(read_safetensors(dir / "short.safetensors"),
                    Catch::Contains(dir / "short.safetensors") && Catch::Contains("claims bytes"));
  test::write_text(dir / "tiny.safetensors", "abc");
  CHECK_THROWS_WITH(read_safetensors(dir / "tiny.safetensors"), Catch::Contains("truncated safetensors header"));
  std::string big = raw;
  big[5] = '\x7f';  // an absurd header length
  test::write_text(dir / "big.safetensors", big);
  CHECK_THROWS_WITH(read_safetensors(dir / "big.safetensors"), Catch::Contains("does not fit"));
  // Found by fuzz_safetensors when YAML parsed the header: YAML takes a map as a key, JSON does not, and reading it as
  // a name threw a yaml-cpp exception instead of a DataError. The JSON reader refuses it, and a number as a key, as
  // not JSON, saying where.
  for (const auto& [header, where] :
       {std::pair<std::string, std::string>{"{}    : ", "column 7"}, {"{1: {}}", "object key"}}) {
    test::write_text(dir / "key.safetensors", std::string("\x08\0\0\0\0\0\0\0", 8) + header + " ");
    try {
      read_safetensors(dir / "key.safetensors");
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::data);
      CHECK_THAT(e.what(), Catch::Contains(dir / "key.safetensors") &&
                               Catch::Contains("the header is not valid JSON") && Catch::Contains(where));
    }
  }
  // Duplicate tensor names (JSON leaves it open; a reader that kept the last would load other bytes than another
  // tool) and nesting no safetensors header has are refused.
  for (const auto& [header, why] :
       {std::pair<std::string, std::string>{R"({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, "a": 1})",
                                            "duplicate key \"a\""},
        {R"({"__metadata__": {"x": [[[[[[[[1]]]]]]]]}})", "nested deeper than 8"}}) {
    std::string text = header;
    while (text.size() % 8) text += ' ';
    std::string len(8, '\0');
    for (int i = 0; i < 8; ++i) len[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    test::write_text(dir / "dup.safetensors", len + text + std::string(4, '\0'));
    CHECK_THROWS_WITH(read_safetensors(dir / "dup.safetensors"),
                      Catch::Contains("the header is not valid JSON") && Catch::Contains(why));
  }
}
