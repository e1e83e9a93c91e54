// The CPU's f32 products (ops/cpu/sgemm.h): each path this CPU runs (our AVX-512 and AVX2+FMA kernels, OpenBLAS)
// against sums in double, around the kernels' tiles and blocks, with both layouts of each operand, beta, the bias
// epilogue and leading dimensions past the rows; and our kernels' promise that splitting C between threads, or
// threading one product (sgemm_threads), changes no bit. A path this CPU cannot run is skipped, saying so.
#include "core/half.h"
#include "core/rng.h"
#include "helpers.h"
#include "ops/cpu/sgemm.h"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

using namespace gt;
using namespace gt::test;

namespace {

constexpr cpu::CpuSgemmPath kSgemmPaths[] = {cpu::CpuSgemmPath::avx512, cpu::CpuSgemmPath::avx2,
                                             cpu::CpuSgemmPath::openblas};

// Whether this CPU runs `path`; WARNs that its tests are skipped when not.
bool sgemm_runs(cpu::CpuSgemmPath path) {
  if (cpu::cpu_sgemm_supported(path)) return true;
  WARN("skipped: this CPU cannot run " << cpu::describe(path) << " (gputrain devices says which it has)");
  return false;
}

struct Shape3 {
  int m, n, k;
};

std::vector<float> sgemm_normals(size_t n, uint64_t seed) {
  Rng rng(seed, 0);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal());
  return v;
}

}  // namespace

TEST_CASE("sgemm: every f32 path this CPU runs matches sums in double", "[cpu]") {
  // m, n, k around the tiles (AVX-512 8 × 32, AVX2 6 × 16), the blocks (k 256, rows 128 / 120, columns 512), a row,
  // a column and a k of one, and C's padding columns, which must never be written.
  const std::tuple<int, int, int> shapes[] = {{1, 1, 1},     {5, 15, 3},   {7, 33, 31},   {8, 32, 256}, {9, 17, 257},
                                              {130, 40, 64}, {3, 530, 33}, {121, 16, 17}, {40, 70, 600}};
  for (const cpu::CpuSgemmPath path : kSgemmPaths) {
    if (!sgemm_runs(path)) continue;
    const ForcedSgemmPath forced(path);
    REQUIRE(cpu::cpu_sgemm_path() == path);
    uint64_t seed = 100;
    for (const auto& [m, n, k] : shapes)
      for (const bool ta : {false, true})
        for (const bool tb : {false, true})
          for (const float beta : {0.0f, 1.0f, 0.5f})
            for (const bool with_bias : {false, true}) {
              INFO(cpu::describe(path) << ": m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb
                                       << " beta " << beta << " bias " << with_bias);
              const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
              const std::vector<float> a = sgemm_normals(static_cast<size_t>((ta ? k : m) * lda), ++seed),
                                       b = sgemm_normals(static_cast<size_t>((tb ? n : k) * ldb), ++seed),
                                       bias = sgemm_normals(static_cast<size_t>(n), ++seed);
              std::vector<float> c0 = sgemm_normals(static_cast<size_t>(m * ldc), ++seed);
              // beta 0 must not read C: NaN there would poison every sum that did.
              if (beta == 0.0f)
                for (int i = 0; i < m; ++i)
                  for (int j = 0; j < n; ++j)
                    c0[static_cast<size_t>(i * ldc + j)] = std::numeric_limits<float>::quiet_NaN();
              auto at = [&](int i, int kk) { return a[static_cast<size_t>(ta ? kk * lda + i : i * lda + kk)]; };
              auto bt = [&](int kk, int j) { return b[static_cast<size_t>(tb ? j * ldb + kk : kk * ldb + j)]; };
              std::vector<float> c = c0;
              cpu::sgemm(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, beta, c.data(), ldc,
                         with_bias ? bias.data() : nullptr);
              double worst = 0;
              for (int i = 0; i < m; ++i)
                for (int j = 0; j < ldc; ++j) {
                  const size_t ci = static_cast<size_t>(i * ldc + j);
                  if (j >= n) {  // padding
                    CHECK(std::bit_cast<uint32_t>(c[ci]) == std::bit_cast<uint32_t>(c0[ci]));
                    continue;
                  }
                  double exact = beta == 0.0f ? 0.0 : beta * double{c0[ci]}, mag = std::fabs(exact);
                  for (int kk = 0; kk < k; ++kk) {
                    exact += double{at(i, kk)} * bt(kk, j);
                    mag += std::fabs(double{at(i, kk)} * bt(kk, j));
                  }
                  if (with_bias) {
                    exact += bias[static_cast<size_t>(j)];
                    mag += std::fabs(double{bias[static_cast<size_t>(j)]});
                  }
                  // f32 sums of k + 2 terms (FMAs: each product exact before its sum), plus beta·c's rounding.
                  const double tol = (k + 3) * 0x1p-24 * mag + 1e-30;
                  worst = std::max(worst, std::fabs(c[ci] - exact) / tol);
                }
              CHECK(worst <= 1);
            }
  }
}

