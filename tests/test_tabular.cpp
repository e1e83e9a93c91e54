// CSV and NPY readers on files the tests write, and the loader's augmentations.
#include "data/dataset.h"
#include "helpers.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <set>

using namespace gt;
using gt::test::TempDir;

namespace {}  // namespace

TEST_CASE("csv: header detection, label by name or index, classes or values", "[data][cpu]") {
  TempDir dir;
  test::write_text(dir / "a.csv", "f1, f2, species\n1.5, 2, 1\n-3, 4e-1, 0\n\n7, 8, 2\n");
  CsvSpec spec;
  spec.label = "species";
  Dataset ds = read_csv(dir / "a.csv", spec);
  CHECK(ds.size() == 3);
  CHECK(ds.input_shape() == Shape{2});
  CHECK(ds.num_classes == 3);
  CHECK(ds.inputs.data<float>()[2] == -3.0f);
  CHECK(ds.inputs.data<float>()[3] == 0.4f);
  CHECK(ds.targets.data<int32_t>()[2] == 2);

  test::write_text(dir / "b.csv", "1,10,2\n3,30,4\n");
  CsvSpec first_column;
  first_column.label = "-3";  // counted from the end: the first of 3 columns; no header
  first_column.classes = false;
  ds = read_csv(dir / "b.csv", first_column);
  CHECK(ds.target_shape() == Shape{1});
  CHECK(ds.targets.data<float>()[1] == 3.0f);
  CHECK(ds.inputs.data<float>()[0] == 10.0f);
}

TEST_CASE("csv errors name the file, line and field", "[data][cpu]") {
  TempDir dir;
  CsvSpec spec;
  test::write_text(dir / "c.csv", "a,b\n1,2\n3,x\n");
  // Built in two steps: GCC 12 reports a false -Wrestrict on `a + "literal"` here.
  std::string where = dir / "c.csv";
  where.append(":3: field 2 (\"x\") is not a number");
  CHECK_THROWS_WITH(read_csv(dir / "c.csv", spec), Catch::Contains(where));
  test::write_text(dir / "d.csv", "1,2,3\n4,5\n");
  CHECK_THROWS_WITH(read_csv(dir / "d.csv", spec), Catch::Contains(":2: 2 fields, but the file's rows have 3"));
  test::write_text(dir / "e.csv", "a,b\n1,2.5\n");
  CHECK_THROWS_WITH(read_csv(dir / "e.csv", spec), Catch::Contains("class label 2.5 is not a non-negative integer"));
  spec.label = "nope";
  CHECK_THROWS_WITH(read_csv(dir / "e.csv", spec), Catch::Contains("no column named \"nope\""));
  test::write_text(dir / "f.csv", "a,b\n");
  CHECK_THROWS_WITH(read_csv(dir / "f.csv", CsvSpec{}), Catch::Contains("no data rows"));
  // A NUL byte ended the number early, so "1\0x" read as 1 (seen in a fuzz_csv input).
  test::write_text(dir / "nul.csv", std::string("a,b\n1\0x,2\n", 10));
  CHECK_THROWS_WITH(read_csv(dir / "nul.csv", CsvSpec{}), Catch::Contains(":2: field 1"));
  // Found by fuzz_csv: a label index beyond int64 overflowed the cast instead of failing as out of range.
  for (const char* far : {"1e30", "-1e30", "2", "-3"}) {
    spec.label = far;
    CHECK_THROWS_WITH(read_csv(dir / "e.csv", spec),
                      Catch::Contains(std::string("label column ") + far + " is outside the 2 columns"));
  }
}

