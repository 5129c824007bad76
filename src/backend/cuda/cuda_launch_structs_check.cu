// A compile-time check of the CUDA build: the argument structs whose bytes key a recorded step
// (add_key in cuda_backend_args.h: two launches replay one graph when their keys are equal) have
// no padding, so that equal arguments always give equal keys. g++'s -Wpadded, made an error for
// these headers only: everything they include from elsewhere is included first, unchecked.
// A struct that needs filling names it (a `reserved` member with a zero initializer).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "quant/weight.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wpadded"
#endif
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kv_quant.cuh"
#include "backend/cuda/cuda_q8.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_moe.h"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
