// Winograd's F(2×2, 3×3) for the CPU convolution (ops/cpu/conv_algo.h): the transforms of the input, the weights
// and the output and their adjoints, and the 16 GEMMs of a group of images between them.
#include "ops/cpu/conv2d_common.h"

#include "ops/cpu/blas.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/sgemm.h"
#include "ops/cpu/vec_math.h"

#include <algorithm>
#include <vector>

namespace gt::cpu::conv_detail {
namespace {

// ---- Winograd F(2×2, 3×3) (ops/cpu/conv_algo.h) ----
// Output tile (ty, tx) is y[2ty … 2ty+1][2tx … 2tx+1]; it reads the 4×4 input patch whose corner is (2ty − ph,
// 2tx − pw). In a "padded" row, column p holds input column p − pw (zero outside the image), so tile tx's patch is
// padded columns 2tx … 2tx+3: the even ones 2tx and 2tx+2, the odd ones 2tx+1 and 2tx+3.
//   V = Bᵀ d B with Bᵀ = [1 0 −1 0; 0 1 1 0; 0 −1 1 0; 0 1 0 −1]       (input patch d, 4×4)
//   U = G g Gᵀ with G  = [1 0 0; ½ ½ ½; ½ −½ ½; 0 0 1]                (weights g, 3×3)
//   y = Aᵀ M A with Aᵀ = [1 1 1 0; 0 1 −1 −1], M[ξ] = Σ_c U[ξ] V[ξ]   (ξ: the 16 positions of a 4×4 tile)
// and the adjoints: dM = A dy Aᵀ, dU = Σ_tiles dM V, dV = Σ_o U dM, dd = B dV Bᵀ, dg = Gᵀ dU G. The transforms add
// and subtract only (the weights' also halve, in code compiled once), so no a·b + c can become an FMA and every
// instruction set gets the same bits.
// Buffers hold 16 matrices, ξ-major: U[ξ] is O × C, V[ξ] C × n, M[ξ] O × n, with n the columns of the current group of
// images (each image's tiles row by row).
// (struct Wino: conv2d_common.h)

// U (16 × O × C) from w (O, C, 3, 3). Compiled once, for the baseline: the halves' products must not fuse.
void wino_weights(const Wino& g, const float* w, float* u) {
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t ch = 0; ch < g.c; ++ch) {
      const float* k = w + (o * g.c + ch) * 9;
      float gk[4][3];  // G g
      for (int j = 0; j < 3; ++j) {
        gk[0][j] = k[j];
        gk[1][j] = (k[j] + k[3 + j] + k[6 + j]) * 0.5f;
        gk[2][j] = (k[j] - k[3 + j] + k[6 + j]) * 0.5f;
        gk[3][j] = k[6 + j];
      }
      for (int a = 0; a < 4; ++a) {
        const float t[4] = {gk[a][0], (gk[a][0] + gk[a][1] + gk[a][2]) * 0.5f, (gk[a][0] - gk[a][1] + gk[a][2]) * 0.5f,
                            gk[a][2]};
        for (int b = 0; b < 4; ++b) u[((a * 4 + b) * g.o + o) * g.c + ch] = t[b];
      }
    }
}

// dw (O, C, 3, 3) = Gᵀ dU G + beta·dw from dU (16 × O × C). Baseline, as wino_weights.
void wino_weight_grad(const Wino& g, const float* du, float beta, float* dw) {
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t ch = 0; ch < g.c; ++ch) {
      float m[4][4];
      for (int x = 0; x < 16; ++x) m[x / 4][x % 4] = du[(x * g.o + o) * g.c + ch];
      float r[3][4];  // Gᵀ dU
      for (int b = 0; b < 4; ++b) {
        r[0][b] = m[0][b] + (m[1][b] + m[2][b]) * 0.5f;
        r[1][b] = (m[1][b] - m[2][b]) * 0.5f;
        r[2][b] = (m[1][b] + m[2][b]) * 0.5f + m[3][b];
      }
      float* k = dw + (o * g.c + ch) * 9;
      for (int i = 0; i < 3; ++i) {
        const float t[3] = {r[i][0] + (r[i][1] + r[i][2]) * 0.5f, (r[i][1] - r[i][2]) * 0.5f,
                            (r[i][1] + r[i][2]) * 0.5f + r[i][3]};
        for (int j = 0; j < 3; ++j) k[i * 3 + j] = beta != 0 ? beta * k[i * 3 + j] + t[j] : t[j];
      }
    }
}

