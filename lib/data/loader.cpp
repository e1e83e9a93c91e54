// The batch loader: a seeded per-epoch permutation and row gathers into preallocated batch tensors.
#include "core/parallel.h"
#include "core/rng.h"
#include "data/dataset.h"

#include <cstring>
#include <numeric>

namespace gt {

Loader::Loader(const Dataset& data, int64_t batch_size, bool shuffle, uint64_t seed)
    : m_data(&data), m_batch(batch_size), m_shuffle(shuffle), m_seed(seed) {
  m_order.resize(static_cast<size_t>(data.size()));
  std::iota(m_order.begin(), m_order.end(), 0);
}

void Loader::start_epoch(int64_t epoch) {
  std::iota(m_order.begin(), m_order.end(), 0);
  if (m_shuffle) {
    Rng rng(m_seed, 0x5A3D1E00 + static_cast<uint64_t>(epoch));
    for (size_t i = m_order.size(); i > 1; --i) std::swap(m_order[i - 1], m_order[rng.below(i)]);
  }
  m_pos = 0;
}

int64_t Loader::next(Tensor& x, Tensor& y) {
  const int64_t n = std::min(m_batch, m_data->size() - m_pos);
  if (n <= 0) return 0;
  const size_t x_row = m_data->inputs.bytes() / static_cast<size_t>(m_data->size());
  const size_t y_row = m_data->targets.bytes() / static_cast<size_t>(m_data->size());
  auto* xd = static_cast<char*>(x.raw());
  auto* yd = static_cast<char*>(y.raw());
  const auto* xs = static_cast<const char*>(m_data->inputs.raw());
  const auto* ys = static_cast<const char*>(m_data->targets.raw());
  const int64_t* idx = m_order.data() + m_pos;
  for (int64_t i = 0; i < n; ++i) {
    const auto src = static_cast<size_t>(idx[i]);
    std::memcpy(xd + static_cast<size_t>(i) * x_row, xs + src * x_row, x_row);
    std::memcpy(yd + static_cast<size_t>(i) * y_row, ys + src * y_row, y_row);
  }
  m_pos += n;
  return n;
}

}  // namespace gt
