// CPU convolution (ops/conv2d.h), threaded over the batch: im2col + GEMM per sample, or Winograd's F(2×2, 3×3) for
// the 3×3 stride-1 windows it applies to (ops/cpu/conv_algo.h says which runs). Under a half product precision
// (ops/precision.h) the im2col GEMMs multiply rounded operands with f32 accumulation, as ops/cpu/matmul.cpp's do.
#include "ops/conv2d.h"
#include "ops/cpu/conv2d_common.h"

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
using namespace conv_detail;

namespace {

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

}  // namespace

namespace conv_detail {

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

}  // namespace conv_detail

namespace {

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
  const bool want_dw = dw.defined();  // not for a frozen weight (train.freeze): the input's gradient only
  if constexpr (std::is_same_v<T, float>)
    if (want_dw && use_winograd(x, w, win, groups))
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
    if (want_dw) gw.assign(static_cast<size_t>(wsize), T(0));
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
        if (want_dw) {
          if (col) im2col_t<T>(g, xs, col);
          // dW_g (og, C·kh·kw) += dy (og, oh·ow) · colᵀ
          conv_gemm<T>(in, false, true, static_cast<int>(og), static_cast<int>(g.rows()), static_cast<int>(g.cols()),
                       dys, static_cast<int>(g.cols()), col ? col : xs, static_cast<int>(g.cols()), T(1),
                       gw.data() + grp * og * g.rows(), static_cast<int>(g.rows()));
        }
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
  if (want_dw) add_chunk_partials(part_w, chunks, beta, dw.data<T>(), wsize);
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