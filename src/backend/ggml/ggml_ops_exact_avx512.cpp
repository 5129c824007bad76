// llama.cpp-exact f32 ops (ggml_ops.h). Compiled with -ffp-contract=off: each fused multiply-add
// is explicit where the llama.cpp build has one (its C/C++ is compiled with GCC's default
// contraction, so some of its scalar expressions are fused; those are written out below).
#include <immintrin.h>

// GCC 12's own _mm512_scalef_ps / _mm512_abs_ps bodies start from an undefined vector and trip
// -Wmaybe-uninitialized when inlined here; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "backend/ggml/ggml_ops.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace g4::ggml_ops {

namespace {

// GCC's _mm512_reduce_add_ps on the lanes of v[16] (the build's own header: halves, then
// quarters, then pairs).
inline float reduce16(const float* v) {
  float t3[8], t6[4];
  for (int j = 0; j < 8; ++j) t3[j] = v[j + 8] + v[j];
  for (int j = 0; j < 4; ++j) t6[j] = t3[j + 4] + t3[j];
  return (t6[0] + t6[2]) + (t6[1] + t6[3]);
}

// ggml_vec_dot_f32 (AVX-512: 4 accumulators of 16 lanes over 64-value steps, reduced as
// acc0+acc2, acc1+acc3, their sum, then reduce_add). n a multiple of 64.
float vec_dot_f32(const float* x, const float* y, int n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int i = 0; i < n; i += 64) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), s1);
    s2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(y + i + 32), s2);
    s3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(y + i + 48), s3);
  }
  s0 = _mm512_add_ps(s0, s2);
  s1 = _mm512_add_ps(s1, s3);
  s0 = _mm512_add_ps(s0, s1);
  return _mm512_reduce_add_ps(s0);
}

// ggml_v_expf (AVX-512 body, ggml-cpu/vec.h): exp by range reduction to n*ln2 + b and a
// degree-5 polynomial in b, scaled by 2^n; |n| > 192 gives 0 or inf.
inline __m512 v_expf(__m512 x) {
  const __m512 r = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
  const __m512 n = _mm512_sub_ps(z, r);
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)),
                      u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
  const __m512 res = _mm512_scalef_ps(j, n);
  if (big == 0) return res;
  const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                          _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(big, res, alt);
}

// Softmax of w[0, n) (n a multiple of 16, masked entries -inf) into p, as soft_max_ext with
// scale 1: max, then per 16 values exp(w - max) summed by reduce_add into a double, then
// p *= float(1.0 / sum).
void softmax16(const float* w, int n, float* p) {
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = std::max(mx, w[i]);
  double sum = 0;
  for (int i = 0; i < n; i += 16) {
    const __m512 v = v_expf(_mm512_sub_ps(_mm512_loadu_ps(w + i), _mm512_set1_ps(mx)));
    _mm512_storeu_ps(p + i, v);
    sum += double(_mm512_reduce_add_ps(v));
  }
  const float inv = float(1.0 / sum);
  for (int i = 0; i < n; ++i) p[i] = p[i] * inv;
}

}  // namespace

void rms_norm(const float* x, int rows, int dim, const float* w, float eps, float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + int64_t(r) * dim;
    float* yr = y + int64_t(r) * dim;
    double sum = 0;
    for (int i = 0; i < dim; ++i) sum += double(xr[i] * xr[i]);
    const float mean = float(sum / dim);
    const float s = 1.0f / std::sqrt(mean + eps);
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * s;
    if (w) {
      for (int i = 0; i < dim; ++i) yr[i] = yr[i] * w[i];
    }
  }
}

