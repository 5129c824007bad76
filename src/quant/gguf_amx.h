// AMX-INT8 prefill path of gguf_matmul_fast (internal to src/quant/gguf_*; see gguf_amx_avx512.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "quant/weight.h"

namespace g4::gguf {

// Activations for the AMX path: x quantized per `block` values (32, or 256 for K-quants), q and d
// as ggml makes them (gguf_act.h); grouped in tiles of 16 rows (zero-padded), per 32-value block b:
//   xb[t][b]: 512 bytes, AMX B layout: byte (k/4)*64 + m*4 + k%4 holds q[16t + m][32b + k]
//   dx[t][b][m]: the scale of the block holding value 32b of row 16t+m
//   sx[t][b][m]: dx * sum_k q[16t+m][32b+k]  (for K-quant mins)
struct ActAmx {
  int64_t ntiles = 0, nblk = 0;
  std::vector<int8_t> xb;
  std::vector<float> dx, sx;
};

// gguf_matmul_fast uses this path for M >= amx_min_rows(fmt) when the CPU has AMX and it is
// enabled (tests turn it off to exercise the VNNI kernels at the same sizes). The per-format
// switch-over (measured with GgufBench.DISABLED_SmallM): Q8_0 4, Q4_0/Q5_0 6, Q4_K/Q5_K 8,
// Q6_K 10; set_amx_min_rows(m > 0) overrides it for all formats (0 restores the defaults).
void set_amx_enabled(bool on);
bool amx_enabled();
void set_amx_min_rows(int64_t m);
int64_t amx_min_rows(WFormat fmt);

// True when the CPU has AMX-INT8 and the OS granted the tile state to this process.
bool cpu_has_amx();
void quantize_act_amx(const float* x, int64_t M, int64_t cols, int block, ActAmx* a);
// y[M, w.rows] = x · Wᵀ for any Gguf* format; threaded over groups of 16 weight rows.
// Per output element, over the chunks c of CK = amx_chunk(f) values in order:
//   acc = fma(float(I_c) * dx, scale_c, acc);  then, with mins (Q4_K/Q5_K), acc -= sx * min_c
// (one fnmadd), with I_c the exact integer dot of the chunk's weight and activation codes.
void matmul_amx(WFormat f, const WeightView& w, const ActAmx& a, int64_t M, float* y);

// The same per-element chain with AVX-512 VNNI instead of AMX tiles (gguf_amx_order_avx512.cpp):
// bit-identical to matmul_amx for every row, at any M, on any AVX-512 VNNI CPU. Used for the
// rows below amx_min_rows in batch-invariant mode (and for all rows without AMX), so a row's
// result never depends on the batch it is in. Fastest at small M (decode).
void matmul_amx_order(WFormat f, const WeightView& w, const ActAmx& a, int64_t M, float* y);

// Chunk width of the AMX scheme: 16 for Q6_K (its sub-blocks), 32 otherwise.
int amx_chunk(WFormat f);
// Decodes one weight row (cols values): value k goes to codes[(k / CK) * cs + k % CK] as a signed
// int8 code, scale[c] and min[c] per chunk c (w = scale * code - min, ggml's block math).
void decode_row_chunked(WFormat f, const uint8_t* row, int64_t cols, int8_t* codes, int64_t cs,
                        float* scale, float* mn);
// Weight rows r0..r0+15 of w (rows past w.rows as zeros) in the group layout of both kernels:
// codes[c][n][CK] (cs = 16 * CK), scale[n][nch], mn[n][nch]. prefetch_next: also pull the next
// group's rows towards the cache (decode streams the whole matrix).
void decode_group16(WFormat f, const WeightView& w, int64_t r0, int8_t* codes, float* scale, float* mn,
                    bool prefetch_next);

}  // namespace g4::gguf