TEST_CASE("sgemm: our kernels give each element of C the same bits wherever C is split", "[cpu]") {
  // gemm_t and the convolutions hand each thread a block of C's rows or columns; results must not depend on the
  // thread count. Blocks that start off the tiles' edges, and k over several blocks of 256.
  const int m = 45, n = 77, k = 600;
  const std::vector<float> a = sgemm_normals(static_cast<size_t>(m * k), 1), b = sgemm_normals(size_t{k} * n, 2),
                           bias = sgemm_normals(size_t{n}, 3);
  for (const cpu::CpuSgemmPath path : {cpu::CpuSgemmPath::avx512, cpu::CpuSgemmPath::avx2}) {
    if (!sgemm_runs(path)) continue;
    const ForcedSgemmPath forced(path);
    INFO(cpu::describe(path));
    for (const bool tb : {false, true}) {
      // tb: b is read as n × k (the same numbers, laid out transposed).
      std::vector<float> bt(b.size());
      for (int kk = 0; kk < k; ++kk)
        for (int j = 0; j < n; ++j) bt[static_cast<size_t>(j * k + kk)] = b[static_cast<size_t>(kk * n + j)];
      const float* pb = tb ? bt.data() : b.data();
      const int ldb = tb ? k : n;
      std::vector<float> whole(static_cast<size_t>(m * n)), rows(whole.size()), cols(whole.size());
      cpu::sgemm(false, tb, m, n, k, a.data(), k, pb, ldb, 0.0f, whole.data(), n, bias.data());
      for (const auto& [r0, r1] : {std::pair{0, 13}, std::pair{13, 30}, std::pair{30, m}})
        cpu::sgemm(false, tb, r1 - r0, n, k, a.data() + r0 * k, k, pb, ldb, 0.0f, rows.data() + r0 * n, n, bias.data());
      for (const auto& [c0, c1] : {std::pair{0, 37}, std::pair{37, 40}, std::pair{40, n}})
        cpu::sgemm(false, tb, m, c1 - c0, k, a.data(), k, tb ? pb + c0 * ldb : pb + c0, ldb, 0.0f, cols.data() + c0, n,
                   bias.data() + c0);
      CHECK(bit_differences(whole, rows) == 0);
      CHECK(bit_differences(whole, cols) == 0);
    }
  }
}

TEST_CASE("sgemm: the AVX2 and AVX-512 kernels give the same bits (k summed in the same order, FMA on both)", "[cpu]") {
  // What lets a run on an AVX2 machine end with an AVX-512 machine's weights (tests/test_cpu_isa.cpp): the tiles
  // differ (6 × 16 against 8 × 32) but each element of C is the same chain of FMAs over k in blocks of 256, then beta·C
  // and the bias in the same order. Shapes around both tiles and the k and column blocks, every layout, beta and the
  // bias; threaded too (shared B on 2 threads).
  if (!sgemm_runs(cpu::CpuSgemmPath::avx512) || !sgemm_runs(cpu::CpuSgemmPath::avx2)) return;
  const std::tuple<int, int, int> shapes[] = {{1, 1, 1},      {7, 33, 31},    {13, 47, 257},
                                              {130, 530, 70}, {300, 40, 600}, {768, 128, 512}};
  uint64_t seed = 900;
  for (const auto& [m, n, k] : shapes)
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const float beta : {0.0f, 0.5f})
          for (const int threads : {1, 2}) {
            INFO("m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb << " beta " << beta
                      << " threads " << threads);
            const int lda = ta ? m : k, ldb = tb ? k : n;
            const std::vector<float> a = sgemm_normals(static_cast<size_t>(m) * k, ++seed),
                                     b = sgemm_normals(static_cast<size_t>(k) * n, ++seed),
                                     bias = sgemm_normals(static_cast<size_t>(n), ++seed),
                                     c0 = sgemm_normals(static_cast<size_t>(m) * n, ++seed);
            std::vector<std::vector<float>> c;
            for (const cpu::CpuSgemmPath path : {cpu::CpuSgemmPath::avx512, cpu::CpuSgemmPath::avx2}) {
              const ForcedSgemmPath forced(path);
              c.push_back(c0);
              cpu::sgemm_threads(threads, false, ta, tb, m, n, k, a.data(), lda, b.data(), ldb, beta, c.back().data(),
                                 n, bias.data());
            }
            CHECK(bit_differences(c[0], c[1]) == 0);
          }
}

