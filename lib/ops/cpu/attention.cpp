// CPU causal attention (ops/attention.h), blocked and causal: one (batch, head) per task, whose q, k, v (and dout,
// going back) are first copied into zero-padded buffers, and queries in tiles of kTile rows. Register-blocked loops
// (kRows rows × kCols columns of accumulators) compute a tile's scores only up to each block of rows' last key (half
// of the square a GEMM would compute), the softmax with a vectorised exp, and the products with v, k and q; at most a
// [kTile, T] block of scores exists per thread. The backward recomputes the tile's probabilities from the forward's
// log-sum-exp. The f32 bodies are compiled per instruction set (GT_CPU_KERNEL). Each task runs on one thread in a
// fixed order, so results do not depend on the thread count, and every sum runs in the same order whichever rows
// share its tile, so a decoded row equals the forward's bit for bit. Dropout (ops/attention.h) scales or zeroes each
// probability from its Philox draw before the product with v, and the backward draws the same mask again; without
// dropout no mask is drawn. Under a half product precision (ops/precision.h) the four products multiply operands
// rounded to bf16/fp16 with f32 accumulation, as a GPU's flash attention does: q, k, v and dout in each task's
// copies of them, and each row of P (after dropout) and of dS where it is made; the scores' scale, the softmax, its
// statistics (max, sum, lse), delta = Σ dout·out and dS's arithmetic stay f32.
#include "ops/attention.h"
#include "ops/cpu/attention_blocks.h"

#include "core/half.h"
#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"
#include "ops/cpu/vec_math.h"
#include "ops/math.h"
#include "ops/precision.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace gt::cpu {
using namespace attention_detail;

