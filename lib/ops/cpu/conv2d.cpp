// CPU convolution (ops/conv2d.h), threaded over the batch: im2col + GEMM per sample, or Winograd's F(2×2, 3×3) for
// the 3×3 stride-1 windows it applies to (ops/cpu/conv_algo.h says which runs). Under a half product precision
// (ops/precision.h) the im2col GEMMs multiply rounded operands with f32 accumulation, as ops/cpu/matmul.cpp's do.
#include "ops/conv2d.h"

#include "core/env.h"
#include "core/parallel.h"
#include "ops/cpu/bf16_gemm.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/sgemm.h"
#include "ops/cpu/vec_math.h"
#include "ops/precision.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <vector>

namespace gt::cpu {
namespace {

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

// The outputs ox whose tap ix = ox·stride − pad + offset lands inside [0, w): [lo, hi).
struct Span {
  int64_t lo, hi;
};
inline Span valid_outputs(int64_t out, int64_t w, int64_t stride, int64_t pad, int64_t offset) {
  // ix ≥ 0 ⇔ ox ≥ ceil((pad − offset) / stride); ix < w ⇔ ox ≤ floor((w − 1 + pad − offset) / stride)
  const int64_t a = pad - offset, b = w - 1 + pad - offset;
  int64_t lo = a <= 0 ? 0 : (a + stride - 1) / stride;
  int64_t hi = b < 0 ? 0 : b / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
  return {lo, hi};
}

// Stride 1 with ow = w (the "same" padding of most CNNs, any dilation): a tap's output rows then have the input's
// row stride, so the block of tap (ky, kx) is one contiguous run of the plane shifted by (iy − oy)·w + (ix − ox),
// copied (im2col) or added (col2im) in one loop instead of a short call per output row; the columns whose tap falls
// left or right of the image, which the run wraps onto the neighbouring row, are zeroed afterwards (im2col) or
// before (col2im, in the scratch dcol). Each tap's rows [oy0, oy1) read inside the image; the others are zero.
struct SameRowTap {
  int64_t oy0, oy1;  // output rows whose tap row is inside the image
  int64_t shift;     // plane offset of the tap of output (oy, ox) from oy·w + ox
  int64_t off;       // ix − ox
  int64_t a, b;      // the block's run [a, b) (within rows [oy0, oy1)) whose taps j + shift are inside the plane
};
inline bool rows_align(const Geometry& g) { return g.win.sh == 1 && g.win.sw == 1 && g.ow == g.w; }
inline SameRowTap same_row_tap(const Geometry& g, int64_t ky, int64_t kx) {
  const Window2d& k = g.win;
  const int64_t dy = ky * k.dh - k.ph, off = kx * k.dw - k.pw;  // iy = oy + dy, ix = ox + off
  const int64_t oy0 = std::clamp<int64_t>(-dy, 0, g.oh), oy1 = std::clamp<int64_t>(g.h - dy, oy0, g.oh);
  const int64_t shift = dy * g.w + off;
  const int64_t a = std::clamp<int64_t>(-shift, oy0 * g.ow, oy1 * g.ow);
  return {oy0, oy1, shift, off, a, std::clamp<int64_t>(g.h * g.w - shift, a, oy1 * g.ow)};
}
// Zeroes, in rows [oy0, oy1) of a tap's block, the columns whose tap ix = ox + off is outside [0, w).
template <class T>
GT_INLINE void zero_wrapped_columns(const Geometry& g, const SameRowTap& t, T* block) {
  const int64_t n = std::min(std::abs(t.off), g.ow), first = t.off < 0 ? 0 : g.ow - n;
  if (n == 1)  // a 3×3 window's: one element a row, stored directly (a fill per row would be a memset call)
    for (int64_t oy = t.oy0; oy < t.oy1; ++oy) block[oy * g.ow + first] = T(0);
  else if (n > 1)
    for (int64_t oy = t.oy0; oy < t.oy1; ++oy)
      std::fill(block + oy * g.ow + first, block + oy * g.ow + first + n, T(0));
}

// col (C·kh·kw, oh·ow) ← x (C, h, w); out-of-image taps read 0. The in-image run of each row is found once, so
// the inner loop has no bounds checks (and is a plain copy at stride 1).
template <class T>
GT_INLINE void im2col(const Geometry& g, const T* x, T* col) {
  const Window2d& k = g.win;
  if (rows_align(g)) {
    for (int64_t ch = 0; ch < g.c; ++ch)
      for (int64_t ky = 0; ky < k.kh; ++ky)
        for (int64_t kx = 0; kx < k.kw; ++kx) {
          T* out = col + ((ch * k.kh + ky) * k.kw + kx) * g.cols();
          const SameRowTap t = same_row_tap(g, ky, kx);
          const T* plane = x + ch * g.h * g.w;
          std::fill(out, out + t.a, T(0));
          for (int64_t j = t.a; j < t.b; ++j) out[j] = plane[j + t.shift];
          std::fill(out + t.b, out + g.cols(), T(0));
          zero_wrapped_columns(g, t, out);
        }
    return;
  }
  for (int64_t ch = 0; ch < g.c; ++ch)
    for (int64_t ky = 0; ky < k.kh; ++ky)
      for (int64_t kx = 0; kx < k.kw; ++kx) {
        T* out = col + ((ch * k.kh + ky) * k.kw + kx) * g.cols();
        const Span sx = valid_outputs(g.ow, g.w, k.sw, k.pw, kx * k.dw);
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * k.sh - k.ph + ky * k.dh;
          T* row = out + oy * g.ow;
          if (iy < 0 || iy >= g.h) {
            std::fill(row, row + g.ow, T(0));
            continue;
          }
          const T* src = x + (ch * g.h + iy) * g.w - k.pw + kx * k.dw;  // src[ox·sw] is the tap of ox
          std::fill(row, row + sx.lo, T(0));
          if (k.sw == 1)
            std::copy(src + sx.lo, src + sx.hi, row + sx.lo);
          else
            for (int64_t ox = sx.lo; ox < sx.hi; ++ox) row[ox] = src[ox * k.sw];
          std::fill(row + sx.hi, row + g.ow, T(0));
        }
      }
}

// dx (C, h, w) += col2im(dcol); the adjoint of im2col. On the aligned path dcol's wrapped columns are zeroed first
// (it is the caller's scratch), so the run adds zeros where a tap falls outside the image.
template <class T>
GT_INLINE void col2im(const Geometry& g, T* dcol, T* dx) {
  const Window2d& k = g.win;
  if (rows_align(g)) {
    for (int64_t ch = 0; ch < g.c; ++ch)
      for (int64_t ky = 0; ky < k.kh; ++ky)
        for (int64_t kx = 0; kx < k.kw; ++kx) {
          T* in = dcol + ((ch * k.kh + ky) * k.kw + kx) * g.cols();
          const SameRowTap t = same_row_tap(g, ky, kx);
          T* plane = dx + ch * g.h * g.w;
          zero_wrapped_columns(g, t, in);
          for (int64_t j = t.a; j < t.b; ++j) plane[j + t.shift] += in[j];
        }
    return;
  }
  for (int64_t ch = 0; ch < g.c; ++ch)
    for (int64_t ky = 0; ky < k.kh; ++ky)
      for (int64_t kx = 0; kx < k.kw; ++kx) {
        const T* in = dcol + ((ch * k.kh + ky) * k.kw + kx) * g.cols();
        const Span sx = valid_outputs(g.ow, g.w, k.sw, k.pw, kx * k.dw);
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * k.sh - k.ph + ky * k.dh;
          if (iy < 0 || iy >= g.h) continue;
          T* dst = dx + (ch * g.h + iy) * g.w - k.pw + kx * k.dw;
          const T* row = in + oy * g.ow;
          if (k.sw == 1)
            for (int64_t ox = sx.lo; ox < sx.hi; ++ox) dst[ox] += row[ox];
          else
            for (int64_t ox = sx.lo; ox < sx.hi; ++ox) dst[ox * k.sw] += row[ox];
        }
      }
}

