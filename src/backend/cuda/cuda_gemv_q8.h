// The int8 decode GEMV (cuda_gemv_q8.cu) in its two launches, for callers that time or reuse them
// apart (bench/bench_cuda_gemv.cu). The backend goes through q8_gemv (cuda_matmul_common.cuh):
// q8_prepare (or the deferred-epilogue prepare) followed by q8_gemv_prepared.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_q8.cuh"
#include "core/dtype.h"

namespace g4::cuda {

// The most shared memory a block of a one-row GEMV stages its weight rows in (MatArgs::row_fetch's
// kFetchShared; launches whose blocks need more read their rows from global memory): two blocks
// an SM on sm_90. The device must let a block opt in to this much (Device::smem_optin).
constexpr size_t kStageMaxBytes = 100 * 1024;
// The most a Q6_K block stages under BackendOptions::RowFetch::Auto. Staged Q6_K measured faster
// up to 35 KiB a block (E4B down 33.6 KiB: 20.1 -> 11.5 us; the 262144-row head 16.8 KiB: 222 ->
// 190) and slower at 70 KiB (31B down: 48.6 -> 57.2), on an H100 (stop 55).
constexpr size_t kStageAutoBytes = 48 * 1024;

// o = the int8 form of rows x [rows, cols] of type xt (cols % 32 == 0), each row normed with
// norm_w (eps) first when norm_w is set. One launch.
void q8_prepare(cudaStream_t s, const void* x, DType xt, int rows, int64_t cols, const float* norm_w, float eps,
                const Q8Act& o);
// The GEMV launch(es) of a over M rows already prepared in a.q8 (q8_gemv's preconditions:
// q8_gemv_supports every weight; act: Act, cuda_kernels.h).
// lanes: the lanes that share a weight row (4, 8, 16 or 32), for measuring; 0: the launch's rule.
void q8_gemv_prepared(cudaStream_t s, const MatArgs& a, int M, int act, int lanes = 0);
// The lanes a row of a's GEMV launch takes by gemv_row_lanes' rule (a.lanes unset), for the plan
// chosen at placement (cuda_weight_plans.h); 0 where the int8 GEMVs would not take a as one
// launch (a format they do not take, or weights of differing format, width or bits).
int q8_gemv_lanes(const MatArgs& a, int act);
// The shared memory a block of a's one-row GEMV launch would stage its rows in (kFetchShared;
// lanes as q8_gemv_prepared takes them): a launch stages where this is at most kStageMaxBytes.
size_t q8_stage_bytes_for(const MatArgs& a, int act, int lanes = 0);
// Whether the int8 GEMVs take every weight of a (act: Act), so that q8_gemv prepares a's rows
// into a.q8 (the backend's later launches of the same rows may then skip theirs: MatArgs::prepared).
bool q8_gemv_takes(const MatArgs& a, int act);

}  // namespace g4::cuda
