#include "train/dense_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/aligned_vector.h"
#include "core/thread_pool.h"
#include "quant/matmul.h"

// The inner loops below are written in axpy form over short fixed-width tiles so that the
// compiler vectorizes them; target_clones builds AVX-512 / AVX2 variants picked at load time.
#define G4_TRAIN_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))

namespace g4::train {
namespace {

constexpr int kTile = 16;  // weight rows dequantized at once

// acc[r][j] = x[r] · tile[j] for r < rows (<= 4), j < n: a dequantized tile [kTile, K], row-major.
G4_TRAIN_SIMD void tile_dot4(const float* x, int64_t ldx, int rows, const float* tile, int n, int64_t K, float* acc) {
  for (int j = 0; j < n; ++j) {
    const float* w = tile + j * K;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    if (rows == 4) {
      const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
      for (int64_t k = 0; k < K; ++k) {
        a0 += x0[k] * w[k];
        a1 += x1[k] * w[k];
        a2 += x2[k] * w[k];
        a3 += x3[k] * w[k];
      }
      acc[j] = a0;
      acc[kTile + j] = a1;
      acc[2 * kTile + j] = a2;
      acc[3 * kTile + j] = a3;
    } else {
      for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        float s = 0.f;
        for (int64_t k = 0; k < K; ++k) s += xr[k] * w[k];
        acc[r * kTile + j] = s;
      }
    }
  }
}

// dx[0..K) += Σ_j c[j] · tile[j][0..K) over the tile's rows.
G4_TRAIN_SIMD void axpy_rows(const float* tile, int rows, int64_t K, const float* c, float* dx) {
  for (int j = 0; j < rows; ++j) {
    const float cj = c[j];
    if (cj == 0.f) continue;
    const float* w = tile + j * K;
    for (int64_t k = 0; k < K; ++k) dx[k] += cj * w[k];
  }
}

G4_TRAIN_SIMD void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void matmul_wt(const float* x, int M, const WeightView& W, float* y) {
  const int64_t K = W.cols, N = W.rows;
  const int64_t tiles = (N + kTile - 1) / kTile;
  parallel_for(tiles, [&](int64_t t0, int64_t t1) {
    AlignedVector<float> tile(size_t(kTile * K));
    float acc[4 * kTile];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o0 = t * kTile;
      const int rows = int(std::min<int64_t>(kTile, N - o0));
      for (int j = 0; j < rows; ++j) dequant_row(W, o0 + j, tile.data() + j * K);
      for (int m = 0; m < M; m += 4) {
        const int mr = std::min(4, M - m);
        tile_dot4(x + int64_t(m) * K, K, mr, tile.data(), rows, K, acc);
        for (int r = 0; r < mr; ++r)
          std::memcpy(y + int64_t(m + r) * N + o0, acc + r * kTile, size_t(rows) * sizeof(float));
      }
    }
  });
}

void matmul_w_acc(const float* dy, int M, const WeightView& W, float* dx) {
  const int64_t K = W.cols, N = W.rows;
  const int64_t tiles = (N + kTile - 1) / kTile;
  const int parts = int(std::max<int64_t>(1, std::min<int64_t>(num_threads(), tiles)));
  // Each part sums its tiles' contributions privately; the parts are added afterwards.
  std::vector<std::vector<float>> partial(size_t(parts - 1));
  parallel_for(parts, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* out = dx;
      if (p > 0) {
        partial[size_t(p - 1)].assign(size_t(M) * size_t(K), 0.f);
        out = partial[size_t(p - 1)].data();
      }
      AlignedVector<float> tile(size_t(kTile * K));
      float c[kTile];
      for (int64_t t = tiles * p / parts; t < tiles * (p + 1) / parts; ++t) {
        const int64_t o0 = t * kTile;
        const int rows = int(std::min<int64_t>(kTile, N - o0));
        for (int j = 0; j < rows; ++j) dequant_row(W, o0 + j, tile.data() + j * K);
        for (int m = 0; m < M; ++m) {
          for (int j = 0; j < rows; ++j) c[j] = dy[int64_t(m) * N + o0 + j];
          axpy_rows(tile.data(), rows, K, c, out + int64_t(m) * K);
        }
      }
    }
  });
  for (const auto& part : partial) axpy(1.f, part.data(), dx, int64_t(M) * K);
}

void gemm_nn(const float* a, const float* b, float* c, int M, int K, int N, bool accumulate) {
  parallel_for(M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      float* cr = c + m * N;
      if (!accumulate) std::fill(cr, cr + N, 0.f);
      for (int k = 0; k < K; ++k) axpy(a[m * K + k], b + int64_t(k) * N, cr, N);
    }
  }, 8);
}