namespace {

// One (batch, head), query rows [first, first + n) over keys [0, first + n): q, k, v rows ld apart from qkv's head
// slice; out rows ldo apart (row i at out + (i − first)·ldo); lse (may be null) indexed by position; drop (null:
// none) with the mask index of (i, j) at mask + i·t + j; half (null: none) the format the products' operands are
// rounded to. buf holds attn_fwd_scratch(first + n, d, half) elements.
int64_t attn_fwd_scratch(int64_t keys, int64_t d, const HalfFormat* half) {
  const int64_t tp = round_up(keys, kCols), dp = round_up(d, kCols);
  return d * tp + kTile * tp + (packed(d, half) ? kTile * dp + tp * dp + kTile * dp : 0);
}

template <class Cfg, class T>
GT_INLINE void attn_fwd_task(const T* q, const T* k, const T* v, int64_t ld, int64_t first, int64_t n, int64_t d,
                             T scale, T* out, int64_t ldo, T* lse, const ops::AttentionDropout* drop, uint64_t mask,
                             int64_t t, const HalfFormat* half, T* buf) {
  constexpr int kRows = Cfg::rows;
  const int64_t keys = first + n, tp = round_up(keys, kCols), dp = round_up(d, kCols);
  const T keep_scale = drop ? static_cast<T>(1.0 / (1.0 - drop->p)) : T(1);  // as ops/dropout.h's kernels round it
  const bool pack = packed(d, half);
  T* kt = buf;              // [d][tp]
  T* s = kt + d * tp;       // [kTile][tp]: scores, then probabilities
  T* qp = s + kTile * tp;   // packed: [kTile][dp], the tile's queries
  T* vp = qp + kTile * dp;  // packed: [tp][dp]
  T* op = vp + tp * dp;     // packed: [kTile][dp]
  pack_transposed(k, ld, keys, d, tp, kt);
  round_packed(half, kt, d * tp);
  if (pack) {
    pack_rows(v, ld, keys, d, dp, tp, vp);
    round_packed(half, vp, tp * dp);
  }
  const T* vs = pack ? vp : v;
  const int64_t ldv = pack ? dp : ld;
  for (int64_t i0 = first; i0 < keys; i0 += kTile) {
    const int64_t m = std::min(kTile, keys - i0);
    if (pack) {
      pack_rows(q + i0 * ld, ld, m, d, dp, m, qp);
      round_packed(half, qp, m * dp);
    }
    const T* qs = pack ? qp : q + i0 * ld;
    const int64_t ldq = pack ? dp : ld;
    for (int64_t r0 = 0; r0 < m; r0 += kRows) {  // scores up to each block of rows' last key
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
      const int64_t nc = round_up(i0 + r0 + rows, kCols);
      for (int64_t j0 = 0; j0 < nc; j0 += kCols)
        dot_block<Cfg>(qs + r0 * ldq, ldq, rows, kt, tp, d, j0, scale, s + r0 * tp, tp);
    }
    for (int64_t r = 0; r < m; ++r) {
      T* row = s + r * tp;
      const int64_t last = i0 + r;  // keys 0..last are visible to query i0 + r
      const T mx = row_max(row, last + 1);
      const double sum = softmax_row(row, last + 1, mx);
      std::fill(row + last + 1, row + i0 + m, T(0));
      if (lse) lse[last] = static_cast<T>(mx + std::log(sum));
      if (drop)
        for_each_keep(last + 1, mask + static_cast<uint64_t>(last * t), *drop,
                      [&](int64_t j, bool keep) { row[j] = keep ? row[j] * keep_scale : T(0); });
      round_row(half, row, last + 1);  // P, the operand of P·v
    }
    T* os = pack ? op : out + (i0 - first) * ldo;
    const int64_t ldc = pack ? dp : ldo;
    for (int64_t r0 = 0; r0 < m; r0 += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
      for (int64_t e0 = 0; e0 < dp; e0 += kCols)
        rows_block<Cfg>(s + r0 * tp, tp, rows, vs, ldv, i0 + r0 + rows, e0, os + r0 * ldc, ldc);
    }
    if (pack)
      for (int64_t r = 0; r < m; ++r) std::copy(op + r * dp, op + r * dp + d, out + (i0 - first + r) * ldo);
  }
}

// One (batch, head) of the backward over T positions: dq, dk, dv rows ld apart (overwritten); g (dout) and o (out)
// rows ldo apart; lse and delta (written: Σ dout·out per row, from the unrounded dout) by position; drop and mask as
// the forward's; half (null: none) the format the products' operands are rounded to. buf holds
// attn_bwd_scratch(t, d, half) elements.
int64_t attn_bwd_scratch(int64_t t, int64_t d, const HalfFormat* half) {
  const int64_t tp = round_up(t, kCols), dp = round_up(d, kCols);
  return 2 * d * tp + 2 * kTile * tp + (packed(d, half) ? 5 * tp * dp + kTile * dp : 0);
}

template <class Cfg, class T>
GT_INLINE void attn_bwd_task(const T* q, const T* k, const T* v, int64_t ld, const T* g, const T* o, int64_t ldo,
                             const T* lse, T* delta, int64_t t, int64_t d, T scale, T* dq, T* dk, T* dv,
                             const ops::AttentionDropout* drop, uint64_t mask, const HalfFormat* half, T* buf) {
  constexpr int kRows = Cfg::rows;
  const int64_t tp = round_up(t, kCols), dp = round_up(d, kCols);
  const T keep_scale = drop ? static_cast<T>(1.0 / (1.0 - drop->p)) : T(1);
  const bool pack = packed(d, half);
  T* kt = buf;              // [d][tp]
  T* vt = kt + d * tp;      // [d][tp]
  T* p = vt + d * tp;       // [kTile][tp]: probabilities
  T* ds = p + kTile * tp;   // [kTile][tp]: dP, then dS
  T* qp = ds + kTile * tp;  // packed: [tp][dp]
  T* kp = qp + tp * dp;     // packed: [tp][dp]
  T* gp = kp + tp * dp;     // packed: [tp][dp], dout
  T* dkp = gp + tp * dp;    // packed: [tp][dp]
  T* dvp = dkp + tp * dp;   // packed: [tp][dp]
  T* dqp = dvp + tp * dp;   // packed: [kTile][dp]
  pack_transposed(k, ld, t, d, tp, kt);
  pack_transposed(v, ld, t, d, tp, vt);
  round_packed(half, kt, 2 * d * tp);  // kt and vt
  if (pack) {
    pack_rows(q, ld, t, d, dp, tp, qp);
    pack_rows(k, ld, t, d, dp, tp, kp);
    pack_rows(g, ldo, t, d, dp, tp, gp);
    round_packed(half, qp, 3 * tp * dp);      // qp, kp and gp
    std::fill(dkp, dkp + 2 * tp * dp, T(0));  // dk and dv
  } else {
    for (int64_t j = 0; j < t; ++j) {
      std::fill(dk + j * ld, dk + j * ld + d, T(0));
      std::fill(dv + j * ld, dv + j * ld + d, T(0));
    }
  }
  const T* qs = pack ? qp : q;
  const T* ks = pack ? kp : k;
  const T* gs = pack ? gp : g;
  T* dks = pack ? dkp : dk;
  T* dvs = pack ? dvp : dv;
  const int64_t ldq = pack ? dp : ld, ldg = pack ? dp : ldo;  // q, k, dk, dv rows ldq apart; dout rows ldg
  for (int64_t i = 0; i < t; ++i)
    delta[i] =
        static_cast<T>(lane_sum(d, [&](int64_t e) { return static_cast<double>(g[i * ldo + e]) * o[i * ldo + e]; }));
  for (int64_t i0 = 0; i0 < t; i0 += kTile) {
    const int64_t m = std::min(kTile, t - i0);
    for (int64_t r0 = 0; r0 < m; r0 += kRows) {  // scores and dP = dout·vᵀ up to each block of rows' last key
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
      const int64_t nc = round_up(i0 + r0 + rows, kCols);
      for (int64_t j0 = 0; j0 < nc; j0 += kCols) {
        dot_block<Cfg>(qs + (i0 + r0) * ldq, ldq, rows, kt, tp, d, j0, scale, p + r0 * tp, tp);
        dot_block<Cfg>(gs + (i0 + r0) * ldg, ldg, rows, vt, tp, d, j0, T(1), ds + r0 * tp, tp);
      }
    }
    for (int64_t r = 0; r < m; ++r) {
      T* pr = p + r * tp;
      T* dr = ds + r * tp;
      const int64_t last = i0 + r;
      const T li = lse[last], di = delta[last];
      if (drop) {
        // pr becomes m_ij p_ij, what dv sums; dr holds dout_i·v_j, the gradient of m_ij p_ij.
        for_each_keep(last + 1, mask + static_cast<uint64_t>(last * t), *drop, [&](int64_t j, bool keep) {
          const T pij = exp_keep_nan<T>(pr[j] - li), mij = keep ? keep_scale : T(0);
          dr[j] = pij * (mij * dr[j] - di) * scale;  // dS
          pr[j] = mij * pij;
        });
      } else {
        softmax_grad_row(pr, dr, last + 1, li, di, scale);
      }
      round_row(half, pr, last + 1);  // P (with dropout's m), the operand of Pᵀ·dout
      round_row(half, dr, last + 1);  // dS, the operand of dS·k and dSᵀ·q
      std::fill(pr + last + 1, pr + i0 + m, T(0));
      std::fill(dr + last + 1, dr + i0 + m, T(0));
    }
    T* dqs = pack ? dqp : dq + i0 * ld;
    const int64_t lddq = pack ? dp : ld;
    for (int64_t r0 = 0; r0 < m; r0 += kRows) {  // dq = dS·k
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
      for (int64_t e0 = 0; e0 < dp; e0 += kCols)
        rows_block<Cfg>(ds + r0 * tp, tp, rows, ks, ldq, i0 + r0 + rows, e0, dqs + r0 * lddq, lddq);
    }
    if (pack)
      for (int64_t r = 0; r < m; ++r) std::copy(dqp + r * dp, dqp + r * dp + d, dq + (i0 + r) * ld);
    // dk += dSᵀ·q and dv += Pᵀ·dout over the tile's rows at or after each key (the rows before it see it not).
    for (int64_t j0 = 0; j0 < i0 + m; j0 += kRows) {
      const int keys = static_cast<int>(std::min<int64_t>(kRows, i0 + m - j0));
      const int64_t r0 = std::max<int64_t>(0, j0 - i0);
      for (int64_t e0 = 0; e0 < dp; e0 += kCols) {
        cols_block<Cfg>(ds, tp, j0, keys, qs + i0 * ldq, ldq, r0, m, e0, dks, ldq);
        cols_block<Cfg>(p, tp, j0, keys, gs + i0 * ldg, ldg, r0, m, e0, dvs, ldq);
      }
    }
  }
  if (pack)
    for (int64_t j = 0; j < t; ++j) {
      std::copy(dkp + j * dp, dkp + j * dp + d, dk + j * ld);
      std::copy(dvp + j * dp, dvp + j * dp + d, dv + j * ld);
    }
}

// The f32 tasks: Narrow blocks compiled per instruction set, and Wide ones for AVX-512 (x86-64-v4) alone.
#define GT_ATTN_FWD_PARAMS                                                                                      \
  const float *q, const float *k, const float *v, int64_t ld, int64_t first, int64_t n, int64_t d, float scale, \
      float *out, int64_t ldo, float *lse, const ops::AttentionDropout *drop, uint64_t mask, int64_t t,         \
      const HalfFormat *half, float *buf
#define GT_ATTN_FWD_ARGS q, k, v, ld, first, n, d, scale, out, ldo, lse, drop, mask, t, half, buf
#define GT_ATTN_BWD_PARAMS                                                                                 \
  const float *q, const float *k, const float *v, int64_t ld, const float *g, const float *o, int64_t ldo, \
      const float *lse, float *delta, int64_t t, int64_t d, float scale, float *dq, float *dk, float *dv,  \
      const ops::AttentionDropout *drop, uint64_t mask, const HalfFormat *half, float *buf
#define GT_ATTN_BWD_ARGS q, k, v, ld, g, o, ldo, lse, delta, t, d, scale, dq, dk, dv, drop, mask, half, buf

GT_CPU_KERNEL(attn_fwd_task_f32, (GT_ATTN_FWD_PARAMS), (GT_ATTN_FWD_ARGS), attn_fwd_task<Narrow, float>)
GT_CPU_KERNEL(attn_bwd_task_f32, (GT_ATTN_BWD_PARAMS), (GT_ATTN_BWD_ARGS), attn_bwd_task<Narrow, float>)
#if defined(__x86_64__)
#define GT_ATTN_WIDE_TARGET __attribute__((target("arch=x86-64-v4")))
GT_ATTN_WIDE_TARGET void attn_fwd_task_f32_wide(GT_ATTN_FWD_PARAMS) { attn_fwd_task<Wide, float>(GT_ATTN_FWD_ARGS); }
GT_ATTN_WIDE_TARGET void attn_bwd_task_f32_wide(GT_ATTN_BWD_PARAMS) { attn_bwd_task<Wide, float>(GT_ATTN_BWD_ARGS); }
#endif

std::atomic<bool> g_attention_narrow{false};  // force_attention_narrow

// Whether the f32 tasks take the Wide blocks: the kernels run AVX-512 (ops/cpu/isa.h: the CPU has x86-64-v4's
// subsets and no test forced a narrower path) and no test asked for the Narrow ones.
bool attention_wide() { return cpu_isa() == CpuIsa::avx512 && !g_attention_narrow.load(std::memory_order_relaxed); }

void attn_fwd_task_dispatch(GT_ATTN_FWD_PARAMS) {
#if defined(__x86_64__)
  if (attention_wide()) return attn_fwd_task_f32_wide(GT_ATTN_FWD_ARGS);
#endif
  attn_fwd_task_f32(GT_ATTN_FWD_ARGS);
}
void attn_bwd_task_dispatch(GT_ATTN_BWD_PARAMS) {
#if defined(__x86_64__)
  if (attention_wide()) return attn_bwd_task_f32_wide(GT_ATTN_BWD_ARGS);
#endif
  attn_bwd_task_f32(GT_ATTN_BWD_ARGS);
}

// The calling thread's half format for attention's products (null: fp32/tf32, and always for f64).
template <class T>
std::optional<HalfFormat> attention_half() {
  if constexpr (std::is_same_v<T, float>) return half_format(product_precision());
  return std::nullopt;
}

// Asks for rows [0, n) of a head's slice (d values each, rows ld apart) to be brought into L2: the dispatchers
// below prefetch the next task's q, k, v (and dout, out) while the current one computes. Its rows sit 3C apart,
// beyond what the hardware prefetchers follow across pages, and first touching them took ~40 % of the backward.
template <class T>
void prefetch_rows(const T* p, int64_t ld, int64_t n, int64_t d) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t e = 0; e < d; e += kLine) __builtin_prefetch(p + r * ld + e, 0, 2);
}

