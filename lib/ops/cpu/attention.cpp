// CPU causal attention (ops/attention.h): one (batch, head) per task, one query row at a time, so no more than a row
// of scores exists per thread; sums in double, in order, so results do not depend on the thread count.
#include "ops/attention.h"

#include "core/parallel.h"
#include "ops/cpu/kernel_util.h"

#include <cmath>
#include <limits>
#include <vector>

namespace gt::cpu {
namespace {

// The packed [B, T, 3C] layout: pointers to a head's query, key or value row of one token.
struct Packed {
  int64_t t, c, d;
  int64_t row(int64_t b, int64_t i) const { return (b * t + i) * 3 * c; }
};

template <class T>
double dot(const T* a, const T* b, int64_t d) {
  double s = 0;
  for (int64_t k = 0; k < d; ++k) s += static_cast<double>(a[k]) * b[k];
  return s;
}

// Query rows [first, first + n) of qkv's sequences (all of them for the forward, the new ones for a decode step):
// out is [B, n, C]; lse [B, heads, T] is written when given.
template <class T>
void attn_fwd_t(const Tensor& qkv, int64_t heads, int64_t first, int64_t n, Tensor& out, T* pl) {
  const int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3, d = c / heads;
  const Packed p{t, c, d};
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const T* px = qkv.data<T>();
  T* po = out.data<T>();
  parallel_for(nb * heads, 1, [&](int64_t u0, int64_t u1) {
    std::vector<double> s(static_cast<size_t>(first + n)), acc(static_cast<size_t>(d));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / heads, h = u % heads;
      for (int64_t i = first; i < first + n; ++i) {
        const T* q = px + p.row(b, i) + h * d;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          s[j] = scale * dot(q, px + p.row(b, j) + c + h * d, d);
          mx = s[j] > mx ? s[j] : mx;
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const double e = std::exp(s[j] - mx);
          sum += e;
          const T* v = px + p.row(b, j) + 2 * c + h * d;
          for (int64_t k = 0; k < d; ++k) acc[k] += e * v[k];
        }
        T* o = po + (b * n + i - first) * c + h * d;
        for (int64_t k = 0; k < d; ++k) o[k] = static_cast<T>(acc[k] / sum);
        if (pl) pl[(b * heads + h) * t + i] = static_cast<T>(mx + std::log(sum));
      }
    }
  });
}

// With p_ij = exp(q_i·k_j/√d − lse_i) and D_i = Σ dout_i·out_i: ds_ij = p_ij (dout_i·v_j − D_i),
// dq_i = Σ_j ds_ij k_j / √d, dk_j = Σ_i ds_ij q_i / √d, dv_j = Σ_i p_ij dout_i.
template <class T>
void attn_bwd_t(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, int64_t heads,
                Tensor& delta, Tensor& dqkv) {
  const int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3, d = c / heads;
  const Packed p{t, c, d};
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const T *px = qkv.data<T>(), *po = out.data<T>(), *pl = lse.data<T>(), *pdo = dout.data<T>();
  T* pdelta = delta.data<T>();
  T* pdx = dqkv.data<T>();
  parallel_for(nb * heads, 1, [&](int64_t u0, int64_t u1) {
    std::vector<double> dq(static_cast<size_t>(d)), dk(static_cast<size_t>(t * d)), dv(static_cast<size_t>(t * d));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / heads, h = u % heads;
      T* dl = pdelta + (b * heads + h) * t;
      for (int64_t i = 0; i < t; ++i) {
        const int64_t o = (b * t + i) * c + h * d;
        dl[i] = static_cast<T>(dot(pdo + o, po + o, d));
      }
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int64_t i = 0; i < t; ++i) {
        const T* q = px + p.row(b, i) + h * d;
        const T* g = pdo + (b * t + i) * c + h * d;
        const double l = pl[(b * heads + h) * t + i];
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const T* k = px + p.row(b, j) + c + h * d;
          const T* v = px + p.row(b, j) + 2 * c + h * d;
          const double pij = std::exp(scale * dot(q, k, d) - l);
          const double ds = pij * (dot(g, v, d) - dl[i]) * scale;
          double* dkj = dk.data() + j * d;
          double* dvj = dv.data() + j * d;
          for (int64_t e = 0; e < d; ++e) {
            dq[e] += ds * k[e];
            dkj[e] += ds * q[e];
            dvj[e] += pij * g[e];
          }
        }
        T* dqi = pdx + p.row(b, i) + h * d;
        for (int64_t e = 0; e < d; ++e) dqi[e] = static_cast<T>(dq[e]);
      }
      for (int64_t j = 0; j < t; ++j) {
        T* dkj = pdx + p.row(b, j) + c + h * d;
        T* dvj = pdx + p.row(b, j) + 2 * c + h * d;
        for (int64_t e = 0; e < d; ++e) {
          dkj[e] = static_cast<T>(dk[j * d + e]);
          dvj[e] = static_cast<T>(dv[j * d + e]);
        }
      }
    }
  });
}

}  // namespace

void attention_forward(const Tensor& qkv, int64_t heads, Tensor& out, Tensor& lse) {
  for_float_type(qkv.dtype(), [&](auto t) {
    using T = decltype(t);
    attn_fwd_t<T>(qkv, heads, 0, qkv.dim(1), out, lse.data<T>());
  });
}

void attention_decode(const Tensor& qkv, int64_t heads, int64_t first, Tensor& out) {
  for_float_type(qkv.dtype(), [&](auto t) {
    using T = decltype(t);
    attn_fwd_t<T>(qkv, heads, first, out.dim(1), out, nullptr);
  });
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, int64_t heads,
                        Tensor& delta, Tensor& dqkv) {
  for_float_type(qkv.dtype(), [&](auto t) { attn_bwd_t<decltype(t)>(qkv, out, lse, dout, heads, delta, dqkv); });
}

}  // namespace gt::cpu
