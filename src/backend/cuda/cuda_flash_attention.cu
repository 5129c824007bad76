// Flash attention for prefill (cuda_flash_attention.h) on bf16 tensor cores: no [L, L] score
// matrix, each key tile read once per query tile.
//
// Block (query tile of kBr rows, head h, output slice z): 4 warps, each 16 query rows. The Q tile
// [kBr, kD] stays in shared memory; per tile of kBc key positions the K rows [kBc, kD] and the V
// rows' slice [kBc, kDV] are copied in by cp.async, the next tile's while this one is used (two
// buffers), then each warp computes S = Q·Kᵀ (16 × kBc, m16n8k16 MMAs,
// Q's and K's fragments read by ldmatrix), masks it to each row's visible range, updates its
// rows' running max and sum (online softmax), rescales its O accumulator (16 × kDV in registers)
// and adds P·V with P rounded to bf16 (the score accumulator's layout is the next MMA's A operand,
// so P never leaves registers; V's B operand comes transposed by ldmatrix). Head dims above 256
// split the output over gridDim.z blocks of kDV = 256 columns (each recomputes S: the O
// accumulator would not fit registers).
#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_cp_async.cuh"
#include "backend/cuda/cuda_flash_attention.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma_bf16.cuh"

namespace g4::cuda {
namespace {

constexpr int kBr = 64, kBc = 32, kFThreads = 128, kFPad = 8;

template <int kD, int kDV>
struct FlashTile {
  static constexpr int kLq = kD + kFPad;   // Q and K row stride (bf16): fragment loads bank-conflict free
  static constexpr int kLv = kDV + kFPad;  // V row stride: ldmatrix rows on distinct banks
  // Q, then two buffers of K and of V (the next tile's copies land while this one is used).
  static constexpr size_t kSmem = (size_t(kBr) * kLq + 2 * size_t(kBc) * kLq + 2 * size_t(kBc) * kLv) * sizeof(bf16);
};

// The B operand (k = 16 positions, n = 8 dims) of rows p[0..15] of a row-major [position, dim]
// tile: lanes 0-15 address rows 0-15 at the tile's dim offset; .trans hands each lane the
// (2t, 2t+1; g) and (2t+8, 2t+9; g) elements.
__device__ inline void ldmatrix_trans_x2(const bf16* row, uint32_t* b) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(b[0]), "=r"(b[1]) : "r"(addr));
}
// Copies rows [kRows, kCols] (16-byte chunks) into a shared tile of row stride ld; src(r) gives
// row r's first element, or null for a zero row.
template <int kRows, int kCols, class Src>
__device__ inline void stage_rows(bf16* dst, int ld, Src src) {
  for (int v = threadIdx.x; v < kRows * kCols / 8; v += kFThreads) {
    const int r = v / (kCols / 8), c8 = v % (kCols / 8);
    const bf16* p = src(r);
    uint4 x = make_uint4(0, 0, 0, 0);
    if (p) x = *reinterpret_cast<const uint4*>(p + 8 * c8);
    *reinterpret_cast<uint4*>(dst + r * ld + 8 * c8) = x;
  }
}

