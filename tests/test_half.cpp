// The bf16/fp16 conversions (core/half.h): every 16-bit pattern of each format round-trips, f32 → half agrees with a
// slow nearest-value search in double on edge and random floats (ties to even, subnormals, overflow), and the
// vectorised bulk conversions agree with the scalar ones bit for bit.
#include "core/half.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

// A check made millions of times: Catch records an assertion only when it fails (each recorded one costs about a
// microsecond, and these loops make several million), with the expression expanded as REQUIRE would.
#define REQUIRE_EACH(...)   \
  do {                      \
    if (!(__VA_ARGS__)) {   \
      REQUIRE(__VA_ARGS__); \
    }                       \
  } while (false)

using gt::HalfFormat;

namespace {

float to_float(HalfFormat f, uint16_t h) { return f == HalfFormat::bf16 ? gt::bf16_to_float(h) : gt::fp16_to_float(h); }
uint16_t to_half(HalfFormat f, float x) { return f == HalfFormat::bf16 ? gt::float_to_bf16(x) : gt::float_to_fp16(x); }
bool half_is_nan(HalfFormat f, uint16_t h) {
  return f == HalfFormat::bf16 ? (h & 0x7FFF) > 0x7F80 : (h & 0x7FFF) > 0x7C00;
}
uint16_t inf_code(HalfFormat f) { return f == HalfFormat::bf16 ? 0x7F80 : 0x7C00; }
const char* name(HalfFormat f) { return f == HalfFormat::bf16 ? "bf16" : "fp16"; }

// The non-negative finite values of a format in increasing order, decoded independently of the code under test: a
// normal is (1 + m/2^mbits) · 2^(e - bias), a subnormal m/2^mbits · 2^(1 - bias), computed in double with ldexp.
struct Table {
  std::vector<double> value;
  std::vector<uint16_t> code;
  double past_max = 0;  // the next value after the largest finite one, had the format one more exponent
};

Table make_table(HalfFormat f) {
  const int mbits = f == HalfFormat::bf16 ? 7 : 10, ebits = f == HalfFormat::bf16 ? 8 : 5;
  const int bias = (1 << (ebits - 1)) - 1, emax = (1 << ebits) - 1;
  Table t;
  for (int e = 0; e < emax; ++e)
    for (int m = 0; m < (1 << mbits); ++m) {
      const double v = e == 0 ? std::ldexp(m, 1 - bias - mbits) : std::ldexp((1 << mbits) + m, e - bias - mbits);
      t.value.push_back(v);
      t.code.push_back(static_cast<uint16_t>((e << mbits) | m));
    }
  t.past_max = std::ldexp(1.0, emax - bias);
  return t;
}

// The nearest value of the format to x (ties to the even code), ±Inf past the largest finite plus half an ulp; the
// slow, obviously-correct reference for finite x.
uint16_t reference(HalfFormat f, const Table& t, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const auto it = std::lower_bound(t.value.begin(), t.value.end(), a);
  const auto i = static_cast<size_t>(it - t.value.begin());
  if (i < t.value.size() && t.value[i] == a) return sign | t.code[i];
  const double hi = i < t.value.size() ? t.value[i] : t.past_max;
  const uint16_t hi_code = i < t.value.size() ? t.code[i] : inf_code(f);
  const double lo = t.value[i - 1];  // a > 0 here, and 0 is the first entry
  const uint16_t lo_code = t.code[i - 1];
  const double dlo = a - lo, dhi = hi - a;  // exact: both are differences of nearby floats
  if (dlo < dhi) return sign | lo_code;
  if (dhi < dlo) return sign | hi_code;
  return sign | ((lo_code & 1) == 0 ? lo_code : hi_code);
}

}  // namespace

