// Small vectorized reductions for the sampler's full-vocabulary passes (V up to 262144).
// SSE2 (x86-64 baseline) with a scalar fallback; results are reductions, so only their
// rounding differs from a plain loop. Internal to g4sampling.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace g4::vec {

// Max over non-NaN entries (-inf if none); *has_nan set when a NaN is present.
inline float max_skip_nan(const float* x, int n, bool* has_nan) {
  float m = -std::numeric_limits<float>::infinity();
  int i = 0;
  bool nan = false;
#if defined(__SSE2__)
  __m128 a0 = _mm_set1_ps(m), a1 = a0;
  __m128 un = _mm_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m128 v0 = _mm_loadu_ps(x + i), v1 = _mm_loadu_ps(x + i + 4);
    un = _mm_or_ps(un, _mm_or_ps(_mm_cmpunord_ps(v0, v0), _mm_cmpunord_ps(v1, v1)));
    a0 = _mm_max_ps(v0, a0);  // NaN in v0 -> keeps a0
    a1 = _mm_max_ps(v1, a1);
  }
  alignas(16) float t[4];
  _mm_store_ps(t, _mm_max_ps(a0, a1));
  for (float v : t) m = v > m ? v : m;
  nan = _mm_movemask_ps(un) != 0;
#endif
  for (; i < n; ++i) {
    if (x[i] != x[i]) nan = true;
    else if (x[i] > m) m = x[i];
  }
  *has_nan = nan;
  return m;
}

#if defined(__SSE2__)
// exp for x <= ~88 (Cephes expf polynomial, ~2 ulp); x below -87.3 (incl. -inf) and NaN give 0.
inline __m128 exp_ps(__m128 x) {
  const __m128 live = _mm_cmpge_ps(x, _mm_set1_ps(-87.3f));
  x = _mm_max_ps(x, _mm_set1_ps(-87.3f));
  x = _mm_min_ps(x, _mm_set1_ps(88.3f));
  __m128 fx = _mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f)), _mm_set1_ps(0.5f));
  __m128i ti = _mm_cvttps_epi32(fx);
  __m128 tf = _mm_cvtepi32_ps(ti);
  __m128 gt = _mm_and_ps(_mm_cmpgt_ps(tf, fx), _mm_set1_ps(1.f));
  fx = _mm_sub_ps(tf, gt);  // floor
  x = _mm_sub_ps(x, _mm_mul_ps(fx, _mm_set1_ps(0.693359375f)));
  x = _mm_sub_ps(x, _mm_mul_ps(fx, _mm_set1_ps(-2.12194440e-4f)));
  __m128 z = _mm_mul_ps(x, x);
  __m128 y = _mm_set1_ps(1.9875691500E-4f);
  y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(1.3981999507E-3f));
  y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(8.3334519073E-3f));
  y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(4.1665795894E-2f));
  y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(1.6666665459E-1f));
  y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(5.0000001201E-1f));
  y = _mm_add_ps(_mm_mul_ps(y, z), _mm_add_ps(x, _mm_set1_ps(1.f)));
  __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(fx), _mm_set1_epi32(127)), 23);
  return _mm_and_ps(live, _mm_mul_ps(y, _mm_castsi128_ps(e)));
}
#endif

// sum_i exp(x[i] - m), for m >= every x[i]; NaN entries count as 0. Accumulates fp32 lanes in
// blocks, then double.
inline double sum_exp_shifted(const float* x, int n, float m) {
  double total = 0;
  int i = 0;
#if defined(__SSE2__)
  const __m128 mm = _mm_set1_ps(m);
  while (i + 8 <= n) {
    __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();
    int end = std::min(n - (n - i) % 8, i + 1024);
    for (; i < end; i += 8) {
      s0 = _mm_add_ps(s0, exp_ps(_mm_sub_ps(_mm_loadu_ps(x + i), mm)));
      s1 = _mm_add_ps(s1, exp_ps(_mm_sub_ps(_mm_loadu_ps(x + i + 4), mm)));
    }
    alignas(16) float t[4];
    _mm_store_ps(t, _mm_add_ps(s0, s1));
    total += double(t[0]) + t[1] + t[2] + t[3];
  }
#endif
  for (; i < n; ++i) total += std::exp(x[i] - m);
  return total;
}

// out[i] = exp((x[i] - m) * scale), for m >= every x[i] and scale > 0; returns the sum (double).
inline double exp_scaled_into(const float* x, int n, float m, float scale, float* out) {
  double total = 0;
  int i = 0;
#if defined(__SSE2__)
  const __m128 mm = _mm_set1_ps(m), sc = _mm_set1_ps(scale);
  while (i + 4 <= n) {
    __m128 acc = _mm_setzero_ps();
    int end = std::min(n - (n - i) % 4, i + 1024);
    for (; i < end; i += 4) {
      __m128 e = exp_ps(_mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x + i), mm), sc));
      _mm_storeu_ps(out + i, e);
      acc = _mm_add_ps(acc, e);
    }
    alignas(16) float t[4];
    _mm_store_ps(t, acc);
    total += double(t[0]) + t[1] + t[2] + t[3];
  }
#endif
  for (; i < n; ++i) total += out[i] = std::exp((x[i] - m) * scale);
  return total;
}

}  // namespace g4::vec
