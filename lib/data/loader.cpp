// The batch loader: a seeded per-epoch permutation and row gathers into preallocated batch tensors.
#include "core/rng.h"
#include "data/dataset.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace gt {

Loader::Loader(const Dataset& data, int64_t batch_size, bool shuffle, uint64_t seed, AugmentConfig augment)
    : m_data(&data), m_batch(batch_size), m_shuffle(shuffle), m_seed(seed), m_augment(augment), m_size(data.size()) {
  m_order = order_of(0);
}

std::shared_ptr<const std::vector<int64_t>> Loader::order_of(int64_t epoch) const {
  auto order = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(m_data->size()));
  std::iota(order->begin(), order->end(), 0);
  if (m_shuffle) {
    Rng rng(m_seed, 0x5A3D1E00 + static_cast<uint64_t>(epoch));
    for (size_t i = order->size(); i > 1; --i) std::swap((*order)[i - 1], (*order)[rng.below(i)]);
  }
  return order;
}

void Loader::start_epoch(int64_t epoch, int64_t position) {
  if (epoch != m_epoch || !m_order) m_order = order_of(epoch);
  m_pos = std::clamp<int64_t>(position, 0, m_size);
  m_epoch = epoch;
}

// Applies the epoch's draw for this position: a shift of up to ±padding (zero fill) and a coin-flip mirror; `mirror`
// mirrors every image and draws nothing (the coin is not thrown, so training's draws are unchanged by it existing).
void Loader::augment(float* x, int64_t epoch, int64_t position, std::vector<float>& tmp) const {
  const Shape s = m_data->input_shape();
  const int64_t c = s[0], h = s[1], w = s[2];
  Rng rng(m_seed, (uint64_t{0xA06} << 40) ^ (static_cast<uint64_t>(epoch) << 24) ^ static_cast<uint64_t>(position));
  int64_t dy = 0, dx = 0;
  if (m_augment.crop_padding > 0) {
    const auto span = static_cast<uint64_t>(2 * m_augment.crop_padding + 1);
    dy = static_cast<int64_t>(rng.below(span)) - m_augment.crop_padding;
    dx = static_cast<int64_t>(rng.below(span)) - m_augment.crop_padding;
  }
  const bool flip = m_augment.mirror || (m_augment.hflip && (rng.next_u32() & 1));
  if (dy == 0 && dx == 0 && !flip) return;
  tmp.assign(x, x + c * h * w);
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j) {
        // Output pixel (i, j) shows input (i + dy, j' + dx), where j' mirrors j when flipping.
        const int64_t si = i + dy, sj = (flip ? w - 1 - j : j) + dx;
        x[(ch * h + i) * w + j] =
            si >= 0 && si < h && sj >= 0 && sj < w ? tmp[static_cast<size_t>((ch * h + si) * w + sj)] : 0.0f;
      }
}

int64_t Loader::fill(const std::vector<int64_t>& order, int64_t epoch, int64_t position, Tensor& x, Tensor& y) const {
  const auto [start, n] = span(position);
  if (n <= 0) return 0;
  const int64_t* idx = order.data() + start;
  if (m_data->tokens) {  // windows cut from the shards as they are needed
    const int64_t t = m_data->tokens->block_size();
    float* xd = x.data<float>();
    int32_t* yd = y.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) m_data->tokens->window(idx[i], xd + i * t, yd + i * t);
    return n;
  }
  const MappedInputs* mapped = m_data->mapped.get();  // rows converted (and checked) from a mapped file
  const size_t x_row = m_data->input_shape().numel() * sizeof(float);
  const size_t y_row = m_data->targets.bytes() / static_cast<size_t>(m_data->size());
  auto* xd = static_cast<char*>(x.raw());
  auto* yd = static_cast<char*>(y.raw());
  const auto* xs = mapped ? nullptr : static_cast<const char*>(m_data->inputs.raw());
  const auto* ys = static_cast<const char*>(m_data->targets.raw());
  std::vector<float> scratch;  // per call: concurrent fills share nothing
  for (int64_t i = 0; i < n; ++i) {
    const auto src = static_cast<size_t>(idx[i]);
    if (mapped)
      mapped->row(idx[i], reinterpret_cast<float*>(xd + static_cast<size_t>(i) * x_row));
    else
      std::memcpy(xd + static_cast<size_t>(i) * x_row, xs + src * x_row, x_row);
    std::memcpy(yd + static_cast<size_t>(i) * y_row, ys + src * y_row, y_row);
    if (m_augment.any())
      augment(reinterpret_cast<float*>(xd + static_cast<size_t>(i) * x_row), epoch, start + i, scratch);
  }
  return n;
}

}  // namespace gt