void gemm_nt(const float* a, const float* b, float* c, int M, int K, int N, bool accumulate) {
  parallel_for(M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* ar = a + m * K;
      for (int n = 0; n < N; ++n) {
        const float* br = b + int64_t(n) * K;
        float s = 0.f;
        for (int k = 0; k < K; ++k) s += ar[k] * br[k];
        c[m * N + n] = accumulate ? c[m * N + n] + s : s;
      }
    }
  }, 8);
}

void gemm_tn_acc(const float* a, const float* b, float* c, int M, int K, int N) {
  parallel_for(K, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      for (int m = 0; m < M; ++m) axpy(a[int64_t(m) * K + k], b + int64_t(m) * N, c + k * N, N);
  }, 8);
}

void rms_norm_fwd(const float* x, int rows, int dim, const float* w, float eps, float* y, float* inv_out) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + int64_t(r) * dim;
    float* yr = y + int64_t(r) * dim;
    float ss = 0.f;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
    inv_out[r] = inv;
    for (int i = 0; i < dim; ++i) yr[i] = w ? xr[i] * inv * w[i] : xr[i] * inv;
  }
}

void rms_norm_bwd(const float* x, const float* inv, int rows, int dim, const float* w, const float* dy, float* dx) {
  // y_i = x_i·inv·w_i, inv = (mean(x²)+eps)^-½:  dx_i = inv·g_i - x_i·inv³·(Σ_j x_j g_j)/dim, g = w ⊙ dy.
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + int64_t(r) * dim;
    const float* gr = dy + int64_t(r) * dim;
    float* o = dx + int64_t(r) * dim;
    const float iv = inv[r];
    double dot = 0.0;
    for (int i = 0; i < dim; ++i) dot += double(xr[i]) * (w ? w[i] * gr[i] : gr[i]);
    const float c = float(dot / dim) * iv * iv * iv;
    for (int i = 0; i < dim; ++i) o[i] += iv * (w ? w[i] * gr[i] : gr[i]) - xr[i] * c;
  }
}

static void rope_rotate(float* x, int rows, int heads, int D, int pos0, const RopeTable& t, float sign) {
  const int half = D / 2;
  for (int r = 0; r < rows; ++r) {
    const float pos = float(pos0 + r) * t.position_scale;
    for (int j = 0; j < half; ++j) {
      if (t.inv_freq[size_t(j)] == 0.f) continue;
      const float th = pos * t.inv_freq[size_t(j)];
      const float c = std::cos(th), s = sign * std::sin(th);
      for (int h = 0; h < heads; ++h) {
        float* v = x + (int64_t(r) * heads + h) * D;
        const float a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = a * s + b * c;
      }
    }
  }
}

void rope_fwd(float* x, int rows, int heads, int D, int pos0, const RopeTable& t) {
  rope_rotate(x, rows, heads, D, pos0, t, 1.f);
}
// The rotation is orthogonal: its transpose (the VJP) is the rotation by -θ.
void rope_bwd(float* dx, int rows, int heads, int D, int pos0, const RopeTable& t) {
  rope_rotate(dx, rows, heads, D, pos0, t, -1.f);
}

namespace {
constexpr float kGeluA = 0.044715f, kGeluS = 0.7978845608028654f;
inline float gelu(float x) { return 0.5f * x * (1.f + std::tanh(kGeluS * (x + kGeluA * x * x * x))); }
inline float gelu_grad(float x) {
  const float th = std::tanh(kGeluS * (x + kGeluA * x * x * x));
  return 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * kGeluS * (1.f + 3.f * kGeluA * x * x);
}
}  // namespace

void gelu_mul_fwd(const float* g, const float* u, size_t n, float* y) {
  for (size_t i = 0; i < n; ++i) y[i] = gelu(g[i]) * u[i];
}
void gelu_mul_bwd(const float* g, const float* u, const float* dy, size_t n, float* dg, float* du) {
  for (size_t i = 0; i < n; ++i) {
    dg[i] += dy[i] * u[i] * gelu_grad(g[i]);
    du[i] += dy[i] * gelu(g[i]);
  }
}

static inline int first_key(int i, int window) { return window > 0 ? std::max(0, i - window + 1) : 0; }