// (batch, head) tasks per chunk that a thread takes: four chunks per thread, so that a core slowed by another
// process takes fewer (a static half each left the faster thread waiting), each chunk's tasks in order so that the
// next one's rows are prefetched while one computes (only a chunk's first task starts cold).
int64_t attention_chunk(int64_t tasks) { return std::max<int64_t>(1, tasks / (4 * std::max(1, num_threads()))); }

// Query rows [first, first + n) of qkv's sequences (all of them for the forward, the new ones for a decode step):
// out is [B, n, C]; lse [B, heads, T] is written when given; drop (null: none) masks the probabilities.
template <class T>
void attn_fwd_t(const Tensor& qkv, int64_t heads, int64_t first, int64_t n, Tensor& out, T* pl,
                const ops::AttentionDropout* drop) {
  const int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3, d = c / heads;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const std::optional<HalfFormat> half = attention_half<T>();
  const T* px = qkv.data<T>();
  const HalfFormat* ph = half ? &*half : nullptr;
  T* po = out.data<T>();
  parallel_for_stealing(nb * heads, attention_chunk(nb * heads), [&](int64_t u0, int64_t u1) {
    thread_local std::vector<T> buf;  // grown, never shrunk
    buf.resize(std::max(buf.size(), static_cast<size_t>(attn_fwd_scratch(first + n, d, ph))));
    auto head = [&](int64_t u) { return px + u / heads * t * 3 * c + u % heads * d; };  // the task's q
    for (int64_t u = u0; u < u1; ++u) {
      if (u + 1 < u1) prefetch_rows(head(u + 1), c, 3 * (first + n), d);  // its q, k and v rows
      const int64_t b = u / heads, h = u % heads;
      const T* q = px + b * t * 3 * c + h * d;
      T* o = po + b * n * c + h * d;
      T* l = pl ? pl + (b * heads + h) * t : nullptr;
      const uint64_t mask = attention_dropout_index(b, h, 0, 0, heads, t);
      if constexpr (std::is_same_v<T, float>)
        attn_fwd_task_dispatch(q, q + c, q + 2 * c, 3 * c, first, n, d, scale, o, c, l, drop, mask, t, ph, buf.data());
      else
        attn_fwd_task<Narrow, T>(q, q + c, q + 2 * c, 3 * c, first, n, d, scale, o, c, l, drop, mask, t, ph,
                                 buf.data());
    }
  });
}