TEST_CASE("sgemm_threads: threads sharing B's blocks give the single-threaded product's bits", "[cpu]") {
  // Row chunks taken in whatever order the threads free up, B packed by all of them in rounds of k; or, with few
  // rows, one block of C per thread: C must be the same. Shapes for both (m of 130 takes turns on 2 threads, not on
  // 3), rows and columns off the tiles, k over several blocks of 256 (one round, and several where B is wide) and n
  // over several blocks of 512; both layouts of each operand, beta 0 and 0.5, the bias, and the bf16 rounding
  // while packing.
  for (const cpu::CpuSgemmPath path : {cpu::CpuSgemmPath::avx512, cpu::CpuSgemmPath::avx2}) {
    if (!sgemm_runs(path)) continue;
    const ForcedSgemmPath forced(path);
    INFO(cpu::describe(path));
    for (const Shape3 s :
         {Shape3{800, 40, 30}, Shape3{300, 70, 600}, Shape3{45, 1100, 300}, Shape3{130, 515, 40}, Shape3{9, 33, 7}}) {
      const std::vector<float> a = sgemm_normals(static_cast<size_t>(s.m) * s.k, 4),
                               b = sgemm_normals(static_cast<size_t>(s.k) * s.n, 5),
                               bias = sgemm_normals(static_cast<size_t>(s.n), 6),
                               c0 = sgemm_normals(static_cast<size_t>(s.m) * s.n, 7);
      for (const auto& [ta, tb, beta, round] :
           {std::tuple{false, false, 0.0f, false}, std::tuple{true, false, 0.5f, false},
            std::tuple{false, true, 0.0f, true}, std::tuple{true, true, 0.5f, true}}) {
        CAPTURE(s.m, s.n, s.k, ta, tb, beta, round);
        const int lda = ta ? s.m : s.k, ldb = tb ? s.k : s.n;  // the same numbers read in either layout
        std::vector<float> want = c0;
        if (round)
          cpu::sgemm_bf16_rounded(ta, tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, beta, want.data(), s.n,
                                  bias.data());
        else
          cpu::sgemm(ta, tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, beta, want.data(), s.n, bias.data());
        for (const int threads : {2, 3}) {
          std::vector<float> got = c0;
          cpu::sgemm_threads(threads, round, ta, tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, beta, got.data(), s.n,
                             bias.data());
          CHECK(bit_differences(want, got) == 0);
        }
      }
    }
  }
}

TEST_CASE("sgemm: reading op(a)'s rows in place gives the bits of packing them first", "[cpu]") {
  // Where a is not transposed and C has at most 256 columns the kernels read a's rows where they lie; a panel's
  // rows past m then read the last row's (never stored). Where a is transposed, blocks of whole panels of rows are
  // read where they lie too (each k's rows contiguous, lda apart), the others packed. Forced to pack, they must give
  // every element the same bits: rows off the tiles' edges, lda past k (or m), k over several blocks, one thread
  // and shared blocks of B; m of 48 and 240 make whole panels for both kernels (mr 8 and 6), an lda of 512 packs.
  for (const cpu::CpuSgemmPath path : {cpu::CpuSgemmPath::avx512, cpu::CpuSgemmPath::avx2}) {
    if (!sgemm_runs(path)) continue;
    const ForcedSgemmPath forced(path);
    INFO(cpu::describe(path));
    for (const Shape3 s : {Shape3{1, 5, 3}, Shape3{13, 40, 300}, Shape3{300, 256, 129}, Shape3{261, 33, 600},
                           Shape3{48, 64, 1024}, Shape3{240, 100, 520}, Shape3{504, 40, 70}})
      for (const bool ta : {false, true}) {
        const int lda = ta ? (s.m == 504 ? 512 : s.m + 5) : s.k + 7;
        const std::vector<float> a = sgemm_normals(static_cast<size_t>(ta ? s.k : s.m) * lda, 11),
                                 b = sgemm_normals(static_cast<size_t>(s.k) * s.n, 12),
                                 bias = sgemm_normals(static_cast<size_t>(s.n), 13);
        for (const bool tb : {false, true})
          for (const int threads : {1, 2}) {
            CAPTURE(s.m, s.n, s.k, ta, tb, threads);
            const int ldb = tb ? s.k : s.n;  // the same numbers read as k × n or n × k
            std::vector<float> in_place(static_cast<size_t>(s.m) * s.n), packed(in_place.size());
            cpu::sgemm_threads(threads, false, ta, tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, 0.0f,
                               in_place.data(), s.n, bias.data());
            cpu::set_sgemm_always_pack_a(true);
            cpu::sgemm_threads(threads, false, ta, tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, 0.0f, packed.data(),
                               s.n, bias.data());
            cpu::set_sgemm_always_pack_a(false);
            CHECK(bit_differences(packed, in_place) == 0);
          }
      }
  }
}