// The f32 copies and sums compiled per instruction set (they ran on SSE inside the batch's lambda).
GT_CPU_KERNEL(im2col_f32, (const Geometry& g, const float* x, float* col), (g, x, col), im2col<float>)
GT_CPU_KERNEL(col2im_f32, (const Geometry& g, float* dcol, float* dx), (g, dcol, dx), col2im<float>)

// gb[o] += Σ_i dy[o·cols + i] for o < rows: the bias gradient of one image, each row summed by lane_sum16 (one
// chain of dependent additions per row was ~5 % of a CNN training step).
template <class T>
GT_INLINE void add_row_sums(const T* dy, int64_t rows, int64_t cols, T* gb) {
  for (int64_t o = 0; o < rows; ++o) {
    const T* row = dy + o * cols;
    gb[o] += lane_sum16<T>(cols, [&](int64_t i) { return row[i]; });
  }
}
GT_CPU_KERNEL(add_row_sums_f32, (const float* dy, int64_t rows, int64_t cols, float* gb), (dy, rows, cols, gb),
              add_row_sums<float>)

template <class T>
void im2col_t(const Geometry& g, const T* x, T* col) {
  if constexpr (std::is_same_v<T, float>)
    im2col_f32(g, x, col);
  else
    im2col<T>(g, x, col);
}
template <class T>
void col2im_t(const Geometry& g, T* dcol, T* dx) {
  if constexpr (std::is_same_v<T, float>)
    col2im_f32(g, dcol, dx);
  else
    col2im<T>(g, dcol, dx);
}