// With p_ij = exp(q_i·k_j/√d − lse_i), D_i = Σ dout_i·out_i and dropout's m_ij = keep_ij/(1 − p) (1 without):
// ds_ij = p_ij (m_ij dout_i·v_j − D_i) / √d, dq_i = Σ_j ds_ij k_j, dk_j = Σ_i ds_ij q_i, dv_j = Σ_i m_ij p_ij dout_i.
template <class T>
void attn_bwd_t(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, int64_t heads,
                const ops::AttentionDropout* drop, Tensor& delta, Tensor& dqkv) {
  const int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3, d = c / heads;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const std::optional<HalfFormat> half = attention_half<T>();
  const T* px = qkv.data<T>();
  const HalfFormat* ph = half ? &*half : nullptr;
  const T *po = out.data<T>(), *pl = lse.data<T>(), *pdo = dout.data<T>();
  T* pdelta = delta.data<T>();
  T* pdx = dqkv.data<T>();
  parallel_for_stealing(nb * heads, attention_chunk(nb * heads), [&](int64_t u0, int64_t u1) {
    thread_local std::vector<T> buf;  // grown, never shrunk
    buf.resize(std::max(buf.size(), static_cast<size_t>(attn_bwd_scratch(t, d, ph))));
    for (int64_t u = u0; u < u1; ++u) {
      if (u + 1 < u1) {  // the next task's q, k, v, dout and out rows
        const int64_t b = (u + 1) / heads, h = (u + 1) % heads;
        prefetch_rows(px + b * t * 3 * c + h * d, c, 3 * t, d);
        prefetch_rows(pdo + b * t * c + h * d, c, t, d);
        prefetch_rows(po + b * t * c + h * d, c, t, d);
      }
      const int64_t b = u / heads, h = u % heads;
      const T* q = px + b * t * 3 * c + h * d;
      const T* g = pdo + b * t * c + h * d;
      const T* o = po + b * t * c + h * d;
      const T* l = pl + (b * heads + h) * t;
      T* dl = pdelta + (b * heads + h) * t;
      T* dq = pdx + b * t * 3 * c + h * d;
      const uint64_t mask = attention_dropout_index(b, h, 0, 0, heads, t);
      if constexpr (std::is_same_v<T, float>)
        attn_bwd_task_dispatch(q, q + c, q + 2 * c, 3 * c, g, o, c, l, dl, t, d, scale, dq, dq + c, dq + 2 * c, drop,
                               mask, ph, buf.data());
      else
        attn_bwd_task<Narrow, T>(q, q + c, q + 2 * c, 3 * c, g, o, c, l, dl, t, d, scale, dq, dq + c, dq + 2 * c, drop,
                                 mask, ph, buf.data());
    }
  });
}

}  // namespace

