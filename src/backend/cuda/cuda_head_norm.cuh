// One attention head's norm and RoPE by a whole block, shared by attn_prep (cuda_norm_rope.cu) and
// the decode attention that folds it in (cuda_attention.cu): the same thread mapping and arithmetic
// in both, so the same bits.
#pragma once
#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"

namespace g4::cuda {

// attn_prep_kernel's block size (cuda_norm_rope.cu). The decode attention that folds attn_prep in
// runs a larger block and passes it as kSumThreads, so its head norms find attn_prep's factors.
constexpr int kAttnPrepThreads = 128;

// One head of x [head_dim] in place, by the whole block: RMSNorm with weight w (none when w is
// null), then half-split RoPE at position `pos` (pairs with inv_freq 0 are only normalized); the
// result is also written to `copy` when set (a KV-cache slot). Same rounding as rms_norm_kernel
// followed by rope_kernel. sh: 32 floats of shared memory. kSumThreads: as inv_rms.
template <int kSumThreads = 0, class T>
__device__ inline void norm_rope_head(T* v, int head_dim, const float* w, float eps, float pos,
                                      const float* inv_freq, T* copy, float* sh) {
  const int half = head_dim / 2;
  const float inv = w ? inv_rms<kSumThreads>(v, head_dim, eps, sh) : 1.f;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    float a = to_f(v[j]), b = to_f(v[j + half]);
    if (w) {
      a = a * inv * w[j];
      b = b * inv * w[j + half];
    }
    if (inv_freq[j] != 0.f) {
      float sn, cs;
      sincosf(pos * inv_freq[j], &sn, &cs);
      const float ra = a * cs - b * sn, rb = a * sn + b * cs;
      a = ra;
      b = rb;
    }
    v[j] = from_f<T>(a);
    v[j + half] = from_f<T>(b);
    if (copy) {
      copy[j] = from_f<T>(a);
      copy[j + half] = from_f<T>(b);
    }
  }
}

// A value head [head_dim] in place, by the whole block: unweighted RMSNorm when `norm` (Gemma 4's
// v_norm), else as it is; also written to `copy` (a KV-cache slot) when set. sh, kSumThreads: as
// above.
template <int kSumThreads = 0, class T>
__device__ inline void norm_v_head(T* v, int head_dim, bool norm, float eps, T* copy, float* sh) {
  const float inv = norm ? inv_rms<kSumThreads>(v, head_dim, eps, sh) : 1.f;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    const T x = from_f<T>(norm ? to_f(v[i]) * inv : to_f(v[i]));
    v[i] = x;
    if (copy) copy[i] = x;
  }
}

}  // namespace g4::cuda
