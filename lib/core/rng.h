// Philox4x32-10: a counter-based generator, so any (seed, stream, position) is reachable without replay.
// The same functions run on the host and in CUDA kernels.
#pragma once

#include "core/hd.h"

#include <cmath>
#include <cstdint>

namespace gt {

/// One Philox4x32-10 block: four 32-bit outputs for a 128-bit counter and a 64-bit key.
struct PhiloxBlock {
  uint32_t v[4];
};

GT_HD PhiloxBlock philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

/// A sequential stream over Philox: `stream` picks an independent sequence for the same seed.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) : m_key(seed), m_stream(stream) {}

  uint32_t next_u32() {
    if (m_index == 4) {
      m_block = philox4x32(m_counter++, m_stream, m_key);
      m_index = 0;
    }
    return m_block.v[m_index++];
  }
  uint64_t next_u64() { return (uint64_t{next_u32()} << 32) | next_u32(); }
  /// Uniform in [0, 1) with 24 random bits (exact in float).
  double uniform() { return (next_u32() >> 8) * (1.0 / 16777216.0); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  /// Standard normal (Box–Muller).
  double normal() {
    double u1 = 0;
    while (u1 <= 0) u1 = (next_u64() >> 11) * (1.0 / 9007199254740992.0);
    const double u2 = (next_u64() >> 11) * (1.0 / 9007199254740992.0);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  /// Uniform integer in [0, n) without modulo bias (Lemire's method).
  uint64_t below(uint64_t n) {
    uint64_t x = next_u32();
    uint64_t m = x * n;
    uint32_t low = static_cast<uint32_t>(m);
    if (n <= 0xFFFFFFFFull && low < n) {
      const uint32_t threshold = static_cast<uint32_t>((0x100000000ull - n) % n);
      while (low < threshold) {
        x = next_u32();
        m = x * n;
        low = static_cast<uint32_t>(m);
      }
    }
    return n <= 0xFFFFFFFFull ? (m >> 32) : next_u64() % n;
  }

 private:
  uint64_t m_key, m_stream, m_counter = 0;
  PhiloxBlock m_block{};
  int m_index = 4;
};

}  // namespace gt