template <class T>
std::vector<T>& scratch(size_t n) {
  // One growing buffer per thread: after the first step no call allocates.
  static thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// The GEMM operands of a convolution in the calling thread's product precision: x, w and dy as they are (fp32, tf32,
// f64), or rounded to bf16/fp16: w through the scope's rounded weights (once per step), x and dy into the calling
// thread's scratch before the batch fans out. im2col only copies x's values (and zeros, which stay zero), so rounding
// x first rounds every column it builds. The bias and db stay fp32 (db sums the unrounded dy).
// On the native bf16 path (ops/cpu/bf16_gemm.h) the operands stay as they are: gemm_bf16 rounds them while it packs,
// and so do our f32 kernels on the conversion path (bf16_in_pack: sgemm_bf16_rounded, ops/cpu/sgemm.h).
template <class T>
struct ConvOperands {
  const T *x = nullptr, *w = nullptr, *dy = nullptr;
  bool native_bf16 = false, bf16_in_pack = false;
  ConvOperands(const Tensor& x_, const Tensor& w_, const Tensor* dy_, bool need_w) {
    x = x_.data<T>();
    w = w_.data<T>();
    dy = dy_ ? dy_->data<T>() : nullptr;
    if constexpr (std::is_same_v<T, float>) {
      const auto format = half_format(product_precision());
      native_bf16 = format == HalfFormat::bf16 && cpu_bf16_path() == CpuBf16Path::native;
      bf16_in_pack = format == HalfFormat::bf16 && !native_bf16 && cpu_bf16_rounds_in_pack();
      if (format && !native_bf16 && !bf16_in_pack) {
        thread_local std::vector<float> buf_x, buf_dy;
        x = rounded_copy(x_, *format, buf_x);
        if (need_w) w = half_weight(w_, *format);
        if (dy_) dy = rounded_copy(*dy_, *format, buf_dy);
      }
    }
  }
};

// c = op(a)·op(b) + beta·c of one image's convolution GEMM: the f32 path (f32, or by conversion on rounded copies;
// f64), the native bf16 kernel, or the f32 kernels rounding to bf16 as they pack.
template <class T>
void conv_gemm(const ConvOperands<T>& in, bool ta, bool tb, int m, int n, int k, const T* a, int lda, const T* b,
               int ldb, T beta, T* c, int ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (in.native_bf16) return gemm_bf16(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
    if (in.bf16_in_pack) return sgemm_bf16_rounded(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
  }
  gemm_raw<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
}

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

bool use_winograd(const Tensor& x, const Tensor& w, const Window2d& win, int64_t groups) {
  return cpu_conv_algo(x.dtype(), x.shape(), w.shape(), win, groups) == CpuConvAlgo::winograd;
}

template <class T>
void conv_fwd_t(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win, int64_t groups, Tensor& y) {
  const int64_t batch = x.dim(0), cin = x.dim(1), cout = y.dim(1);
  const Geometry g{cin / groups, x.dim(2), x.dim(3), y.dim(2), y.dim(3), win};
  const int64_t og = cout / groups;
  if constexpr (std::is_same_v<T, float>)
    if (use_winograd(x, w, win, groups))
      return wino_forward(Wino(g, cout), batch, x.data<float>(), w.data<float>(),
                          b.defined() ? b.data<float>() : nullptr, y.data<float>());
  const ConvOperands<T> in(x, w, nullptr, true);
  const T *px = in.x, *pw = in.w, *pb = b.defined() ? b.data<T>() : nullptr;
  T* py = y.data<T>();
  batch_chunks(batch, [&](int, int64_t b0, int64_t b1) {
    T* col = g.is_identity() ? nullptr : scratch<T>(static_cast<size_t>(g.rows() * g.cols())).data();
    for (int64_t n = b0; n < b1; ++n)
      for (int64_t grp = 0; grp < groups; ++grp) {
        const T* xs = px + (n * cin + grp * g.c) * g.h * g.w;
        T* ys = py + (n * cout + grp * og) * g.cols();
        if (col) im2col_t<T>(g, xs, col);
        // y (og, oh·ow) = W_g (og, C·kh·kw) · col (C·kh·kw, oh·ow)
        conv_gemm<T>(in, false, false, static_cast<int>(og), static_cast<int>(g.cols()), static_cast<int>(g.rows()),
                     pw + grp * og * g.rows(), static_cast<int>(g.rows()), col ? col : xs, static_cast<int>(g.cols()),
                     T(0), ys, static_cast<int>(g.cols()));
        if (pb)
          for (int64_t o = 0; o < og; ++o) {
            const T bias = pb[grp * og + o];
            T* row = ys + o * g.cols();
            for (int64_t i = 0; i < g.cols(); ++i) row[i] += bias;
          }
      }
  });
}

template <class T>
void conv_bwd_t(const Tensor& x, const Tensor& w, const Tensor& dy, const Window2d& win, int64_t groups, Tensor& dx,
                Tensor& dw, Tensor& db, double beta) {
  const int64_t batch = x.dim(0), cin = x.dim(1), cout = dy.dim(1);
  const Geometry g{cin / groups, x.dim(2), x.dim(3), dy.dim(2), dy.dim(3), win};
  const int64_t og = cout / groups, wsize = w.numel();
  T* pdx = dx.defined() ? dx.data<T>() : nullptr;
  if constexpr (std::is_same_v<T, float>)
    if (use_winograd(x, w, win, groups))
      return wino_backward(Wino(g, cout), batch, x.data<float>(), w.data<float>(), dy.data<float>(), pdx,
                           dw.data<float>(), db.defined() ? db.data<float>() : nullptr, static_cast<float>(beta));
  const ConvOperands<T> in(x, w, &dy, pdx != nullptr);
  const T *px = in.x, *pw = in.w, *pdy = in.dy;  // the GEMMs' operands
  const T* pdy_sum = dy.data<T>();               // what db sums
  const bool want_db = db.defined();
  // Per-chunk partial weight and bias gradients, summed in chunk order afterwards.
  const int max_chunks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(batch, num_threads())));
  std::vector<std::vector<T>> part_w(static_cast<size_t>(max_chunks)), part_b(static_cast<size_t>(max_chunks));
  const int chunks = batch_chunks(batch, [&](int c, int64_t b0, int64_t b1) {
    std::vector<T>& gw = part_w[static_cast<size_t>(c)];
    std::vector<T>& gb = part_b[static_cast<size_t>(c)];
    gw.assign(static_cast<size_t>(wsize), T(0));
    if (want_db) gb.assign(static_cast<size_t>(cout), T(0));
    const size_t col_n = static_cast<size_t>(g.rows() * g.cols());
    std::vector<T>& buf = scratch<T>(g.is_identity() ? col_n : 2 * col_n);
    T* col = g.is_identity() ? nullptr : buf.data();
    T* dcol = g.is_identity() ? buf.data() : buf.data() + col_n;
    for (int64_t n = b0; n < b1; ++n) {
      if (pdx) std::fill(pdx + n * cin * g.h * g.w, pdx + (n + 1) * cin * g.h * g.w, T(0));
      for (int64_t grp = 0; grp < groups; ++grp) {
        const T* xs = px + (n * cin + grp * g.c) * g.h * g.w;
        const T* dys = pdy + (n * cout + grp * og) * g.cols();
        const T* dys_sum = pdy_sum + (n * cout + grp * og) * g.cols();
        if (col) im2col_t<T>(g, xs, col);
        // dW_g (og, C·kh·kw) += dy (og, oh·ow) · colᵀ
        conv_gemm<T>(in, false, true, static_cast<int>(og), static_cast<int>(g.rows()), static_cast<int>(g.cols()), dys,
                     static_cast<int>(g.cols()), col ? col : xs, static_cast<int>(g.cols()), T(1),
                     gw.data() + grp * og * g.rows(), static_cast<int>(g.rows()));
        if (want_db) {
          if constexpr (std::is_same_v<T, float>)
            add_row_sums_f32(dys_sum, og, g.cols(), gb.data() + grp * og);
          else
            add_row_sums<T>(dys_sum, og, g.cols(), gb.data() + grp * og);
        }
        if (pdx) {
          // dcol (C·kh·kw, oh·ow) = W_gᵀ · dy, then scattered back onto the image.
          T* dxs = pdx + (n * cin + grp * g.c) * g.h * g.w;
          conv_gemm<T>(in, true, false, static_cast<int>(g.rows()), static_cast<int>(g.cols()), static_cast<int>(og),
                       pw + grp * og * g.rows(), static_cast<int>(g.rows()), dys, static_cast<int>(g.cols()), T(0),
                       g.is_identity() ? dxs : dcol, static_cast<int>(g.cols()));
          if (!g.is_identity()) col2im_t<T>(g, dcol, dxs);
        }
      }
    }
  });
  add_chunk_partials(part_w, chunks, beta, dw.data<T>(), wsize);
  if (want_db) add_chunk_partials(part_b, chunks, beta, db.data<T>(), cout);
}

