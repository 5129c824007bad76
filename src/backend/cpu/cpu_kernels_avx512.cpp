// AVX-512 f32 kernels of the fast CPU backend (contracts in cpu_kernels.h). Built with the
// *_avx512.cpp flags (CMakeLists.txt); called only after detail::cpu_has_avx512().
// GCC 12 flags its own _mm512_undefined_* helpers inside the intrinsics headers as uninitialized.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "core/status.h"
#include "quant/matmul_internal.h"

namespace g4::cpu {
namespace {

// e^x, Cephes expf (Cody-Waite range reduction + degree-5 polynomial): ~1 ulp on [-87, 88];
// underflows to 0 below, +inf above 88.7 (scalef).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-103.f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.8f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(y, n);
}

// tanh(x) = sign(x) (1 - t) / (1 + t), t = e^{-2|x|}: absolute error ~1e-7.
inline __m512 tanh16(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 t = exp16(_mm512_mul_ps(ax, _mm512_set1_ps(-2.f)));
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 th = _mm512_div_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t));
  // copy the sign of x
  return _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_castps_si512(th),
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u)))));
}

inline __mmask16 tail_mask(size_t left) { return left >= 16 ? 0xFFFF : __mmask16((1u << left) - 1); }

// Dot product of two D-float vectors, D % 16 == 0.
inline float dot(const float* a, const float* b, int D) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= D; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  if (i < D) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

}  // namespace

void attend_group_avx512(const float* q, int group, const KvBuffer& kv, int g, KeyRange keys, float scale,
                         float* scratch, float* out) {
  const int D = kv.head_dim;
  const size_t row = size_t(kv.n_kv_heads) * D;
  const int first = keys.lo;
  const int n = keys.hi - keys.lo + 1;
  // A quantized cache's rows are dequantized one at a time (exactly: dequant_row) into deq.
  const bool quant = kv.quantized();
  const WeightView kview = quant ? kv.k_view() : WeightView{}, vview = quant ? kv.v_view() : WeightView{};
  thread_local std::vector<float> deq;
  if (quant && deq.size() < size_t(D)) deq.resize(size_t(D));
  // Scores s[h, j] = (q_h · k_j) * scale, each K row read once for the whole group.
  for (int j = 0; j < n; ++j) {
    const int p = first + j;
    const int64_t slot = kv_slot(kv, p);
    G4_CHECK(kv.pos[slot] == p);
    const float* kr = kv.k.f32() + slot * row + size_t(g) * D;
    if (quant) {
      detail::dequant_row_avx512(kview, int64_t(slot) * kv.n_kv_heads + g, deq.data());
      kr = deq.data();
    }
    for (int h = 0; h < group; ++h) scratch[size_t(h) * n + j] = dot(q + size_t(h) * D, kr, D) * scale;
  }
  // Softmax per head (max-subtracted exp, 1/sum folded into the probabilities).
  for (int h = 0; h < group; ++h) {
    float* s = scratch + size_t(h) * n;
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 16)
      vm = _mm512_mask_max_ps(vm, tail_mask(size_t(n - j)), vm, _mm512_maskz_loadu_ps(tail_mask(size_t(n - j)), s + j));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vm));
    __m512 vs = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
      const __mmask16 m = tail_mask(size_t(n - j));
      const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), mx)));
      _mm512_mask_storeu_ps(s + j, m, e);
      vs = _mm512_add_ps(vs, e);
    }
    const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(vs));
    for (int j = 0; j < n; j += 16) {
      const __mmask16 m = tail_mask(size_t(n - j));
      _mm512_mask_storeu_ps(s + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), inv));
    }
  }
  if (quant) {  // out_h = Σ_j p[h, j] v_j with each V row dequantized once, out in memory
    for (int h = 0; h < group; ++h) std::fill(out + size_t(h) * D, out + size_t(h + 1) * D, 0.f);
    for (int j = 0; j < n; ++j) {
      const int p = first + j;
      const int64_t slot = kv_slot(kv, p);
      detail::dequant_row_avx512(vview, int64_t(slot) * kv.n_kv_heads + g, deq.data());
      for (int h = 0; h < group; ++h) {
        const __m512 pj = _mm512_set1_ps(scratch[size_t(h) * n + j]);
        float* o = out + size_t(h) * D;
        for (int c = 0; c < D; c += 16)
          _mm512_storeu_ps(o + c, _mm512_fmadd_ps(pj, _mm512_loadu_ps(deq.data() + c), _mm512_loadu_ps(o + c)));
      }
    }
    return;
  }
  // out_h = Σ_j p[h, j] v_j, 128 output floats (8 accumulators) at a time.
  for (int h = 0; h < group; ++h) {
    const float* s = scratch + size_t(h) * n;
    float* o = out + size_t(h) * D;
    for (int c0 = 0; c0 < D; c0 += 128) {
      const int nv = std::min(128, D - c0) / 16;
      __m512 acc[8];
      for (int v = 0; v < 8; ++v) acc[v] = _mm512_setzero_ps();
      for (int j = 0; j < n; ++j) {
        const int p = first + j;
        const int64_t slot = kv_slot(kv, p);
        const float* vr = kv.v.f32() + slot * row + size_t(g) * D + c0;
        const __m512 pj = _mm512_set1_ps(s[j]);
        if (nv == 8) {
          #pragma GCC unroll 8
          for (int v = 0; v < 8; ++v) acc[v] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16 * v), acc[v]);
        } else {
          for (int v = 0; v < nv; ++v) acc[v] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16 * v), acc[v]);
        }
      }
      for (int v = 0; v < nv; ++v) _mm512_storeu_ps(o + c0 + 16 * v, acc[v]);
    }
  }
}

void gelu_mul_avx512(const float* gate, const float* up, size_t n, float* out) {
  // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) * up
  const __m512 c0 = _mm512_set1_ps(0.044715f), c1 = _mm512_set1_ps(0.7978845608028654f);
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.f);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 t = tanh16(_mm512_mul_ps(c1, _mm512_fmadd_ps(c0, x3, x)));
    const __m512 gl = _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, t));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(gl, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void softcap_avx512(float* x, size_t n, float cap) {
  const __m512 c = _mm512_set1_ps(cap);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(tanh16(_mm512_div_ps(v, c)), c));
  }
}

void rms_norm_avx512(const float* x, int rows, int dim, const float* w, float eps, float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * dim;
    float* yr = y + size_t(r) * dim;
    __m512 ss = _mm512_setzero_ps();
    for (int i = 0; i < dim; i += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(tail_mask(size_t(dim - i)), xr + i);
      ss = _mm512_fmadd_ps(v, v, ss);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / float(dim) + eps));
    for (int i = 0; i < dim; i += 16) {
      const __mmask16 m = tail_mask(size_t(dim - i));
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), inv);
      if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
      _mm512_mask_storeu_ps(yr + i, m, v);
    }
  }
}

void add_avx512(const float* a, const float* b, size_t n, float* y) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
}

}  // namespace g4::cpu
