// Two ways to the same merges: a scan of the pair ranks for short words (most of them; no allocation beyond the
// ranks), a priority queue over a linked list for long ones, where the scan would be quadratic.
#include "text/bpe_merge.h"

#include <algorithm>
#include <queue>

namespace gt {
namespace {

constexpr size_t kShortWord = 48;  // tokens; longer words take the queue

}  // namespace

BpeMerges::BpeMerges(const std::vector<HfBpeSpec::Merge>& merges) {
  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  m_keys.assign(capacity, kNone);
  m_values.assign(capacity, kNone);
  m_mask = capacity - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const HfBpeSpec::Merge& m = merges[rank];
    const uint64_t key = uint64_t{m.left} << 32 | m.right;
    size_t i = slot(key);
    while (m_keys[i] != kNone && m_keys[i] != key) i = (i + 1) & m_mask;
    m_keys[i] = key;
    m_values[i] = uint64_t{rank} << 32 | m.result;
  }
}

void BpeMerges::apply(std::vector<uint32_t>& tokens) const {
  if (tokens.size() < 2) return;
  if (tokens.size() <= kShortWord)
    apply_short(tokens);
  else
    apply_long(tokens);
}

void BpeMerges::apply_short(std::vector<uint32_t>& tokens) const {
  uint64_t ranks[kShortWord];  // ranks[i]: the merge of tokens[i] and tokens[i + 1]
  size_t n = tokens.size();
  for (size_t i = 0; i + 1 < n; ++i) ranks[i] = find(tokens[i], tokens[i + 1]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if ((ranks[i] >> 32) < (ranks[best] >> 32)) best = i;
    if (ranks[best] == kNone) break;
    tokens[best] = static_cast<uint32_t>(ranks[best]);
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    std::copy(ranks + best + 1, ranks + n - 1, ranks + best);
    --n;
    if (best > 0) ranks[best - 1] = find(tokens[best - 1], tokens[best]);
    if (best + 1 < n) ranks[best] = find(tokens[best], tokens[best + 1]);
  }
}

void BpeMerges::apply_long(std::vector<uint32_t>& tokens) const {
  // A doubly linked list over the positions; a queue entry (rank, position, result) is stale when the pair at its
  // position no longer merges into that result.
  const size_t n = tokens.size();
  std::vector<int64_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) prev[i] = static_cast<int64_t>(i) - 1, next[i] = i + 1 < n ? int64_t(i + 1) : -1;
  struct Entry {
    uint64_t rank;
    size_t pos;
    uint32_t result;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
  const auto push = [&](size_t i) {
    if (next[i] < 0) return;
    const uint64_t m = find(tokens[i], tokens[static_cast<size_t>(next[i])]);
    if (m != kNone) queue.push({m >> 32, i, static_cast<uint32_t>(m)});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Entry e = queue.top();
    queue.pop();
    if (!alive[e.pos] || next[e.pos] < 0) continue;
    const auto right = static_cast<size_t>(next[e.pos]);
    const uint64_t m = find(tokens[e.pos], tokens[right]);
    if (m == kNone || static_cast<uint32_t>(m) != e.result || (m >> 32) != e.rank) continue;
    tokens[e.pos] = e.result;
    alive[right] = false;
    next[e.pos] = next[right];
    if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = static_cast<int64_t>(e.pos);
    if (prev[e.pos] >= 0) push(static_cast<size_t>(prev[e.pos]));
    push(e.pos);
  }
  size_t k = 0;
  for (size_t i = 0; i < n; ++i)
    if (alive[i]) tokens[k++] = tokens[i];
  tokens.resize(k);
}

}  // namespace gt