TEST_CASE("sgemm: k of zero leaves beta·C plus the bias, on every path", "[cpu]") {
  for (const cpu::CpuSgemmPath path : kSgemmPaths) {
    if (!sgemm_runs(path)) continue;
    const ForcedSgemmPath forced(path);
    const float bias[3] = {1, 2, 3};
    std::vector<float> c = {4, 5, 6, 7, 8, 9};
    cpu::sgemm(false, false, 2, 3, 0, nullptr, 1, nullptr, 3, 0.5f, c.data(), 3, bias);
    CHECK(c == std::vector<float>{3, 4.5f, 6, 4.5f, 6, 7.5f});
    std::vector<float> nan(6, std::numeric_limits<float>::quiet_NaN());
    cpu::sgemm(false, false, 2, 3, 0, nullptr, 1, nullptr, 3, 0.0f, nan.data(), 3, nullptr);
    CHECK(nan == std::vector<float>(6, 0.0f));
  }
}

TEST_CASE("sgemm: rounding to bf16 while packing gives the bits of a product of rounded copies, on every path",
          "[cpu]") {
  // The conversion path of a bf16 product (ops/cpu/bf16_gemm.h) on our kernels: the same numbers as rounding copies
  // with round_to_half first — with ties, a NaN (quieted), infinities and f32 subnormals among the operands.
  const std::tuple<int, int, int> shapes[] = {{1, 1, 1}, {7, 33, 31}, {9, 17, 257}, {130, 40, 64}};
  uint64_t seed = 900;
  for (const cpu::CpuSgemmPath path : kSgemmPaths) {
    if (!sgemm_runs(path)) continue;
    const ForcedSgemmPath forced(path);
    for (const auto& [m, n, k] : shapes)
      for (const bool ta : {false, true})
        for (const bool tb : {false, true}) {
          INFO(cpu::describe(path) << ": m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb);
          const int lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2;
          std::vector<float> a = sgemm_normals(static_cast<size_t>((ta ? k : m) * lda), ++seed),
                             b = sgemm_normals(static_cast<size_t>((tb ? n : k) * ldb), ++seed);
          if (a.size() > 8) {
            a[1] = std::bit_cast<float>(0x3F808000u);       // a tie: rounds to even (down)
            a[2] = std::bit_cast<float>(0x3F818000u);       // a tie: rounds to even (up)
            a[3] = std::bit_cast<float>(0x00012345u);       // an f32 subnormal
            a[5] = std::numeric_limits<float>::infinity();  // stays infinite
            b[0] = std::bit_cast<float>(0x7F800001u);       // a signalling NaN, read by every shape: quieted
          }
          std::vector<float> ra(a.size()), rb(b.size());
          round_to_half(HalfFormat::bf16, a.data(), ra.data(), a.size());
          round_to_half(HalfFormat::bf16, b.data(), rb.data(), b.size());
          std::vector<float> fused(static_cast<size_t>(m * n), 7.0f), copies = fused;
          cpu::sgemm_bf16_rounded(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, 0.5f, fused.data(), n);
          cpu::sgemm(ta, tb, m, n, k, ra.data(), lda, rb.data(), ldb, 0.5f, copies.data(), n);
          CHECK(bit_differences(fused, copies) == 0);
          // and not f32's product: the rounding happened
          std::vector<float> plain(fused.size(), 7.0f);
          cpu::sgemm(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, 0.5f, plain.data(), n);
          int rounded = 0;
          for (size_t i = 0; i < plain.size(); ++i)
            rounded += std::isfinite(plain[i]) && std::isfinite(copies[i]) && plain[i] != copies[i];
          if (k >= 31) CHECK(rounded > 0);
        }
  }
}
