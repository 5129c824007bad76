// Activation rows quantized to int8 once per gguf_matmul_fast call (internal to src/quant/gguf_*).
// The codes and scales are ggml's own (quantize_row_q8_0 / quantize_row_q8_K), so that a GGUF file
// computes here what it computes in llama.cpp: q = round-half-even(x * 127/amax); the scale of a
// 32-value block is amax/127 rounded to f16, that of a 256-value super-block is 1/(127/amax) in f32.
//
// K-quants (Q8_K-style): per row, per 256-value super-block i: d and qs in [-127, 127] as above,
// bs16[g] = sum of qs over values 16g..16g+16, bs32[s] = sum over sub-block s.
//   Layout::KNatural keeps qs in value order (Q6_K); Layout::KPerm stores the sub-blocks in the
//   order [0,2,1,3,4,6,5,7] so that one 64-byte load matches the low / high nibbles of two Q4_K /
//   Q5_K qs chunks.
// 32-blocks (Q8_0-style): blocks are taken in pairs (a zero block pads an odd count); per pair:
//   qs[64] int8, dx[16] f32 and init[16] int32 laid out per 32-bit lane of a 512-bit vector:
//   Layout::PairA (Q8_0, Q4_0, Q5_0): bytes [blk0 0..31 | blk1 0..31]; lanes 0-7 blk0, 8-15 blk1.
//   init holds -bias * sum(qs of the block) in the block's first lane (bias = the unsigned offset
//   of the weight codes: 128 for Q8_0 via xor 0x80, 8 for Q4_0, 16 for Q5_0), 0 elsewhere.
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "quant/weight.h"

namespace g4::gguf {

enum class Layout : uint8_t { KNatural, KPerm, PairA };

// The scale ggml stores for an activation block of n values (32 or 256) with max |x| = amax > 0 and
// id = 127/amax (see above).
inline float act_block_scale(int n, float amax, float id) {
  return n == 256 ? 1.f / id : round_f16(amax / 127.f);
}

// Quantizes n values (32 or 256) to int8 codes q = round(x * 127/amax), exactly as ggml quantizes
// activations, and returns the block scale as ggml stores it (act_block_scale; 0 for all zeros).
float quantize_block(const float* x, int n, int8_t* q);

struct ActK {
  int64_t nsb = 0;                 // super-blocks per row
  std::vector<int8_t> qs;          // [M][nsb][256]
  std::vector<float> d;            // [M][nsb]
  std::vector<int16_t> bs16;       // [M][nsb][16]
  std::vector<int16_t> bs32;       // [M][nsb][8]
};

struct ActPair {
  int64_t npair = 0;               // block pairs per row
  std::vector<int8_t> qs;          // [M][npair][64]
  std::vector<float> dx;           // [M][npair][16]
  std::vector<int32_t> init;       // [M][npair][16]
};

// x: [M, cols] f32; cols a multiple of 256 (K) or 32 (pairs). Buffers are resized, not shrunk.
void quantize_act_k(const float* x, int64_t M, int64_t cols, Layout layout, ActK* a);
void quantize_act_pair(const float* x, int64_t M, int64_t cols, int bias, ActPair* a);  // PairA

// AVX-512 (F/BW/VL/VNNI + F16C) kernels, gguf_kernels_avx512.cpp: y[m * ldy + r] for r in
// [r0, r1), m in [0, M). Call only when cpu_has_avx512_vnni().
bool cpu_has_avx512_vnni();
void rows_k_avx512(const void* w_data, int64_t row_bytes, WFormat fmt, const ActK& a, int64_t M,
                   int64_t r0, int64_t r1, float* y, int64_t ldy);
void rows_pair_avx512(const void* w_data, int64_t row_bytes, WFormat fmt, int64_t nblocks,
                      const ActPair& a, int64_t M, int64_t r0, int64_t r1, float* y, int64_t ldy);

}  // namespace g4::gguf