TEST_CASE("half: every bf16 and fp16 pattern round-trips through f32, and NaN stays NaN", "[cpu]") {
  for (HalfFormat f : {HalfFormat::bf16, HalfFormat::fp16}) {
    INFO(name(f));
    int nans = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
      const auto h16 = static_cast<uint16_t>(h);
      const float x = to_float(f, h16);
      if (half_is_nan(f, h16)) {
        ++nans;
        REQUIRE(std::isnan(x));
        REQUIRE(half_is_nan(f, to_half(f, x)));
        // the quiet bit set, the payload kept
        REQUIRE((to_half(f, x) | (f == HalfFormat::bf16 ? 0x40 : 0x200)) ==
                (h16 | (f == HalfFormat::bf16 ? 0x40 : 0x200)));
      } else if (to_half(f, x) != h16) {
        INFO("pattern " << h);
        REQUIRE(to_half(f, x) == h16);
      }
    }
    CHECK(nans == (f == HalfFormat::bf16 ? 2 * 127 : 2 * 1023));
  }
}

TEST_CASE("half: decoding agrees with the formats' definitions (subnormals, max finite, Inf)", "[cpu]") {
  CHECK(gt::fp16_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(gt::fp16_to_float(0x03FF) == std::ldexp(1023.0f, -24));
  CHECK(gt::fp16_to_float(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
  CHECK(gt::fp16_to_float(0x7BFF) == 65504.0f);
  CHECK(gt::fp16_to_float(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(std::signbit(gt::fp16_to_float(0x8000)));
  CHECK(gt::bf16_to_float(0x7F7F) == std::ldexp(255.0f, 120));  // bf16's largest finite, (2 - 2^-7) · 2^127
  CHECK(gt::bf16_to_float(0x0001) == std::ldexp(1.0f, -133));   // f32's subnormals are bf16's too
  const Table fp16 = make_table(HalfFormat::fp16), bf16 = make_table(HalfFormat::bf16);
  for (size_t i = 0; i < fp16.value.size(); ++i) REQUIRE_EACH(gt::fp16_to_float(fp16.code[i]) == fp16.value[i]);
  for (size_t i = 0; i < bf16.value.size(); ++i) REQUIRE_EACH(gt::bf16_to_float(bf16.code[i]) == bf16.value[i]);
}

TEST_CASE("half: f32 to bf16/fp16 rounds to nearest even, as a search in double finds, on edges and random floats",
          "[cpu]") {
  std::mt19937_64 rng(15);
  for (HalfFormat f : {HalfFormat::bf16, HalfFormat::fp16}) {
    INFO(name(f));
    const Table t = make_table(f);
    std::vector<float> xs;
    // Every value, every midpoint between neighbours (the ties) and the floats either side of each midpoint; past
    // the largest finite value: its midpoint to the next power (overflow to Inf by the tie rule) and around it.
    for (size_t i = 0; i < t.value.size(); ++i) {
      const double next = i + 1 < t.value.size() ? t.value[i + 1] : t.past_max;
      const auto mid = static_cast<float>((t.value[i] + next) / 2);  // exact: one more bit than the format
      REQUIRE_EACH(static_cast<double>(mid) == (t.value[i] + next) / 2);
      for (float x : {static_cast<float>(t.value[i]), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e38f)}) {
        xs.push_back(x);
        xs.push_back(-x);
      }
    }
    xs.push_back(std::numeric_limits<float>::max());
    xs.push_back(std::numeric_limits<float>::denorm_min());
    xs.push_back(std::numeric_limits<float>::min());
    // Random bit patterns (all of f32's range) and random floats within the format's range, two million in all.
    std::uniform_int_distribution<uint32_t> bits;
    std::uniform_int_distribution<int> exps(f == HalfFormat::bf16 ? -140 : -27, f == HalfFormat::bf16 ? 127 : 16);
    for (int i = 0; i < 1'000'000; ++i) {
      const float b = std::bit_cast<float>(bits(rng));
      if (std::isfinite(b)) xs.push_back(b);
      const float m = 1.0f + static_cast<float>(bits(rng) >> 9) * 0x1p-23f;
      xs.push_back(std::ldexp((bits(rng) & 1) ? -m : m, exps(rng)));
    }
    for (float x : xs) {
      if (to_half(f, x) == reference(f, t, x)) continue;
      INFO("x = " << x << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(x) << ")");
      REQUIRE(to_half(f, x) == reference(f, t, x));
    }
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(to_half(f, inf) == inf_code(f));
    CHECK(to_half(f, -inf) == (0x8000 | inf_code(f)));
    CHECK(half_is_nan(f, to_half(f, std::numeric_limits<float>::quiet_NaN())));
    CHECK(half_is_nan(f, to_half(f, std::numeric_limits<float>::signaling_NaN())));
    CHECK(half_is_nan(f, to_half(f, std::bit_cast<float>(0x7F800001u))));  // payload only in bits a half drops
  }
  CHECK(gt::float_to_fp16(65504.0f) == 0x7BFF);
  CHECK(gt::float_to_fp16(65519.996f) == 0x7BFF);
  CHECK(gt::float_to_fp16(65520.0f) == 0x7C00);
  CHECK(gt::float_to_fp16(0x1p-25f) == 0x0000);                        // a tie to the even zero
  CHECK(gt::float_to_fp16(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);  // just above: the smallest subnormal
  CHECK(gt::float_to_fp16(0x3p-25f) == 0x0002);                        // 1.5 ulp: a tie to the even 2
  CHECK(gt::float_to_bf16(1.0f + 0x1p-8f) == 0x3F80);                  // a tie to the even 1
  CHECK(gt::float_to_bf16(1.0f + 0x3p-8f) == 0x3F82);                  // a tie to the even 1 + 2^-6
}

TEST_CASE("half: bulk conversions equal the scalar ones bit for bit (NaN payloads included)", "[cpu]") {
  INFO("F16C " << gt::half_bulk_f16c() << ", AVX2 " << gt::half_bulk_avx2());
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  // n not a multiple of 8, so the scalar tail runs too
  std::vector<float> in(1'000'003);
  for (auto& x : in) x = std::bit_cast<float>(bits(rng));
  for (size_t i = 0; i < 64; ++i) in[i] = std::bit_cast<float>(static_cast<uint32_t>(0x7F800000u | i | (i << 16)));
  for (size_t i = 64; i < 128; ++i) in[i] = static_cast<float>(i) * 1024.0f;          // around fp16's overflow
  for (size_t i = 128; i < 192; ++i) in[i] = std::ldexp(static_cast<float>(i), -30);  // fp16 subnormals
  std::vector<uint16_t> h(in.size()), all(65536);
  std::vector<float> out(in.size()), back(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);

  gt::floats_to_bf16(in.data(), h.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) REQUIRE_EACH(h[i] == gt::float_to_bf16(in[i]));
  gt::floats_to_fp16(in.data(), h.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) REQUIRE_EACH(h[i] == gt::float_to_fp16(in[i]));
  gt::bf16_to_floats(all.data(), back.data(), all.size());
  for (uint32_t i = 0; i < 65536; ++i)
    REQUIRE_EACH(std::bit_cast<uint32_t>(back[i]) == std::bit_cast<uint32_t>(gt::bf16_to_float(all[i])));
  gt::fp16_to_floats(all.data(), back.data(), all.size());
  for (uint32_t i = 0; i < 65536; ++i)
    REQUIRE_EACH(std::bit_cast<uint32_t>(back[i]) == std::bit_cast<uint32_t>(gt::fp16_to_float(all[i])));
  for (HalfFormat f : {HalfFormat::bf16, HalfFormat::fp16}) {
    INFO(name(f));
    gt::round_to_half(f, in.data(), out.data(), in.size());
    for (size_t i = 0; i < in.size(); ++i)
      REQUIRE_EACH(std::bit_cast<uint32_t>(out[i]) == std::bit_cast<uint32_t>(to_float(f, to_half(f, in[i]))));
    std::vector<float> same = in;  // in place
    gt::round_to_half(f, same.data(), same.data(), same.size());
    REQUIRE(std::equal(same.begin(), same.end(), out.begin(),
                       [](float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }));
  }
}