void attention_fwd(const float* q, const float* k, const float* v, int T, int H, int Hk, int D, int window,
                   float scale, float* probs, float* out) {
  const int group = H / Hk;
  parallel_for(H, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      const int g = int(h) / group;
      float* P = probs + h * int64_t(T) * T;
      for (int i = 0; i < T; ++i) {
        const float* qi = q + (int64_t(i) * H + h) * D;
        float* pr = P + int64_t(i) * T;
        std::fill(pr, pr + T, 0.f);
        const int lo = first_key(i, window);
        float mx = -INFINITY;
        for (int j = lo; j <= i; ++j) {
          const float* kj = k + (int64_t(j) * Hk + g) * D;
          float s = 0.f;
          for (int e = 0; e < D; ++e) s += qi[e] * kj[e];
          pr[j] = s * scale;
          mx = std::max(mx, pr[j]);
        }
        float sum = 0.f;
        for (int j = lo; j <= i; ++j) sum += (pr[j] = std::exp(pr[j] - mx));
        const float inv = 1.f / sum;
        float* oi = out + (int64_t(i) * H + h) * D;
        std::fill(oi, oi + D, 0.f);
        for (int j = lo; j <= i; ++j) {
          pr[j] *= inv;
          axpy(pr[j], v + (int64_t(j) * Hk + g) * D, oi, D);
        }
      }
    }
  });
}

void attention_bwd(const float* q, const float* k, const float* v, const float* probs, const float* dout, int T,
                   int H, int Hk, int D, int window, float scale, float* dq, float* dk, float* dv) {
  const int group = H / Hk;
  // Key/value heads are shared by `group` query heads: parallel over kv heads, so that no two
  // threads add into the same dk / dv rows.
  parallel_for(Hk, [&](int64_t g0, int64_t g1) {
    std::vector<float> dP(static_cast<size_t>(T));
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* P = probs + h * int64_t(T) * T;
        for (int i = 0; i < T; ++i) {
          const int lo = first_key(i, window);
          const float* pr = P + int64_t(i) * T;
          const float* doi = dout + (int64_t(i) * H + h) * D;
          // dP_ij = dout_i · v_j;  dS_ij = P_ij (dP_ij - Σ_j P_ij dP_ij)
          float dot = 0.f;
          for (int j = lo; j <= i; ++j) {
            const float* vj = v + (int64_t(j) * Hk + g) * D;
            float s = 0.f;
            for (int e = 0; e < D; ++e) s += doi[e] * vj[e];
            dP[size_t(j)] = s;
            dot += pr[j] * s;
          }
          const float* qi = q + (int64_t(i) * H + h) * D;
          float* dqi = dq + (int64_t(i) * H + h) * D;
          for (int j = lo; j <= i; ++j) {
            const float dS = pr[j] * (dP[size_t(j)] - dot) * scale;
            axpy(dS, k + (int64_t(j) * Hk + g) * D, dqi, D);
            axpy(dS, qi, dk + (int64_t(j) * Hk + g) * D, D);
            axpy(pr[j], doi, dv + (int64_t(j) * Hk + g) * D, D);
          }
        }
      }
    }
  });
}

namespace {

// A dequantized tile of kTile rows of E, row-major [kTile, K].
struct EmbedTile {
  AlignedVector<float> rows;
  int n = 0;
  void load(const WeightView& E, int64_t o0) {
    const int64_t K = E.cols;
    rows.resize(size_t(kTile * K));
    n = int(std::min<int64_t>(kTile, E.rows - o0));
    for (int j = 0; j < n; ++j) dequant_row(E, o0 + j, rows.data() + j * K);
  }
  // z[M, kTile] = x · tileᵀ, softcapped.
  void logits(const float* x, int M, int64_t K, float cap, float* z) const {
    for (int m = 0; m < M; m += 4)
      tile_dot4(x + int64_t(m) * K, K, std::min(4, M - m), rows.data(), n, K, z + m * kTile);
    if (cap > 0.f)
      for (int i = 0; i < M * kTile; ++i) z[i] = std::tanh(z[i] / cap) * cap;
  }
};

}  // namespace