// No ";" in a test name: Catch.cmake splits the name there, and ctest then runs two filters that match nothing.
TEST_CASE("npy: float32, uint8 and int64 arrays, and errors that name the file", "[data][cpu]") {
  TempDir dir;
  const float x[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const int64_t y[] = {2, 0, 1};
  test::write_npy(dir / "x.npy", "<f4", "(3, 2, 2)", x, sizeof x);
  test::write_npy(dir / "y.npy", "<i8", "(3,)", y, sizeof y);
  Dataset ds = read_npy_pair(dir / "x.npy", dir / "y.npy", 0.5f);
  CHECK(ds.input_shape() == Shape{2, 2});
  REQUIRE(ds.mapped);  // float32 × 0.5: converted from the mapped file as rows are read
  CHECK(!ds.inputs.defined());
  float row[4];
  ds.mapped->row(2, row);
  CHECK(row[3] == 6.0f);
  CHECK(ds.num_classes == 3);
  CHECK(ds.targets.data<int32_t>()[0] == 2);

  const uint8_t u[] = {0, 255, 7};
  const float t[] = {0.5f, -1.0f, 2.0f};
  test::write_npy(dir / "u.npy", "|u1", "(3,)", u, sizeof u);
  test::write_npy(dir / "t.npy", "<f4", "(3,)", t, sizeof t);
  ds = read_npy_pair(dir / "u.npy", dir / "t.npy", 1.0f);
  REQUIRE(ds.mapped);
  ds.mapped->row(1, row);
  CHECK(row[0] == 255.0f);
  CHECK(ds.target_shape() == Shape{1});
  CHECK(ds.num_classes == 0);

  test::write_npy(dir / "short.npy", "<f4", "(4, 2, 2)", x, sizeof x);  // 16 elements promised, 12 written
  CHECK_THROWS_WITH(read_npy(dir / "short.npy"), Catch::Contains(dir / "short.npy") && Catch::Contains("truncated"));
  test::write_npy(dir / "c.npy", "<c8", "(3,)", x, 24);
  CHECK_THROWS_WITH(read_npy(dir / "c.npy"), Catch::Contains("dtype '<c8' is not supported"));
  test::write_text(dir / "bad.npy", "not numpy at all");
  CHECK_THROWS_WITH(read_npy(dir / "bad.npy"), Catch::Contains("bad magic"));
  // 2^34 · 2^30 elements wrapped around to 0 and passed as an empty array.
  test::write_npy(dir / "wrap.npy", "|u1", "(17179869184, 1073741824)", x, 0);
  CHECK_THROWS_WITH(read_npy(dir / "wrap.npy"), Catch::Contains(dir / "wrap.npy") && Catch::Contains("over 16 G"));
  test::write_npy(dir / "y2.npy", "<i8", "(2,)", y, 16);
  CHECK_THROWS_WITH(read_npy_pair(dir / "x.npy", dir / "y2.npy", 1.0f), Catch::Contains("2 targets for 3 samples"));
}

TEST_CASE("augmentation: seeded shifts and flips of each training image", "[data][cpu]") {
  Dataset ds;
  const int64_t n = 200;
  ds.inputs = Tensor::empty(Shape{n, 1, 4, 4}, DType::f32);
  for (int64_t i = 0; i < ds.inputs.numel(); ++i) ds.inputs.data<float>()[i] = 1.0f;
  ds.targets = Tensor::zeros(Shape{n}, DType::i32);
  ds.num_classes = 1;
  Tensor x = Tensor::empty(Shape{n, 1, 4, 4}, DType::f32), y = Tensor::empty(Shape{n}, DType::i32);

  AugmentConfig crop;
  crop.crop_padding = 1;
  Loader loader(ds, n, true, 3, crop);
  loader.start_epoch(0);
  REQUIRE(loader.next(x, y) == n);
  std::set<float> sums;
  for (int64_t i = 0; i < n; ++i) {
    float s = 0;
    for (int k = 0; k < 16; ++k) s += x.data<float>()[i * 16 + k];
    sums.insert(s);
  }
  // A shift by (dy, dx) ∈ {−1, 0, 1}² of an all-ones 4×4 image keeps 16, 12 or 9 ones; all three occur.
  CHECK(sums == std::set<float>{9.0f, 12.0f, 16.0f});

  // The same epoch gives the same draws; flips mirror rows.
  for (int64_t i = 0; i < ds.inputs.numel(); ++i) ds.inputs.data<float>()[i] = static_cast<float>(i % 4);
  AugmentConfig flip;
  flip.hflip = true;
  Loader a(ds, n, false, 3, flip), b(ds, n, false, 3, flip);
  Tensor x2 = Tensor::empty(x.shape(), DType::f32);
  a.start_epoch(1);
  b.start_epoch(1);
  a.next(x, y);
  b.next(x2, y);
  int flipped = 0;
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE(std::memcmp(x.data<float>() + i * 16, x2.data<float>() + i * 16, 64) == 0);
    flipped += x.data<float>()[i * 16] == 3.0f;
  }
  CHECK(flipped > n / 4);
  CHECK(flipped < 3 * n / 4);
}
