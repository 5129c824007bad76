// Launchers of the device MoE kernels (cuda_moe.cu): the router's top-k and the routed experts'
// GEMVs. Pointers are device memory; launches go to the given stream, in order.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_q8.cuh"

namespace g4::cuda {

// Backend::router_topk on the device (cuda_moe.cu), when router_topk_applies(E, k) (E <= 256,
// k <= 32): scores [rows, E] of type st; idx / w [rows, k] as the host rule gives them (ties to the
// higher expert index, softmax over the chosen in f32, times per_expert_scale [E]).
void router_topk(cudaStream_t s, const void* scores, DType st, int rows, int E, int k, const float* per_expert_scale,
                 int32_t* idx, float* w);
bool router_topk_applies(int E, int k);
// The routed experts' GEMVs (decode): for item i < items, e = idx[i], x row i / x_div:
// y[i, :rows] = x·W_eᵀ, or with gelu gelu(x·W_eᵀ) * (x·U_eᵀ) (tanh form). w / w2: device arrays of
// every expert's DevWeight (one format, fmt); x and y of type xt.
// (No padding: its bytes are part of a step's key.)
struct MoeMatArgs {
  const void* x;
  const DevWeight* w;
  const DevWeight* w2;
  const int32_t* idx;
  void* y;
  DevWeight w0;  // the first expert's weight (host copy): format, bits, shape of every expert
  DevWeight w20; // with w2: the first up expert's (its bits may differ from w0's: MLX mixed precision)
  Q8Act q8;      // non-null: the int8 GEMVs (cuda_gemv_q8.cu) where they take w0's format
  int x_div;
  DType xt;
  uint8_t rows16 = 0;  // 1: every expert's data and row_bytes (w and w2) are multiples of 16 bytes
  uint8_t ahead = 0;   // 1: the int8 GEMV's lanes fetch their next unit ahead (BackendOptions::gemv_ahead)
  uint8_t reserved[1] = {};
};
// per_token: the items of one token (top k); an item's bits depend on it, not on items.
void moe_matmul(cudaStream_t s, const MoeMatArgs& a, int items, int per_token, int64_t rows, WFormat fmt, bool gelu);
// moe_matmul on int8 activations (cuda_gemv_q8.cu): the x rows prepared into a.q8, then one launch
// over (row blocks, items). Returns false, launching nothing, when a.q8 is null, w0's format is
// not taken or the x rows do not fit the scratch.
bool q8_moe_matmul(cudaStream_t s, const MoeMatArgs& a, int items, int per_token, int64_t rows, bool gelu);

// Prefill MoE (cuda_moe_grouped.cu): the items grouped by expert into blocks of slots, on the
// device. slots [moe_group_slots(items, E)]: item numbers, -1 for a block's unused tail;
// block_expert [moe_group_max_blocks(items, E)]: each block's expert; n_blocks [1]: how many
// blocks are used (the grouped GEMM's blocks past it exit at once).
struct MoeGroups {
  int32_t* slots;
  int32_t* block_expert;
  int32_t* n_blocks;
};
int moe_group_max_blocks(int items, int E);
size_t moe_group_slots(int items, int E);
void moe_group(cudaStream_t s, const int32_t* idx, int items, int E, const MoeGroups& g);
// moe_matmul's contract (a.idx unused: the grouping gives each item's expert) on bf16 tensor
// cores: bf16 x and y, f32 accumulation, outputs rounded once. Applies when
// moe_grouped_applies(a, E, rows): bf16 activations, E <= 256, 32-column units, even out rows.
bool moe_grouped_applies(const MoeMatArgs& a, int E, int64_t out_rows);
void moe_grouped_matmul(cudaStream_t s, const MoeMatArgs& a, const MoeGroups& g, int items, int E, int64_t rows,
                        WFormat fmt, bool gelu);
}  // namespace g4::cuda
