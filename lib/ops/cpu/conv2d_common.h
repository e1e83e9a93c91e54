// What the CPU convolution's two algorithms share: im2col + GEMM (conv2d.cpp) and Winograd's F(2×2, 3×3)
// (conv2d_winograd.cpp, ops/cpu/conv_algo.h says which runs). Not for use outside ops/cpu/conv2d*.cpp.
#pragma once

#include "core/parallel.h"
#include "ops/math.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace gt::cpu::conv_detail {

// Runs f(chunk, begin, end) over `n` items split into at most num_threads() contiguous chunks; returns the number
// of chunks. Chunk c always covers the same items for a given thread count, so per-chunk partial sums reduced in
// chunk order are deterministic.
template <class F>
int batch_chunks(int64_t n, F&& f) {
  const int chunks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n, num_threads())));
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (int c = 0; c < chunks; ++c) f(c, n * c / chunks, n * (c + 1) / chunks);
  return chunks;
}

// out[i] = beta·out[i] + Σ_c parts[c][i] for i < n, the chunks' partial gradients added in chunk order.
template <class T>
void add_chunk_partials(const std::vector<std::vector<T>>& parts, int chunks, double beta, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T s = beta != 0 ? T(beta) * out[i] : T(0);
    for (int c = 0; c < chunks; ++c) s += parts[static_cast<size_t>(c)][static_cast<size_t>(i)];
    out[i] = s;
  }
}

struct Geometry {
  int64_t c, h, w;  // input channels (of one group), height, width
  int64_t oh, ow;   // output height, width
  Window2d win;
  int64_t rows() const { return c * win.kh * win.kw; }
  int64_t cols() const { return oh * ow; }
  bool is_identity() const {  // a 1×1, stride-1, unpadded window: im2col would copy x unchanged
    return win.kh == 1 && win.kw == 1 && win.sh == 1 && win.sw == 1 && win.ph == 0 && win.pw == 0;
  }
};

template <class T>
std::vector<T>& scratch(size_t n) {
  // One growing buffer per thread: after the first step no call allocates.
  static thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

/// gb[o] += Σ_i dy[o·cols + i] for o < rows: one image's bias gradient (f32, compiled per instruction set).
void add_row_sums_f32(const float* dy, int64_t rows, int64_t cols, float* gb);

// Winograd F(2×2, 3×3) over one layer's shapes: the tiles and the transforms' padded buffers (conv2d_winograd.cpp
// says how they are laid out).
struct Wino {
  int64_t c, o, h, w, oh, ow, ph, pw, th, tw;
  Wino(const Geometry& g, int64_t cout)
      : c(g.c),
        o(cout),
        h(g.h),
        w(g.w),
        oh(g.oh),
        ow(g.ow),
        ph(g.win.ph),
        pw(g.win.pw),
        th((g.oh + 1) / 2),
        tw((g.ow + 1) / 2) {}
  int64_t tiles() const { return th * tw; }
  int64_t prows() const { return 2 * th + 2; }  // padded rows and columns: ≥ h + 2·ph, w + 2·pw
  int64_t pcols() const { return 2 * tw + 2; }
  // The (de)interleaving loops below go 16 tiles at a time, so they read and write up to tw16() elements of a row of
  // tiles (2·tw16() of a row of pixels); every buffer they touch has that much room.
  int64_t tw16() const { return (tw + 15) / 16 * 16; }
  int64_t plane() const { return tiles() + 16; }   // a phase plane: th × tw (+ room)
  int64_t prow() const { return 2 * tw16() + 4; }  // a padded row (+ room): ≥ pcols()
};

/// y (N, O, oh, ow) = conv(x (N, C, h, w), w (O, C, 3, 3)) + bias (O, or null), through Winograd F(2×2, 3×3).
void wino_forward(const Wino& g, int64_t batch, const float* x, const float* w, const float* bias, float* y);
/// The backward pass of wino_forward: dx (or null) written, dw and db (or null) = beta·dw + the gradient.
void wino_backward(const Wino& g, int64_t batch, const float* x, const float* w, const float* dy, float* dx, float* dw,
                   float* db, float beta);

}  // namespace gt::cpu::conv_detail