double lm_head_loss(const float* x_all, int M_all, const WeightView& E, float cap, const int32_t* targets_all,
                    float weight, float* dx_all) {
  const int64_t V = E.rows, K = E.cols;
  // Only the rows with targets matter.
  std::vector<int> rows;
  for (int r = 0; r < M_all; ++r)
    if (targets_all[r] >= 0) rows.push_back(r);
  const int M = int(rows.size());
  if (M == 0) return 0.0;
  AlignedVector<float> x(size_t(M) * size_t(K));
  std::vector<int32_t> tgt(static_cast<size_t>(M));
  for (int i = 0; i < M; ++i) {
    std::copy_n(x_all + int64_t(rows[size_t(i)]) * K, K, x.data() + int64_t(i) * K);
    tgt[size_t(i)] = targets_all[rows[size_t(i)]];
  }
  // Vocabulary tiles, split into parts (one per thread): each dequantizes its tiles once per pass,
  // whatever M is, and [M, vocab] logits are never held.
  const int64_t tiles = (V + kTile - 1) / kTile;
  const int parts = int(std::max<int64_t>(1, std::min<int64_t>(num_threads(), tiles)));
  auto tile_range = [&](int64_t p) { return std::pair<int64_t, int64_t>{tiles * p / parts, tiles * (p + 1) / parts}; };

  // Pass 1: online log-sum-exp per row (max, Σ exp(z - max)) per part, and the target logits.
  std::vector<float> pmax(size_t(parts) * M, -INFINITY);
  std::vector<double> psum(size_t(parts) * M, 0.0);
  std::vector<float> ztgt(static_cast<size_t>(M), 0.f);
  parallel_for(parts, [&](int64_t p0, int64_t p1) {
    EmbedTile t;
    AlignedVector<float> z(size_t(M + 4) * kTile);
    for (int64_t p = p0; p < p1; ++p) {
      float* mx = pmax.data() + p * M;
      double* sm = psum.data() + p * M;
      for (int64_t ti = tile_range(p).first; ti < tile_range(p).second; ++ti) {
        const int64_t o0 = ti * kTile;
        t.load(E, o0);
        t.logits(x.data(), M, K, cap, z.data());
        for (int m = 0; m < M; ++m) {
          const float* zr = z.data() + m * kTile;
          float tmax = mx[m];
          for (int j = 0; j < t.n; ++j) tmax = std::max(tmax, zr[j]);
          double acc = sm[m] * std::exp(double(mx[m]) - double(tmax));
          if (mx[m] == -INFINITY) acc = 0.0;
          for (int j = 0; j < t.n; ++j) acc += std::exp(double(zr[j]) - double(tmax));
          mx[m] = tmax;
          sm[m] = acc;
          const int64_t tg = tgt[size_t(m)];
          if (tg >= o0 && tg < o0 + t.n) ztgt[size_t(m)] = zr[tg - o0];
        }
      }
    }
  });
  std::vector<double> lse(static_cast<size_t>(M));
  double total = 0.0;
  for (int m = 0; m < M; ++m) {
    float gmax = -INFINITY;
    for (int p = 0; p < parts; ++p) gmax = std::max(gmax, pmax[size_t(p) * M + m]);
    double s = 0.0;
    for (int p = 0; p < parts; ++p)
      if (pmax[size_t(p) * M + m] > -INFINITY) s += psum[size_t(p) * M + m] * std::exp(double(pmax[size_t(p) * M + m]) - gmax);
    lse[size_t(m)] = double(gmax) + std::log(s);
    total += lse[size_t(m)] - double(ztgt[size_t(m)]);
  }
  if (!dx_all) return total;

  // Pass 2: d loss/dz = softmax - onehot (times the softcap's derivative 1 - (z/cap)²), then
  // dx += dz · E, each part into its own buffer.
  std::vector<std::vector<float>> partial(static_cast<size_t>(parts));
  parallel_for(parts, [&](int64_t p0, int64_t p1) {
    EmbedTile t;
    AlignedVector<float> z(size_t(M + 4) * kTile);
    for (int64_t p = p0; p < p1; ++p) {
      partial[size_t(p)].assign(size_t(M) * size_t(K), 0.f);
      float* out = partial[size_t(p)].data();
      for (int64_t ti = tile_range(p).first; ti < tile_range(p).second; ++ti) {
        const int64_t o0 = ti * kTile;
        t.load(E, o0);
        t.logits(x.data(), M, K, cap, z.data());
        for (int m = 0; m < M; ++m) {
          float* zr = z.data() + m * kTile;
          for (int j = 0; j < t.n; ++j) {
            float g = float(std::exp(double(zr[j]) - lse[size_t(m)])) - (o0 + j == tgt[size_t(m)] ? 1.f : 0.f);
            if (cap > 0.f) {
              const float c = zr[j] / cap;
              g *= 1.f - c * c;
            }
            zr[j] = g * weight;
          }
          axpy_rows(t.rows.data(), t.n, K, zr, out + int64_t(m) * K);
        }
      }
    }
  });
  for (int m = 0; m < M; ++m) {
    float* d = dx_all + int64_t(rows[size_t(m)]) * K;
    for (const auto& part : partial) axpy(1.f, part.data() + int64_t(m) * K, d, K);
  }
  return total;
}

}  // namespace g4::train
