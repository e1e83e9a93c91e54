// The merge step of BPE: a word's tokens, adjacent pairs merged lowest rank first (leftmost among equals) until no
// pair has a merge, which is what Hugging Face `tokenizers` computes with its priority queue.
#pragma once

#include "text/hf_bpe_spec.h"

#include <cstdint>
#include <vector>

namespace gt {

class BpeMerges {
 public:
  BpeMerges() = default;
  /// Ranks are positions in `merges`; a pair listed twice keeps its last rank, as `tokenizers` does.
  explicit BpeMerges(const std::vector<HfBpeSpec::Merge>& merges);

  /// Merges `tokens` in place.
  void apply(std::vector<uint32_t>& tokens) const;

 private:
  static constexpr uint64_t kNone = ~uint64_t{0};
  /// (rank << 32 | result) of the pair, kNone when it has no merge.
  uint64_t find(uint32_t left, uint32_t right) const {
    if (m_keys.empty()) return kNone;
    const uint64_t key = uint64_t{left} << 32 | right;
    for (size_t i = slot(key);; i = (i + 1) & m_mask) {
      if (m_keys[i] == key) return m_values[i];
      if (m_keys[i] == kNone) return kNone;
    }
  }
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9e3779b97f4a7c15ull) >> 20) & m_mask; }
  void apply_short(std::vector<uint32_t>& tokens) const;
  void apply_long(std::vector<uint32_t>& tokens) const;

  std::vector<uint64_t> m_keys, m_values;  // open addressing; a key is left << 32 | right
  size_t m_mask = 0;
};

}  // namespace gt