std::atomic<int> g_conv_forced{-1};  // a CpuConvAlgo, or −1: the environment's choice

}  // namespace

std::string to_string(CpuConvAlgo algo) { return algo == CpuConvAlgo::winograd ? "winograd" : "im2col"; }

std::optional<CpuConvAlgo> env_cpu_conv_algo() {
  static const std::optional<size_t> choice = env_choice("GPUTRAIN_CPU_CONV", {"im2col", "winograd"});
  if (!choice) return std::nullopt;
  return *choice == 0 ? CpuConvAlgo::im2col : CpuConvAlgo::winograd;
}

void force_cpu_conv_algo(std::optional<CpuConvAlgo> algo) {
  g_conv_forced.store(algo ? static_cast<int>(*algo) : -1, std::memory_order_relaxed);
}

bool winograd_applies(DType dtype, const Shape& w, const Window2d& win, int64_t groups) {
  return dtype == DType::f32 && w.rank() == 4 && w[2] == 3 && w[3] == 3 && win.kh == 3 && win.kw == 3 && win.sh == 1 &&
         win.sw == 1 && win.dh == 1 && win.dw == 1 && groups == 1;
}

CpuConvAlgo cpu_conv_algo(DType dtype, const Shape& x, const Shape& w, const Window2d& win, int64_t groups) {
  if (!winograd_applies(dtype, w, win, groups)) return CpuConvAlgo::im2col;
  const int forced = g_conv_forced.load(std::memory_order_relaxed);
  const std::optional<CpuConvAlgo> asked =
      forced >= 0 ? std::optional(static_cast<CpuConvAlgo>(forced)) : env_cpu_conv_algo();
  if (asked) return *asked;
  if (x.rank() != 4 || half_format(product_precision())) return CpuConvAlgo::im2col;
  const int64_t tiles = (window_out(x[2], 3, 1, win.ph, 1) + 1) / 2 * ((window_out(x[3], 3, 1, win.pw, 1) + 1) / 2);
  const bool wide = x[1] >= kWinogradMinChannels && w[0] >= kWinogradMinChannels;
  return wide && tiles <= kWinogradMaxTiles ? CpuConvAlgo::winograd : CpuConvAlgo::im2col;
}

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Window2d& win, int64_t groups, Tensor& y) {
  for_float_type(x.dtype(), [&](auto t) { conv_fwd_t<decltype(t)>(x, w, b, win, groups, y); });
}
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Window2d& win, int64_t groups,
                     Tensor& dx, Tensor& dw, Tensor& db, double beta) {
  for_float_type(x.dtype(), [&](auto t) { conv_bwd_t<decltype(t)>(x, w, dy, win, groups, dx, dw, db, beta); });
}

}  // namespace gt::cpu