void force_attention_narrow(bool narrow) { g_attention_narrow.store(narrow, std::memory_order_relaxed); }

void attention_forward(const Tensor& qkv, int64_t heads, const ops::AttentionDropout& dropout, Tensor& out,
                       Tensor& lse) {
  const ops::AttentionDropout* drop = dropout.p > 0 ? &dropout : nullptr;
  for_float_type(qkv.dtype(), [&](auto t) {
    using T = decltype(t);
    attn_fwd_t<T>(qkv, heads, 0, qkv.dim(1), out, lse.defined() ? lse.data<T>() : nullptr, drop);
  });
}

void attention_decode(const Tensor& qkv, int64_t heads, int64_t first, Tensor& out) {
  for_float_type(qkv.dtype(), [&](auto t) {
    using T = decltype(t);
    attn_fwd_t<T>(qkv, heads, first, out.dim(1), out, nullptr, nullptr);
  });
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, int64_t heads,
                        const ops::AttentionDropout& dropout, Tensor& delta, Tensor& dqkv) {
  const ops::AttentionDropout* drop = dropout.p > 0 ? &dropout : nullptr;
  for_float_type(qkv.dtype(), [&](auto t) { attn_bwd_t<decltype(t)>(qkv, out, lse, dout, heads, drop, delta, dqkv); });
}

}  // namespace gt::cpu