// CPU causal attention (ops/attention.h), blocked: one (batch, head) per task, queries in tiles of kTile rows. A
// tile's scores against the keys up to its last row are one GEMM, its softmax is done in place, and the output is a
// second GEMM, so no more than a [kTile, T] block of scores exists per thread. The backward recomputes the tile's
// probabilities from the forward's log-sum-exp and gets dq, dk and dv from three more GEMMs. Each task runs on one
// thread in a fixed order, so results do not depend on the thread count. Dropout (ops/attention.h) scales or zeroes
// each probability of a tile from its Philox draw before the P·V GEMM, and the backward draws the same mask again;
// without dropout no mask is drawn and the arithmetic is that of attention without it.
#include "ops/attention.h"

#include "core/parallel.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/kernel_util.h"
#include "ops/math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace gt::cpu {
namespace {

constexpr int64_t kTile = 64;

// One (batch, head) of the packed [B, T, 3C] layout: its query, key and value rows, each ld = 3C apart.
template <class T>
struct Head {
  int64_t t, c, d, ld;
  const T* q;
  const T* k;
  const T* v;
  Head(const T* qkv, int64_t b, int64_t h, int64_t t_, int64_t c_, int64_t d_)
      : t(t_), c(c_), d(d_), ld(3 * c_), q(qkv + b * t_ * 3 * c_ + h * d_), k(q + c_), v(q + 2 * c_) {}
};

// Calls f(j, keep) for j in [0, n), keep being dropout's decision for mask index index0 + j: one Philox block per
// four indices, the words ops/math.h's dropout_keep reads, so the mask is dropout_keep's.
template <class F>
void for_each_keep(int64_t n, uint64_t index0, const ops::AttentionDropout& drop, F&& f) {
  for (int64_t j = 0; j < n;) {
    const uint64_t index = index0 + static_cast<uint64_t>(j);
    const PhiloxBlock block = philox4x32(index / 4, drop.step, drop.key);
    for (uint64_t w = index % 4; w < 4 && j < n; ++w, ++j) f(j, dropout_keep_word(block.v[w], drop.p));
  }
}

// Query rows [first, first + n) of qkv's sequences (all of them for the forward, the new ones for a decode step):
// out is [B, n, C]; lse [B, heads, T] is written when given; drop (null: none) masks the probabilities.
template <class T>
void attn_fwd_t(const Tensor& qkv, int64_t heads, int64_t first, int64_t n, Tensor& out, T* pl,
                const ops::AttentionDropout* drop) {
  const int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3, d = c / heads;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const T keep_scale = drop ? static_cast<T>(1.0 / (1.0 - drop->p)) : T(1);  // as ops/dropout.h's kernels round it
  const T* px = qkv.data<T>();
  T* po = out.data<T>();
  parallel_for(nb * heads, 1, [&](int64_t u0, int64_t u1) {
    std::vector<T> s(static_cast<size_t>(std::min(n, kTile) * (first + n)));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / heads, h = u % heads;
      const Head<T> hd(px, b, h, t, c, d);
      T* o = po + b * n * c + h * d;  // row i of the sequence is row i − first of out
      T* l = pl ? pl + (b * heads + h) * t : nullptr;
      for (int64_t i0 = first; i0 < first + n; i0 += kTile) {
        const int m = static_cast<int>(std::min(kTile, first + n - i0)), keys = static_cast<int>(i0) + m;
        gemm_raw<T>(false, true, m, keys, static_cast<int>(d), scale, hd.q + i0 * hd.ld, static_cast<int>(hd.ld), hd.k,
                    static_cast<int>(hd.ld), T(0), s.data(), keys);
        for (int r = 0; r < m; ++r) {
          T* row = s.data() + static_cast<int64_t>(r) * keys;
          const int64_t last = i0 + r;  // keys 0..last are visible to query i0 + r
          T mx = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j <= last; ++j) mx = row[j] > mx ? row[j] : mx;
          double sum = 0;
          for (int64_t j = 0; j <= last; ++j) {
            row[j] = std::exp(row[j] - mx);
            sum += row[j];
          }
          const T inv = static_cast<T>(1.0 / sum);
          for (int64_t j = 0; j <= last; ++j) row[j] *= inv;
          std::fill(row + last + 1, row + keys, T(0));
          if (l) l[last] = static_cast<T>(mx + std::log(sum));
          if (drop)
            for_each_keep(last + 1, attention_dropout_index(b, h, last, 0, heads, t), *drop,
                          [&](int64_t j, bool keep) { row[j] = keep ? row[j] * keep_scale : T(0); });
        }
        gemm_raw<T>(false, false, m, static_cast<int>(d), keys, T(1), s.data(), keys, hd.v, static_cast<int>(hd.ld),
                    T(0), o + (i0 - first) * c, static_cast<int>(c));
      }
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
  const T keep_scale = drop ? static_cast<T>(1.0 / (1.0 - drop->p)) : T(1);
  const T *px = qkv.data<T>(), *po = out.data<T>(), *pl = lse.data<T>(), *pdo = dout.data<T>();
  T* pdelta = delta.data<T>();
  T* pdx = dqkv.data<T>();
  const int ld = static_cast<int>(3 * c), ldo = static_cast<int>(c), di = static_cast<int>(d);
  parallel_for(nb * heads, 1, [&](int64_t u0, int64_t u1) {
    const size_t tile = static_cast<size_t>(std::min(t, kTile) * t);
    std::vector<T> p(tile), dp(tile);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / heads, h = u % heads;
      const Head<T> hd(px, b, h, t, c, d);
      const T* g = pdo + b * t * c + h * d;  // dout rows, ld C
      const T* l = pl + (b * heads + h) * t;
      T* dl = pdelta + (b * heads + h) * t;
      T* dq = pdx + b * t * 3 * c + h * d;
      T* dk = dq + c;
      T* dv = dq + 2 * c;
      for (int64_t i = 0; i < t; ++i) {
        double s = 0;
        for (int64_t e = 0; e < d; ++e) s += static_cast<double>(g[i * c + e]) * po[(b * t + i) * c + h * d + e];
        dl[i] = static_cast<T>(s);
        std::fill(dk + i * ld, dk + i * ld + d, T(0));
        std::fill(dv + i * ld, dv + i * ld + d, T(0));
      }
      for (int64_t i0 = 0; i0 < t; i0 += kTile) {
        const int m = static_cast<int>(std::min(kTile, t - i0)), n = static_cast<int>(i0) + m;
        gemm_raw<T>(false, true, m, n, di, scale, hd.q + i0 * ld, ld, hd.k, ld, T(0), p.data(), n);
        gemm_raw<T>(false, true, m, n, di, T(1), g + i0 * c, ldo, hd.v, ld, T(0), dp.data(), n);
        for (int r = 0; r < m; ++r) {
          T* pr = p.data() + static_cast<int64_t>(r) * n;
          T* dr = dp.data() + static_cast<int64_t>(r) * n;
          const int64_t last = i0 + r;
          const T li = l[last], delta_i = dl[last];
          if (drop) {
            // pr becomes m_ij p_ij, what dv sums; dr holds dout_i·v_j from the GEMM, the gradient of m_ij p_ij.
            for_each_keep(last + 1, attention_dropout_index(b, h, last, 0, heads, t), *drop, [&](int64_t j, bool keep) {
              const T pij = std::exp(pr[j] - li), mij = keep ? keep_scale : T(0);
              dr[j] = pij * (mij * dr[j] - delta_i) * scale;  // ds_ij
              pr[j] = mij * pij;
            });
          } else {
            for (int64_t j = 0; j <= last; ++j) {
              pr[j] = std::exp(pr[j] - li);
              dr[j] = pr[j] * (dr[j] - delta_i) * scale;  // ds_ij
            }
          }
          std::fill(pr + last + 1, pr + n, T(0));
          std::fill(dr + last + 1, dr + n, T(0));
        }
        gemm_raw<T>(false, false, m, di, n, T(1), dp.data(), n, hd.k, ld, T(0), dq + i0 * ld, ld);
        gemm_raw<T>(true, false, n, di, m, T(1), dp.data(), n, hd.q + i0 * ld, ld, T(1), dk, ld);
        gemm_raw<T>(true, false, n, di, m, T(1), p.data(), n, g + i0 * c, ldo, T(1), dv, ld);
      }
    }
  });
}

}  // namespace

void attention_forward(const Tensor& qkv, int64_t heads, const ops::AttentionDropout& dropout, Tensor& out,
                       Tensor& lse) {
  const ops::AttentionDropout* drop = dropout.p > 0 ? &dropout : nullptr;
  for_float_type(qkv.dtype(), [&](auto t) {
    using T = decltype(t);
    attn_fwd_t<T>(qkv, heads, 0, qkv.dim(1), out, lse.data<T>(), drop);
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
