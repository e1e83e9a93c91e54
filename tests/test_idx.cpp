// The IDX reader on small files this test writes, plain and gzip-compressed.
#include "data/dataset.h"
#include "helpers.h"

#include <zlib.h>
#include <catch2/catch.hpp>

#include <vector>

using namespace gt;
using gt::test::TempDir;

namespace {

std::vector<uint8_t> idx_bytes(const std::vector<int32_t>& dims, const std::vector<uint8_t>& data, uint8_t type = 8) {
  std::vector<uint8_t> out{0, 0, type, static_cast<uint8_t>(dims.size())};
  for (int32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(d >> s));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    REQUIRE(f);
    REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
    gzclose(f);
  } else {
    test::write_text(path, std::string(bytes.begin(), bytes.end()));
  }
}

std::vector<uint8_t> pixels(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 37 % 256);
  return v;
}

}  // namespace

TEST_CASE("idx round trip, plain and gzip", "[data][cpu]") {
  TempDir dir;
  for (bool gzip : {false, true}) {
    const auto img = pixels(3 * 4 * 5);
    write_file(dir / "img", idx_bytes({3, 4, 5}, img), gzip);
    write_file(dir / "lbl", idx_bytes({3}, {7, 0, 2}), gzip);
    const Dataset ds = read_idx(dir / "img", dir / "lbl", 0.5f);
    CHECK(ds.size() == 3);
    CHECK(ds.input_shape() == Shape{1, 4, 5});
    CHECK(ds.num_classes == 8);
    for (size_t i = 0; i < img.size(); ++i) REQUIRE(ds.inputs.data<float>()[i] == 0.5f * img[i]);
    CHECK(ds.targets.data<int32_t>()[0] == 7);
    CHECK(ds.targets.data<int32_t>()[2] == 2);
  }
}

TEST_CASE("idx errors name the file and the problem", "[data][cpu]") {
  TempDir dir;
  write_file(dir / "lbl", idx_bytes({3}, {1, 2, 3}), false);
  SECTION("bad magic") {
    write_file(dir / "img", idx_bytes({3, 2, 2}, pixels(12), 0x0D), false);
    CHECK_THROWS_WITH(read_idx(dir / "img", dir / "lbl", 1.0f),
                      Catch::Contains(dir / "img") && Catch::Contains("not an unsigned-byte IDX file"));
  }
  SECTION("truncated data") {
    write_file(dir / "img", idx_bytes({3, 2, 2}, pixels(10)), true);
    CHECK_THROWS_WITH(read_idx(dir / "img", dir / "lbl", 1.0f), Catch::Contains("truncated"));
  }
  SECTION("truncated header") {
    write_file(dir / "img", {0, 0, 8, 3, 0, 0}, false);
    CHECK_THROWS_WITH(read_idx(dir / "img", dir / "lbl", 1.0f), Catch::Contains("truncated IDX header"));
  }
  SECTION("label count differs from image count") {
    write_file(dir / "img", idx_bytes({4, 2, 2}, pixels(16)), false);
    CHECK_THROWS_WITH(read_idx(dir / "img", dir / "lbl", 1.0f),
                      Catch::Contains("3 labels for 4 images") && Catch::Contains(dir / "lbl"));
  }
  SECTION("dimensions whose product wraps around") {
    // 2^31 · 8 · 2^30 = 2^64 bytes: a product taken before the check wrapped to 0 and the header passed as empty.
    write_file(dir / "img", idx_bytes({INT32_MIN, 8, 1 << 30}, {}), false);
    CHECK_THROWS_WITH(read_idx_file(dir / "img"), Catch::Contains(dir / "img") && Catch::Contains("over 64 GiB"));
  }
  SECTION("missing file") {
    CHECK_THROWS_WITH(read_idx(dir / "nope", dir / "lbl", 1.0f), Catch::Contains(dir / "nope"));
  }
  SECTION("errors are data errors (exit 1)") {
    write_file(dir / "img", idx_bytes({4, 2, 2}, pixels(16)), false);
    try {
      read_idx(dir / "img", dir / "lbl", 1.0f);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::data);
    }
  }
}