template <int kD, int kDV>
__global__ void __launch_bounds__(kFThreads) flash_attention_kernel(const bf16* q, int H, AttnArgs a, float scale,
                                                                    bf16* out) {
  pdl_enter();
  using Tile = FlashTile<kD, kDV>;
  constexpr int kLq = Tile::kLq, kLv = Tile::kLv;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* const Kb = Qs + kBr * kLq;   // K buffers 0 and 1
  bf16* const Vb = Kb + 2 * kBc * kLq;  // V buffers 0 and 1
  __shared__ int lo_s[kBr], hi_s[kBr], range[2];
  const int t0 = blockIdx.x * kBr, h = blockIdx.y, dv0 = blockIdx.z * kDV;
  const int g = h / (H / a.n_kv_heads), pos0 = load(a.pos0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) range[0] = INT_MAX, range[1] = -1;
  __syncthreads();
  if (tid < kBr) {  // each row's visible positions [lo, hi]; rows past the call see none
    const int t = t0 + tid;
    int lo = 1, hi = 0;
    if (t < a.n) {
      const int pos = pos0 + t;
      lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
      hi = pos;
      if (a.blocks && a.blocks[2 * t + 1] > 0) {  // the row's image block (AttnSeq::blocks)
        lo = min(lo, a.blocks[2 * t]);
        hi = max(hi, a.blocks[2 * t + 1] - 1);
      }
      atomicMin(&range[0], lo);
      atomicMax(&range[1], hi);
    }
    lo_s[tid] = lo;
    hi_s[tid] = hi;
  }
  stage_rows<kBr, kD>(Qs, kLq, [&](int r) -> const bf16* {
    return t0 + r < a.n ? q + (int64_t(a.row0 + t0 + r) * H + h) * kD : nullptr;
  });
  __syncthreads();
  const int first = range[0], last = range[1];
  const int gq = lane >> 2, tq = lane & 3, r0 = warp * 16 + gq, r1 = r0 + 8;
  const int lo0 = lo_s[r0], hi0 = hi_s[r0], lo1 = lo_s[r1], hi1 = hi_s[r1];
  const bf16* K = static_cast<const bf16*>(a.k);
  const bf16* V = static_cast<const bf16*>(a.v);
  const int64_t kv_row = int64_t(a.n_kv_heads) * kD;
  auto slot_of = [&](int p) { return kv_slot(a.table, a.block_shift, a.capacity, a.window, p); };

  float o[kDV / 8][4] = {};
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // l: this lane's share of the row sums
  // Key tile p0's K rows and V slices into buffer b by cp.async (positions past `last`: zeros).
  auto issue = [&](int p0, int b) {
    for (int v = tid; v < kBc * kD / 8; v += kFThreads) {
      const int j = v / (kD / 8), c8 = v % (kD / 8);
      const bool ok = p0 + j <= last;
      cp_async16_or_zero(Kb + (b * kBc + j) * kLq + 8 * c8,
                         ok ? K + slot_of(p0 + j) * kv_row + int64_t(g) * kD + 8 * c8 : K, ok);
    }
    for (int v = tid; v < kBc * kDV / 8; v += kFThreads) {
      const int j = v / (kDV / 8), c8 = v % (kDV / 8);
      const bool ok = p0 + j <= last;
      cp_async16_or_zero(Vb + (b * kBc + j) * kLv + 8 * c8,
                         ok ? V + slot_of(p0 + j) * kv_row + int64_t(g) * kD + dv0 + 8 * c8 : V, ok);
    }
    cp_async_commit();
  };
  if (first <= last) issue(first, 0);
  for (int p0 = first, b = 0; p0 <= last; p0 += kBc, b ^= 1) {
    if (p0 + kBc <= last) {  // the next tile's copies run during this one's math
      issue(p0 + kBc, b ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile p0 has landed for every thread
    const bf16* Ks = Kb + b * kBc * kLq;
    const bf16* Vs = Vb + b * kBc * kLv;
    float s[kBc / 8][4] = {};
    // Fragments by ldmatrix: Q as a 16 × 16 tile (rows lane % 16, columns + 8 for lanes 16-31), K
    // as pairs of 8-position tiles (rows lane % 8 of tile lane / 16, columns + 8 for lanes 8-15, 24-31).
#pragma unroll 4
    for (int k0 = 0; k0 < kD; k0 += 16) {
      uint32_t af[4], bf[kBc / 16][4];
      ldmatrix_x4(Qs + (warp * 16 + (lane & 15)) * kLq + k0 + 8 * (lane >> 4), af);
#pragma unroll
      for (int nh = 0; nh < kBc / 16; ++nh)
        ldmatrix_x4(Ks + (16 * nh + 8 * (lane >> 4) + (lane & 7)) * kLq + k0 + 8 * ((lane >> 3) & 1), bf[nh]);
#pragma unroll
      for (int nj = 0; nj < kBc / 8; ++nj) mma_bf16(s[nj], af, &bf[nj >> 1][2 * (nj & 1)]);
    }
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nj = 0; nj < kBc / 8; ++nj)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int p = p0 + 8 * nj + 2 * tq + e;
        s[nj][e] = p >= lo0 && p <= hi0 ? s[nj][e] * scale : -INFINITY;
        s[nj][2 + e] = p >= lo1 && p <= hi1 ? s[nj][2 + e] * scale : -INFINITY;
        mx0 = fmaxf(mx0, s[nj][e]);
        mx1 = fmaxf(mx1, s[nj][2 + e]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // Rows with nothing visible yet keep max -inf: their factors and probabilities are 0.
    const float c0 = mx0 == -INFINITY ? 0.f : expf(m0 - mx0), c1 = mx1 == -INFINITY ? 0.f : expf(m1 - mx1);
    m0 = mx0;
    m1 = mx1;
    uint32_t pf[kBc / 16][4];  // P as the A operand of 16-position chunks
#pragma unroll
    for (int nj = 0; nj < kBc / 8; ++nj) {
      float e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float mx = i < 2 ? mx0 : mx1;
        e[i] = mx == -INFINITY ? 0.f : expf(s[nj][i] - mx);  // masked: exp(-inf) = 0
      }
      l0 = l0 * (nj == 0 ? c0 : 1.f) + e[0] + e[1];
      l1 = l1 * (nj == 0 ? c1 : 1.f) + e[2] + e[3];
      pf[nj / 2][(nj & 1) * 2] = pack_bf16(e[0], e[1]);
      pf[nj / 2][(nj & 1) * 2 + 1] = pack_bf16(e[2], e[3]);
    }
#pragma unroll
    for (int j = 0; j < kDV / 8; ++j) {
      o[j][0] *= c0;
      o[j][1] *= c0;
      o[j][2] *= c1;
      o[j][3] *= c1;
#pragma unroll
      for (int kc = 0; kc < kBc / 16; ++kc) {
        uint32_t bv[2];
        ldmatrix_trans_x2(Vs + (16 * kc + (lane & 15)) * kLv + 8 * j, bv);
        mma_bf16(o[j], pf[kc], bv);
      }
    }
    __syncthreads();  // buffer b is read: the next iteration's copies refill it
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int t = t0 + (half ? r1 : r0);
    if (t >= a.n) continue;
    const float inv = half ? inv1 : inv0;
    bf16* orow = out + (int64_t(a.row0 + t) * H + h) * kD + dv0 + 2 * tq;
#pragma unroll
    for (int j = 0; j < kDV / 8; ++j)
      *reinterpret_cast<uint32_t*>(orow + 8 * j) = pack_bf16(o[j][2 * half] * inv, o[j][2 * half + 1] * inv);
  }
}

template <int kD>
void launch_flash(cudaStream_t s, const void* q, int H, const AttnArgs& a, float scale, void* out) {
  constexpr int kDV = kD < 256 ? kD : 256;
  constexpr size_t smem = FlashTile<kD, kDV>::kSmem;
  static const bool sized = [] {  // past 48 KiB a kernel must ask for its dynamic shared memory
    return cudaFuncSetAttribute(flash_attention_kernel<kD, kDV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(smem)) == cudaSuccess;
  }();
  (void)sized;  // a refusal shows as the launch's error (G4_CUDA_LAUNCHED)
  const dim3 grid(unsigned((a.n + kBr - 1) / kBr), unsigned(H), unsigned(kD / kDV));
  launch_kernel(flash_attention_kernel<kD, kDV>, grid, kFThreads, smem, s, static_cast<const bf16*>(q), H, a, scale,
                static_cast<bf16*>(out));
}

}  // namespace

bool flash_attention_applies(const AttnArgs& a) {
  const int D = a.head_dim;
  return a.t == DType::BF16 && !a.quant.bits && a.n >= kFlashMinRows && !tc_matmul_disabled() &&
         (D == 64 || D == 128 || D == 256 || D == 512);
}

void flash_attention(cudaStream_t s, const void* q, int H, const AttnArgs& a, float scale, void* out) {
  switch (a.head_dim) {
    case 64: return launch_flash<64>(s, q, H, a, scale, out);
    case 128: return launch_flash<128>(s, q, H, a, scale, out);
    case 256: return launch_flash<256>(s, q, H, a, scale, out);
    default: return launch_flash<512>(s, q, H, a, scale, out);
  }
}

}  // namespace g4::cuda