void rope_neox(float* x, int rows, int heads, int head_dim, int pos0, float base, float freq_scale) {
  const int half = head_dim / 2;
  const float theta_scale = std::pow(base, -2.0f / float(head_dim));
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int r = 0; r < rows; ++r) {
    float theta = float(pos0 + r);
    for (int i = 0; i < half; ++i) {
      const float t = freq_scale * theta;
      cs[size_t(i)] = std::cos(t);
      sn[size_t(i)] = std::sin(t);
      theta = theta * theta_scale;
    }
    for (int h = 0; h < heads; ++h) {
      float* v = x + (int64_t(r) * heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        // As the build compiles rotate_pairs: x0*cos - (x1*sin) and x0*sin + (x1*cos), fused.
        v[i] = std::fma(x0, cs[size_t(i)], -(x1 * sn[size_t(i)]));
        v[i + half] = std::fma(x0, sn[size_t(i)], x1 * cs[size_t(i)]);
      }
    }
  }
}

void attention(const float* q, int H, const std::vector<AttnSeq>& seqs, float scale, int batch_rows,
               float* out) {
  for (const AttnSeq& s : seqs) {
    const KvBuffer& kv = s.kv;
    const int D = kv.head_dim, group = H / kv.n_kv_heads;
    G4_CHECK(D % 64 == 0);
    const size_t kv_row = size_t(kv.n_kv_heads) * size_t(D);
    const int lanes = batch_rows >= 2 ? 16 : 64;
    // One (row, head) per task; every output element is computed by one thread alone.
    auto body = [&, D, group, kv_row, lanes](int64_t i0, int64_t i1) {
      thread_local std::vector<float> qs, w, p, acc;
      const int n_pos = (s.pos0 + s.n + 63) / 64 * 64;  // positions 0..n_pos-1 cover every chunk
      qs.resize(size_t(D));
      w.resize(size_t(n_pos));
      p.resize(size_t(n_pos));
      acc.resize(size_t(64) * size_t(D));
      for (int64_t i = i0; i < i1; ++i) {
        const int t = int(i / H), h = int(i % H);
        const int pos = s.pos0 + t;
        const int first = kv.window > 0 ? std::max(0, pos - kv.window + 1) : 0;
        auto slot_of = [&](int k) { return kv_slot(kv, k); };
        const float* qh = q + (size_t(s.row0 + t) * H + h) * D;
        for (int j = 0; j < D; ++j) qs[size_t(j)] = qh[j] * scale;  // ggml_scale on Q
        const int g = h / group;
        // kq over every position of the padded range; masked ones are -inf.
        std::fill(w.begin(), w.end(), -INFINITY);
        for (int k = first; k <= pos; ++k) {
          const int64_t slot = slot_of(k);
          G4_CHECK(kv.pos[slot] == k);
          w[size_t(k)] = vec_dot_f32(kv.k.f32() + size_t(slot) * kv_row + size_t(g) * D, qs.data(), D);
        }
        softmax16(w.data(), (pos + 1 + 15) / 16 * 16, p.data());
        // kqv: lane = position mod 16 (tinyBLAS, one 16-lane accumulator) or mod 64 (vec_dot_f32,
        // accumulators j = (position mod 64) / 16); positions with p = 0 add nothing.
        std::fill(acc.begin(), acc.begin() + size_t(lanes) * D, 0.f);
        for (int k = first; k <= pos; ++k) {
          const float pk = p[size_t(k)];
          const float* vr = kv.v.f32() + size_t(slot_of(k)) * kv_row + size_t(g) * D;
          float* a = &acc[size_t(k % lanes) * D];
          for (int j = 0; j < D; ++j) a[j] = std::fma(vr[j], pk, a[j]);
        }
        float* o = out + (size_t(s.row0 + t) * H + h) * D;
        float lane[16];
        for (int j = 0; j < D; ++j) {
          for (int l = 0; l < 16; ++l) {
            if (lanes == 16) {
              lane[l] = acc[size_t(l) * D + j];
            } else {  // (acc0 + acc2) + (acc1 + acc3)
              const float a0 = acc[size_t(l) * D + j] + acc[size_t(32 + l) * D + j];
              const float a1 = acc[size_t(16 + l) * D + j] + acc[size_t(48 + l) * D + j];
              lane[l] = a0 + a1;
            }
          }
          o[j] = reduce16(lane);
        }
      }
    };
    parallel_for(int64_t(s.n) * H, std::ref(body), 1);
  }
}

}  // namespace g4::ggml_ops