// The transforms run each over all of one image's tiles at once (loops of th·tw, not of one tile row's tw: at the
// 7 × 7 tiles of a 14 × 14 image a row's loop is too short for a 16-lane vector). They read and write "phase planes",
// th × tw (or (th+1) × tw) arrays holding one of a tile's 4×4 taps (or 2×2 outputs) for every tile; splitting a row
// of pixels into its even and odd columns, and merging them back, goes 16 at a time through vector shuffles.
using WinoVec = Vec64<float>;
// e[t] = s[2t], o[t] = s[2t + 1] for t < n, rounded up to 16: reads s[0, 2·⌈n⌉₁₆), writes e and o up to ⌈n⌉₁₆.
GT_INLINE void split_even_odd(const float* s, int64_t n, float* e, float* o) {
  for (int64_t t = 0; t < n; t += 16) {
    const WinoVec lo = load64(s + 2 * t), hi = load64(s + 2 * t + 16);
    store(e + t, __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30));
    store(o + t, __builtin_shufflevector(lo, hi, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31));
  }
}
// The first 16 and the last 16 of e[0] o[0] e[1] o[1] … e[15] o[15].
GT_INLINE WinoVec interleave_lo(WinoVec e, WinoVec o) {
  return __builtin_shufflevector(e, o, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
}
GT_INLINE WinoVec interleave_hi(WinoVec e, WinoVec o) {
  return __builtin_shufflevector(e, o, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
}
// The two interleaved: d[2t] = e[t], d[2t + 1] = o[t] for t < n rounded up to 16 (writes d[0, 2·⌈n⌉₁₆)).
GT_INLINE void merge_even_odd(const float* e, const float* o, int64_t n, float* d) {
  for (int64_t t = 0; t < n; t += 16) {
    const WinoVec ev = load64(e + t), od = load64(o + t);
    store(d + 2 * t, interleave_lo(ev, od));
    store(d + 2 * t + 16, interleave_hi(ev, od));
  }
}
// d[2t] += e[t], d[2t + 1] += o[t], likewise.
GT_INLINE void add_even_odd(const float* e, const float* o, int64_t n, float* d) {
  for (int64_t t = 0; t < n; t += 16) {
    const WinoVec ev = load64(e + t), od = load64(o + t);
    store(d + 2 * t, load64(d + 2 * t) + interleave_lo(ev, od));
    store(d + 2 * t + 16, load64(d + 2 * t + 16) + interleave_hi(ev, od));
  }
}

// V's columns [col, col + tiles) (row stride ldv) from one image x (C, h, w). `buf`: wino_input_floats(g).
size_t wino_input_floats(const Wino& g) {
  return static_cast<size_t>(2 * g.prows() * g.prow() + 8 * ((g.th + 1) * g.tw + 16));
}
GT_INLINE void wino_input(const Wino& g, const float* x, float* v, int64_t ldv, int64_t col, float* buf) {
  const int64_t tw = g.tw, tiles = g.tiles(), plane_n = (g.th + 1) * g.tw + 16, step = g.c * ldv, pr_n = g.prow();
  const int64_t padded_n = g.prows() * pr_n;
  // Two padded planes (rows prow() apart, zeros around the image's): channel ch + 1 is copied into one before
  // channel ch is split from the other. A split reading rows just copied would wait on the copy's stores (its
  // 64-byte loads cannot be forwarded from the copy's smaller ones), which cost more than all the rest.
  float* padded[2] = {buf, buf + padded_n};
  float* ph = buf + 2 * padded_n;  // ph[(r·4 + j)·plane_n + ty'·tw + t] = padded (2ty' + r, 2t + j), r < 2, j < 4
  std::fill(buf, buf + 2 * padded_n, 0.0f);
  auto copy_in = [&](int64_t ch) {  // the other rows and columns stay zero
    const float* plane = x + ch * g.h * g.w;
    float* dst = padded[ch % 2] + g.ph * pr_n + g.pw;
    for (int64_t iy = 0; iy < g.h; ++iy) std::copy(plane + iy * g.w, plane + (iy + 1) * g.w, dst + iy * pr_n);
  };
  copy_in(0);
  for (int64_t ch = 0; ch < g.c; ++ch) {
    if (ch + 1 < g.c) copy_in(ch + 1);
    for (int64_t p = 0; p < g.prows(); ++p) {  // rows in order: a row's spill past tw is the next row's, rewritten
      float* dst = ph + (p % 2) * 4 * plane_n + (p / 2) * tw;
      const float* row = padded[ch % 2] + p * pr_n;
      split_even_odd(row, tw, dst, dst + plane_n);
      split_even_odd(row + 2, tw, dst + 2 * plane_n, dst + 3 * plane_n);
    }
    float* out = v + ch * ldv + col;
    GT_SIMD for (int64_t i = 0; i < tiles; ++i) {
      float r[4][4];  // Bᵀ d over the patch's rows 2ty … 2ty+3 (tile row ty' = ty and ty + 1), per column j
      for (int j = 0; j < 4; ++j) {
        const float d0 = ph[j * plane_n + i], d1 = ph[(4 + j) * plane_n + i];
        const float d2 = ph[j * plane_n + i + tw], d3 = ph[(4 + j) * plane_n + i + tw];
        r[0][j] = d0 - d2;
        r[1][j] = d1 + d2;
        r[2][j] = d2 - d1;
        r[3][j] = d1 - d3;
      }
      for (int a = 0; a < 4; ++a) {  // · B over the columns
        out[(4 * a) * step + i] = r[a][0] - r[a][2];
        out[(4 * a + 1) * step + i] = r[a][1] + r[a][2];
        out[(4 * a + 2) * step + i] = r[a][2] - r[a][1];
        out[(4 * a + 3) * step + i] = r[a][1] - r[a][3];
      }
    }
  }
}

// y (O, oh, ow) of one image (+ bias) from M's columns [col, col + tiles). `buf`: wino_output_floats(g).
size_t wino_output_floats(const Wino& g) { return static_cast<size_t>(4 * g.plane() + 2 * g.tw16()); }
GT_INLINE void wino_output(const Wino& g, const float* m, int64_t ldm, int64_t col, const float* bias, float* y,
                           float* buf) {
  const int64_t tw = g.tw, tiles = g.tiles(), step = g.o * ldm, pn = g.plane();
  float* q = buf;              // Aᵀ M A (+ bias): q[(r·2 + j)·pn + tile] is output (2ty + r, 2tx + j)
  float* tail = buf + 4 * pn;  // a row merged here where merging in place would write past the image's y
  float* const y_end = y + g.o * g.oh * g.ow;
  for (int64_t o = 0; o < g.o; ++o) {
    const float* mt = m + o * ldm + col;
    const float b = bias ? bias[o] : 0.0f;
    GT_SIMD for (int64_t i = 0; i < tiles; ++i) {
      float p0[4], p1[4];  // M A: columns 0 and 1 of each row a
      for (int a = 0; a < 4; ++a) {
        const float m0 = mt[(4 * a) * step + i], m1 = mt[(4 * a + 1) * step + i];
        const float m2 = mt[(4 * a + 2) * step + i], m3 = mt[(4 * a + 3) * step + i];
        p0[a] = m0 + m1 + m2;
        p1[a] = m1 - m2 - m3;
      }
      q[i] = p0[0] + p0[1] + p0[2] + b;
      q[pn + i] = p1[0] + p1[1] + p1[2] + b;
      q[2 * pn + i] = p0[1] - p0[2] - p0[3] + b;
      q[3 * pn + i] = p1[1] - p1[2] - p1[3] + b;
    }
    for (int64_t oy = 0; oy < g.oh; ++oy) {  // rows in order: a row's spill past ow is the next row's, rewritten
      const float* qe = q + (oy % 2) * 2 * pn + (oy / 2) * tw;
      float* dst = y + (o * g.oh + oy) * g.ow;
      if (dst + 2 * g.tw16() <= y_end) {
        merge_even_odd(qe, qe + pn, tw, dst);
      } else {
        merge_even_odd(qe, qe + pn, tw, tail);
        std::copy(tail, tail + g.ow, dst);
      }
    }
  }
}

// dM's columns [col, col + tiles) = A dy Aᵀ of one image's dy (O, oh, ow); outside dy reads 0.
// `buf`: wino_dy_floats(g).
size_t wino_dy_floats(const Wino& g) { return static_cast<size_t>(4 * g.plane() + 2 * g.tw16()); }
GT_INLINE void wino_dy(const Wino& g, const float* dy, float* dm, int64_t ldm, int64_t col, float* buf) {
  const int64_t tw = g.tw, tiles = g.tiles(), step = g.o * ldm, pn = g.plane();
  float* d = buf;              // d[(r·2 + j)·pn + tile] = dy(2ty + r, 2tx + j), zero outside
  float* tail = buf + 4 * pn;  // a row copied here where splitting in place would read past the image's dy
  const float* const dy_end = dy + g.o * g.oh * g.ow;
  std::fill(tail, tail + 2 * g.tw16(), 0.0f);
  for (int64_t o = 0; o < g.o; ++o) {
    for (int64_t yy = 0; yy < 2 * g.th; ++yy) {  // rows in order: a row's spill past tw is the next row's
      float* de = d + (yy % 2) * 2 * pn + (yy / 2) * tw;
      float* dd = de + pn;
      if (yy >= g.oh) {
        std::fill(de, de + tw, 0.0f);
        std::fill(dd, dd + tw, 0.0f);
        continue;
      }
      const float* src = dy + (o * g.oh + yy) * g.ow;
      if (src + 2 * g.tw16() > dy_end) {
        std::copy(src, src + g.ow, tail);
        src = tail;
      }
      split_even_odd(src, tw, de, dd);
      if (g.ow % 2) dd[tw - 1] = 0.0f;  // it read the next row's first value
    }
    float* out = dm + o * ldm + col;
    GT_SIMD for (int64_t i = 0; i < tiles; ++i) {
      // dy Aᵀ per row r: (e, e + o, e − o, −o); then A ·: rows (q0, q0 + q1, q0 − q1, −q1)
      const float e0 = d[i], o0 = d[pn + i], e1 = d[2 * pn + i], o1 = d[3 * pn + i];
      const float q0[4] = {e0, e0 + o0, e0 - o0, -o0};
      const float q1[4] = {e1, e1 + o1, e1 - o1, -o1};
      for (int b = 0; b < 4; ++b) {
        out[b * step + i] = q0[b];
        out[(4 + b) * step + i] = q0[b] + q1[b];
        out[(8 + b) * step + i] = q0[b] - q1[b];
        out[(12 + b) * step + i] = -q1[b];
      }
    }
  }
}

// dx (C, h, w) of one image = Σ_tiles B dV Bᵀ placed at each tile's patch, from dV's columns [col, col + tiles).
// `buf`: wino_dx_floats(g): a padded plane the overlapping patches add into (its inside is then dx; rows prow()
// apart, so a row's spill stays in its own room), and the patches, [i][j][tile].
size_t wino_dx_floats(const Wino& g) { return static_cast<size_t>(g.prows() * g.prow() + 16 * g.plane()); }
GT_INLINE void wino_dx(const Wino& g, const float* dv, int64_t ldv, int64_t col, float* dx, float* buf) {
  const int64_t tw = g.tw, tiles = g.tiles(), step = g.c * ldv, pr_n = g.prow(), pn = g.plane();
  float* plane = buf;
  float* pr = buf + g.prows() * pr_n;
  for (int64_t ch = 0; ch < g.c; ++ch) {
    const float* vt = dv + ch * ldv + col;
    GT_SIMD for (int64_t i = 0; i < tiles; ++i) {
      float r[4][4];  // dV Bᵀ
      for (int a = 0; a < 4; ++a) {
        const float v0 = vt[(4 * a) * step + i], v1 = vt[(4 * a + 1) * step + i];
        const float v2 = vt[(4 * a + 2) * step + i], v3 = vt[(4 * a + 3) * step + i];
        r[a][0] = v0;
        r[a][1] = v1 - v2 + v3;
        r[a][2] = v1 + v2 - v0;
        r[a][3] = -v3;
      }
      for (int j = 0; j < 4; ++j) {  // B ·
        pr[j * pn + i] = r[0][j];
        pr[(4 + j) * pn + i] = r[1][j] - r[2][j] + r[3][j];
        pr[(8 + j) * pn + i] = r[1][j] + r[2][j] - r[0][j];
        pr[(12 + j) * pn + i] = -r[3][j];
      }
    }
    // Padded row 2ty + i gets row i of tile row ty's patches, tile t's column j on padded column 2t + j: columns
    // 0 and 1 of every row first, then columns 2 and 3 (shifted by 2), so that no load waits on the stores just
    // made to the same row at another alignment.
    std::fill(plane, plane + g.prows() * pr_n, 0.0f);
    for (int64_t ty = 0; ty < g.th; ++ty)
      for (int i = 0; i < 4; ++i) {
        const float* p = pr + i * 4 * pn + ty * tw;
        add_even_odd(p, p + pn, tw, plane + (2 * ty + i) * pr_n);
      }
    for (int64_t r = 0; r < g.prows(); ++r) {  // the spill past column 2tw − 1 added the next tile row's values
      plane[r * pr_n + 2 * tw] = 0.0f;
      plane[r * pr_n + 2 * tw + 1] = 0.0f;
    }
    for (int64_t ty = 0; ty < g.th; ++ty)
      for (int i = 0; i < 4; ++i) {  // its spill lands past pcols(), in the row's room
        const float* p = pr + (i * 4 + 2) * pn + ty * tw;
        add_even_odd(p, p + pn, tw, plane + (2 * ty + i) * pr_n + 2);
      }
    float* out = dx + ch * g.h * g.w;
    for (int64_t iy = 0; iy < g.h; ++iy)
      std::copy(plane + (iy + g.ph) * pr_n + g.pw, plane + (iy + g.ph) * pr_n + g.pw + g.w, out + iy * g.w);
  }
}

GT_CPU_KERNEL(wino_input_f32, (const Wino& g, const float* x, float* v, int64_t ldv, int64_t col, float* buf),
              (g, x, v, ldv, col, buf), wino_input)
GT_CPU_KERNEL(wino_output_f32,
              (const Wino& g, const float* m, int64_t ldm, int64_t col, const float* bias, float* y, float* buf),
              (g, m, ldm, col, bias, y, buf), wino_output)
GT_CPU_KERNEL(wino_dy_f32, (const Wino& g, const float* dy, float* dm, int64_t ldm, int64_t col, float* buf),
              (g, dy, dm, ldm, col, buf), wino_dy)
GT_CPU_KERNEL(wino_dx_f32, (const Wino& g, const float* dv, int64_t ldv, int64_t col, float* dx, float* buf),
              (g, dv, ldv, col, dx, buf), wino_dx)

// Images per group of the 16 GEMMs: enough tiles for products of about kWinoCols columns, at most the chunk's. Tried
// 64, 96, 128, 256 and 512 (bench/conv_rate.cpp, one thread): 128 was the fastest or level at every layer there;
// from 256 up the group's 16 V and 16 M matrices (a CNN layer's 1.8 MiB at 256) no longer stay in L2.
constexpr int64_t kWinoCols = 128;
int64_t wino_group(const Wino& g, int64_t images) {
  return std::clamp<int64_t>((kWinoCols + g.tiles() - 1) / g.tiles(), 1, std::max<int64_t>(images, 1));
}
size_t wino_buf_floats(const Wino& g) {
  return std::max({wino_input_floats(g), wino_output_floats(g), wino_dy_floats(g), wino_dx_floats(g)});
}
// The calling thread's scratch for groups of up to n_max columns: V (or dV) 16 × C × n, M (or dM) 16 × O × n, and
// the transforms' buffer.
struct WinoScratch {
  float *v, *m, *buf;
  WinoScratch(const Wino& g, int64_t n_max) {
    v = scratch<float>(static_cast<size_t>(16 * (g.c + g.o) * n_max) + wino_buf_floats(g)).data();
    m = v + 16 * g.c * n_max;
    buf = m + 16 * g.o * n_max;
  }
};

}  // namespace

void wino_forward(const Wino& g, int64_t batch, const float* x, const float* w, const float* bias, float* y) {
  std::vector<float> u(static_cast<size_t>(16 * g.o * g.c));
  wino_weights(g, w, u.data());
  batch_chunks(batch, [&](int, int64_t b0, int64_t b1) {
    const int64_t group = wino_group(g, b1 - b0);
    const WinoScratch scr(g, group * g.tiles());
    float *v = scr.v, *m = scr.m, *buf = scr.buf;
    for (int64_t n0 = b0; n0 < b1; n0 += group) {
      const int64_t imgs = std::min(group, b1 - n0), n = imgs * g.tiles();
      for (int64_t i = 0; i < imgs; ++i) wino_input_f32(g, x + (n0 + i) * g.c * g.h * g.w, v, n, i * g.tiles(), buf);
      for (int xi = 0; xi < 16; ++xi)
        sgemm(false, false, static_cast<int>(g.o), static_cast<int>(n), static_cast<int>(g.c),
              u.data() + xi * g.o * g.c, static_cast<int>(g.c), v + xi * g.c * n, static_cast<int>(n), 0.0f,
              m + xi * g.o * n, static_cast<int>(n));
      for (int64_t i = 0; i < imgs; ++i)
        wino_output_f32(g, m, n, i * g.tiles(), bias, y + (n0 + i) * g.o * g.oh * g.ow, buf);
    }
  });
}

void wino_backward(const Wino& g, int64_t batch, const float* x, const float* w, const float* dy, float* dx, float* dw,
                   float* db, float beta) {
  std::vector<float> u(dx ? static_cast<size_t>(16 * g.o * g.c) : 0);  // U: only dx's products read it
  if (dx) wino_weights(g, w, u.data());
  const int max_chunks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(batch, num_threads())));
  const size_t usize = static_cast<size_t>(16 * g.o * g.c);
  std::vector<std::vector<float>> part_u(static_cast<size_t>(max_chunks)), part_b(static_cast<size_t>(max_chunks));
  const int chunks = batch_chunks(batch, [&](int chunk, int64_t b0, int64_t b1) {
    std::vector<float>& du = part_u[static_cast<size_t>(chunk)];
    du.assign(usize, 0.0f);
    std::vector<float>& gb = part_b[static_cast<size_t>(chunk)];
    if (db) gb.assign(static_cast<size_t>(g.o), 0.0f);
    const int64_t group = wino_group(g, b1 - b0);
    const WinoScratch scr(g, group * g.tiles());
    float *v = scr.v, *dm = scr.m, *buf = scr.buf;  // V, then dV in its place; dM
    for (int64_t n0 = b0; n0 < b1; n0 += group) {
      const int64_t imgs = std::min(group, b1 - n0), n = imgs * g.tiles();
      for (int64_t i = 0; i < imgs; ++i) {
        const float* dyi = dy + (n0 + i) * g.o * g.oh * g.ow;
        wino_input_f32(g, x + (n0 + i) * g.c * g.h * g.w, v, n, i * g.tiles(), buf);
        wino_dy_f32(g, dyi, dm, n, i * g.tiles(), buf);
        if (db) add_row_sums_f32(dyi, g.o, g.oh * g.ow, gb.data());
      }
      const int on = static_cast<int>(g.o), cn = static_cast<int>(g.c), nn = static_cast<int>(n);
      for (int xi = 0; xi < 16; ++xi) {
        float* vx = v + xi * g.c * n;
        const float* dmx = dm + xi * g.o * n;
        // dU[ξ] (O × C) += dM[ξ] (O × n) · V[ξ]ᵀ, then dV[ξ] (C × n) = U[ξ]ᵀ · dM[ξ] over V[ξ]
        sgemm(false, true, on, cn, nn, dmx, nn, vx, nn, 1.0f, du.data() + xi * g.o * g.c, cn);
        if (dx) sgemm(true, false, cn, nn, on, u.data() + xi * g.o * g.c, cn, dmx, nn, 0.0f, vx, nn);
      }
      if (dx)
        for (int64_t i = 0; i < imgs; ++i) wino_dx_f32(g, v, n, i * g.tiles(), dx + (n0 + i) * g.c * g.h * g.w, buf);
    }
  });
  for (int c = 1; c < chunks; ++c) {
    const std::vector<float>& p = part_u[static_cast<size_t>(c)];
    for (size_t i = 0; i < usize; ++i) part_u[0][i] += p[i];
  }
  wino_weight_grad(g, part_u[0].data(), beta, dw);
  if (db) add_chunk_partials(part_b, chunks, beta, db, g.o);
}

}  // namespace gt::cpu::conv_detail
